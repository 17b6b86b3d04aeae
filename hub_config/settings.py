"""The one settings source of gputap: defaults, a YAML file, environment overrides.

Order (later wins):

1. ``hub_config/defaults.yaml`` shipped with gputap;
2. the operator's YAML file, named by ``GPUTAP_SETTINGS`` (or passed explicitly);
3. environment variables ``GPUTAP__SECTION__KEY=value`` (double underscores separate
   the path; the value is parsed as YAML, so ``GPUTAP__BILLING__TRIAL_CREDIT=5`` is a number).

Strings may contain ``{data_dir}``, replaced by the resolved data directory.
The hub, the billing service and the tools all read settings through :func:`load_settings`,
so `make demo` and the Helm chart describe one platform the same way.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DEFAULTS_PATH = Path(__file__).with_name("defaults.yaml")
ENV_PREFIX = "GPUTAP__"


class SettingsError(ValueError):
    """A settings file or override that cannot be used; the message says which key and why."""


def deep_merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``base`` updated by ``override``; mappings merge key by key, the rest replaces."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def env_overrides(
    environ: Mapping[str, str], base: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Nested overrides from ``GPUTAP__A__B=value`` variables.

    Names match existing keys of ``base`` regardless of case (``GPUTAP__BILLING__PRICES__T4``
    sets ``billing.prices.T4``); new keys are lower-cased.
    """
    result: dict[str, Any] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        path = _match_case(
            [part.lower() for part in name[len(ENV_PREFIX) :].split("__") if part], base or {}
        )
        if not path:
            continue
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as e:
            raise SettingsError(f"{name}: not a valid YAML value: {e}") from None
        node = result
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SettingsError(f"{name}: {part} is both a value and a section")
        node[path[-1]] = value
    return result


def _match_case(path: list[str], base: Mapping[str, Any]) -> list[str]:
    matched, node = [], base
    for part in path:
        keys = {str(k).lower(): k for k in node} if isinstance(node, Mapping) else {}
        key = keys.get(part, part)
        matched.append(key)
        node = node.get(key) if isinstance(node, Mapping) else None
    return matched


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise SettingsError(f"settings file {path} does not exist") from None
    except yaml.YAMLError as e:
        raise SettingsError(f"settings file {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"settings file {path} must hold a mapping at the top")
    return data


def _substitute(value: Any, data_dir: str) -> Any:
    if isinstance(value, str):
        return value.replace("{data_dir}", data_dir)
    if isinstance(value, dict):
        return {k: _substitute(v, data_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, data_dir) for v in value]
    return value


@dataclass(frozen=True)
class Settings:
    """Resolved settings. Sections are plain mappings; each consumer validates its own."""

    raw: dict[str, Any]
    source: Path | None

    @property
    def data_dir(self) -> Path:
        return Path(self.raw["data_dir"])

    def section(self, name: str) -> dict[str, Any]:
        value = self.raw.get(name) or {}
        if not isinstance(value, dict):
            raise SettingsError(f"settings section {name!r} must be a mapping")
        return value

    @property
    def hub(self) -> dict[str, Any]:
        return self.section("hub")

    @property
    def billing(self) -> dict[str, Any]:
        return self.section("billing")

    @property
    def spawner(self) -> dict[str, Any]:
        return self.section("spawner")

    @property
    def courses(self) -> dict[str, Any]:
        return self.section("courses")

    @property
    def catalog(self) -> dict[str, Any]:
        return self.section("catalog")


def load_settings(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Load defaults, then the operator's file, then environment overrides."""
    environ = os.environ if environ is None else environ
    raw = _read_yaml(DEFAULTS_PATH)
    source: Path | None = None
    chosen = path if path is not None else environ.get("GPUTAP_SETTINGS")
    if chosen:
        source = Path(chosen).resolve()
        raw = deep_merge(raw, _read_yaml(source))
    raw = deep_merge(raw, env_overrides(environ, raw))
    data_dir = str(raw.get("data_dir") or "")
    if not data_dir:
        raise SettingsError("data_dir must be set (where gputap keeps its databases and homes)")
    base = source.parent if source else Path.cwd()
    data_dir = str((base / os.path.expanduser(data_dir)).resolve())
    raw["data_dir"] = data_dir
    return Settings(raw=_substitute(raw, data_dir), source=source)
