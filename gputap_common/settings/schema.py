"""The settings schema (``schema.yaml`` beside this module) and how to walk it.

A *section* is an object with ``properties`` (``hub``, ``hub.github``); a *free-form map* is an
object whose ``additionalProperties`` is a schema for every value (``billing.prices``); the rest
are values. Paths are tuples of keys (and list indices), shown as ``hub.github.url``,
``hub.services[0].name`` or ``catalog.cards.A100-80GB.mig_profiles['1g.10gb']``.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

SCHEMA_PATH = Path(__file__).with_name("schema.yaml")
#: keys that moved: old path -> new path (a refusal names the new one)
RENAMED = {"hub.github.github_url": "hub.github.url"}
#: a key whose name holds one of these never has its value shown in a message
SECRET_WORDS = ("secret", "token", "password", "key")

KeyPath = tuple[str | int, ...]
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")


@functools.cache
def schema() -> dict[str, Any]:
    """The schema as loaded from ``schema.yaml`` (cached; callers must not change it)."""
    return yaml.safe_load(SCHEMA_PATH.read_text())


def is_section(node: Mapping[str, Any]) -> bool:
    return node.get("type") == "object" and "properties" in node


def is_map(node: Mapping[str, Any]) -> bool:
    return node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict)


def types_of(node: Mapping[str, Any]) -> list[str]:
    kind = node.get("type", [])
    return [kind] if isinstance(kind, str) else list(kind)


def format_path(path: Sequence[str | int]) -> str:
    """``('hub', 'services', 0, 'name')`` -> ``hub.services[0].name``."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            text += f".{part}" if text else part
        else:
            text += f"[{part!r}]"
    return text


def node_at(path: Sequence[str | int], root: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The schema of the value at ``path``; ``KeyError`` when no such setting exists."""
    node = dict(root if root is not None else schema())
    for part in path:
        if isinstance(part, int) and "items" in node:
            node = node["items"]
        elif is_section(node) and part in node["properties"]:
            node = node["properties"][part]
        elif is_map(node):
            node = node["additionalProperties"]
        else:
            raise KeyError(format_path(path))
    return node


def setting_paths(node: Mapping[str, Any] | None = None, prefix: KeyPath = ()) -> Iterator[str]:
    """Every declared key's full path, sections included (``hub``, ``hub.github``, ...)."""
    node = schema() if node is None else node
    for key, child in node.get("properties", {}).items():
        yield format_path((*prefix, key))
        if is_section(child):
            yield from setting_paths(child, (*prefix, key))


def is_secret(path: Sequence[str | int]) -> bool:
    """Whether the value at ``path`` may be a secret (by its key's name)."""
    names = [p for p in path if isinstance(p, str)]
    return bool(names) and any(word in names[-1].lower() for word in SECRET_WORDS)


def apply_defaults(value: Any, node: Mapping[str, Any]) -> Any:
    """``value`` with every missing key of its sections (and of list items' and map values'
    sections) set to the schema's default. ``value`` is not changed."""
    if is_section(node) and isinstance(value, Mapping):
        result = dict(value)
        for key, child in node["properties"].items():
            if key in result:
                result[key] = apply_defaults(result[key], child)
            elif "default" in child:
                result[key] = copy.deepcopy(child["default"])
            elif is_section(child):
                result[key] = apply_defaults({}, child)
        return result
    if is_map(node) and isinstance(value, Mapping):
        return {k: apply_defaults(v, node["additionalProperties"]) for k, v in value.items()}
    if "items" in node and isinstance(value, list):
        return [apply_defaults(item, node["items"]) for item in value]
    return value


def defaults() -> dict[str, Any]:
    """Every setting at its default: what gputap runs with when nothing is configured."""
    return apply_defaults({}, schema())
