"""gputap's settings, declared once: ``schema.yaml`` (JSON Schema, every key with its type,
default and description), the loader (defaults, then the operator's file, then
``GPUTAP__SECTION__KEY`` variables), the validator that refuses what the schema does not allow,
and the generators of ``hub_config/defaults.yaml`` and the README's configuration reference
(``python -m gputap_common.settings --help``).
"""

from .load import (
    ENV_PREFIX,
    Settings,
    deep_merge,
    env_overrides,
    load_settings,
    settings_from_mapping,
)
from .schema import SCHEMA_PATH, defaults, node_at, schema
from .validate import SettingsError, exit_on_refusal, validate, validated

__all__ = [
    "ENV_PREFIX",
    "SCHEMA_PATH",
    "Settings",
    "SettingsError",
    "deep_merge",
    "defaults",
    "env_overrides",
    "exit_on_refusal",
    "load_settings",
    "node_at",
    "schema",
    "settings_from_mapping",
    "validate",
    "validated",
]
