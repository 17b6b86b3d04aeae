"""Load gputap's settings: the schema's defaults, a YAML file, environment overrides.

Order (later wins):

1. the defaults declared in ``schema.yaml`` (``hub_config/defaults.yaml`` shows them);
2. the operator's YAML file, named by ``GPUTAP_SETTINGS`` (or passed explicitly);
3. environment variables ``GPUTAP__SECTION__KEY=value`` (double underscores separate
   the path; the value is parsed as YAML, so ``GPUTAP__BILLING__TRIAL_CREDIT=5`` is a number).

Each layer is checked against the schema before it is merged, so a refusal names where the
bad key came from (the file, or the variable). Strings may contain ``{data_dir}``, replaced by
the resolved data directory. Settings naming GitHub teams are kept in lower case
(``names.py``); ``shared_data`` follows the rules of ``shared_data.py``. The hub, the billing
service and the tools all read settings through :func:`load_settings`, so `make demo` and the
Helm chart describe one platform alike.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .names import with_github_names
from .schema import apply_defaults, defaults, format_path, is_map, is_section
from .schema import schema as settings_schema
from .shared_data import check_shared_data
from .validate import SettingsError, describe, unknown_key, validate

ENV_PREFIX = "GPUTAP__"


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
    """Nested overrides from ``GPUTAP__A__B=value`` variables, each checked on its own.

    Names match declared keys regardless of case; inside a free-form map they match the keys
    of ``base`` regardless of case (``GPUTAP__BILLING__PRICES__T4`` sets ``billing.prices.T4``)
    and a new key keeps the case it is written in. A name that is no setting is refused with
    the nearest one.
    """
    result: dict[str, Any] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = [part for part in name[len(ENV_PREFIX) :].split("__") if part]
        if not parts:
            continue
        path = _env_path(name, parts, base or {})
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as e:
            raise SettingsError(f"{name}: not a valid YAML value: {e}") from None
        nested: Any = value
        for part in reversed(path):
            nested = {part: nested}
        validate(nested, origin=name)
        node = result
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SettingsError(f"{name}: {part} is both a value and a section")
        node[path[-1]] = value
    return result


def _env_path(name: str, parts: list[str], base: Mapping[str, Any]) -> list[str]:
    """The keys ``parts`` of variable ``name`` name, spelt as declared (or as in ``base``)."""
    node, data, path = settings_schema(), base, []
    for i, part in enumerate(parts):
        if is_section(node):
            declared = {key.lower(): key for key in node["properties"]}
            key = declared.get(part.lower())
            if key is None:
                rest = [p.lower() for p in parts[i + 1 :]]
                raise SettingsError(f"{name}: {unknown_key((*path, part.lower()), rest)}")
            child = node["properties"][key]
        elif is_map(node):
            existing = {str(k).lower(): k for k in data} if isinstance(data, Mapping) else {}
            key = existing.get(part.lower(), part)
            child = node["additionalProperties"]
        else:
            raise SettingsError(
                f"{name}: {format_path(path)} is {describe(node)}, with no keys inside; "
                f"set {ENV_PREFIX}{'__'.join(p.upper() for p in path)} itself"
            )
        path.append(key)
        node = child
        data = data.get(key) if isinstance(data, Mapping) else None
    return path


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise SettingsError(f"settings file {path} does not exist") from None
    except yaml.YAMLError as e:
        raise SettingsError(f"settings file {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"settings file {path} must hold a mapping at the top")
    return _drop_empty_sections(data, settings_schema())


def _drop_empty_sections(data: dict[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
    """A section or map written with nothing under it (``spawner:``) sets nothing, as it
    reads."""
    properties = node.get("properties", {})
    result = {}
    for key, value in data.items():
        child = properties.get(key, {})
        if value is None and child.get("type") == "object":
            continue
        if isinstance(value, dict) and is_section(child):
            value = _drop_empty_sections(value, child)
        result[key] = value
    return result


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
    """Resolved settings, checked against the schema: every declared key is present (at its
    default unless set), so consumers index sections directly."""

    raw: dict[str, Any]
    source: Path | None

    @property
    def data_dir(self) -> Path:
        return Path(self.raw["data_dir"])

    def section(self, name: str) -> dict[str, Any]:
        value = self.raw.get(name)
        if not isinstance(value, dict):
            raise SettingsError(f"{name!r} is not a settings section")
        return value

    # the sections every part reads, each a mapping (each key as the schema declares it)
    hub = property(lambda self: self.section("hub"))
    billing = property(lambda self: self.section("billing"))
    spawner = property(lambda self: self.section("spawner"))
    courses = property(lambda self: self.section("courses"))
    catalog = property(lambda self: self.section("catalog"))
    #: the folders every server sees read-only (a list: each entry as the schema declares it)
    shared_data = property(lambda self: list(self.raw["shared_data"]))
    environments = property(lambda self: self.section("environments"))


def load_settings(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Load defaults, then the operator's file, then environment overrides, each checked."""
    environ = os.environ if environ is None else environ
    chosen = path if path is not None else environ.get("GPUTAP_SETTINGS")
    if not chosen:
        return _resolve({}, None, environ)
    source = Path(chosen).resolve()
    return _resolve(_read_yaml(source), source, environ)


def settings_from_mapping(
    data: Mapping[str, Any] | None, origin: str, environ: Mapping[str, str] | None = None
) -> Settings:
    """The same as :func:`load_settings`, with the operator's settings given as a mapping
    (the Helm chart's ``custom.gputap`` values) rather than a file; ``origin`` names them in
    a refusal. A relative ``data_dir`` is resolved against the working directory."""
    environ = os.environ if environ is None else environ
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise SettingsError(f"{origin}: must be a mapping of settings, not {type(data).__name__}")
    return _resolve(_drop_empty_sections(dict(data), settings_schema()), None, environ, origin)


def _resolve(
    data: dict[str, Any], source: Path | None, environ: Mapping[str, str], origin: str = ""
) -> Settings:
    raw = defaults()
    if data or source is not None:
        validate(data, origin=origin or str(source))
        raw = deep_merge(raw, data)
    raw = deep_merge(raw, env_overrides(environ, raw))
    # list items declared with defaults (hub.services[].scopes) get them here
    raw = apply_defaults(raw, settings_schema())
    validate(raw)
    raw = with_github_names(raw)
    base = source.parent if source else Path.cwd()
    data_dir = str((base / os.path.expanduser(raw["data_dir"])).resolve())
    raw["data_dir"] = data_dir
    raw = _substitute(raw, data_dir)
    check_shared_data(raw["shared_data"], raw["spawner"]["backend"])
    return Settings(raw=raw, source=source)
