"""Check values against the settings schema: the part of JSON Schema it uses, nothing more.

Written here rather than taken from ``jsonschema`` so that a refusal reads as advice: it names
the key, what the key must be (the node's ``title``, else its type and range) and the value
given (shortened; never a secret's), and an unknown key comes with the nearest real one.
Anything this accepts, a JSON Schema validator given ``schema.yaml`` accepts too; this is
stricter in two places: a whole number must be an integer (not ``2.0``), and a pattern's ``$``
means the end of the text, as in JSON Schema's ECMA-262 regexes (Python's ``$`` would also
accept a final newline).
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .schema import (
    RENAMED,
    apply_defaults,
    format_path,
    is_secret,
    node_at,
    schema,
    setting_paths,
    types_of,
)

#: the JSON Schema keywords this validator implements; the schema may use no others
SUPPORTED = frozenset(
    {
        "$schema",
        "title",
        "description",
        "default",
        "type",
        "enum",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "pattern",
        "items",
        "properties",
        "additionalProperties",
        "propertyNames",
        "required",
    }
)
_SHOWN_LENGTH = 60
# postgresql://user:password@host: the password part
_URL_PASSWORD = re.compile(r"(://[^:/@\s]+:)[^@/\s]+@")
_PLURALS = {
    "string": "strings",
    "integer": "whole numbers",
    "number": "numbers",
    "boolean": "true or false values",
    "object": "mappings",
    "array": "lists",
}


class SettingsError(ValueError):
    """A settings file or override that cannot be used; the message says which key and why."""


@contextlib.contextmanager
def exit_on_refusal(program: str) -> Iterator[None]:
    """Run the block; a :class:`SettingsError` in it ends the process with status 1 and the
    refusal as one line on stderr, ``gputap settings (PROGRAM): FILE: KEY ...``. A typo in
    the settings is the operator's to fix, not a crash: a traceback would bury the line."""
    try:
        yield
    except SettingsError as e:
        line = " ".join(str(e).splitlines())
        print(f"gputap settings ({program}): {line}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def validate(
    value: Any,
    node: Mapping[str, Any] | None = None,
    path: Sequence[str | int] = (),
    origin: str = "",
) -> None:
    """Refuse ``value`` (the setting at ``path``, checked against its schema ``node``) with a
    ``SettingsError`` naming the first problem; ``origin`` (a file, a variable) leads it."""
    try:
        _check(value, schema() if node is None else node, tuple(path))
    except SettingsError as e:
        if origin:
            raise SettingsError(f"{origin}: {e}") from None
        raise


def validated(path: str, value: Any) -> dict[str, Any]:
    """The section at ``path`` (e.g. ``"billing"``) checked, with its defaults filled in.

    For code handed one section rather than loaded :class:`Settings`; for loaded settings it
    changes nothing."""
    parts = tuple(path.split("."))
    node = node_at(parts)
    validate(value, node, parts)
    return apply_defaults(value, node)


def describe(node: Mapping[str, Any]) -> str:
    """What a value of ``node`` must be, as a phrase: "a whole number from 1 to 60"."""
    if "title" in node:
        return str(node["title"])
    if "enum" in node:
        return "one of " + ", ".join(str(v) for v in node["enum"])
    return " or ".join(_describe_type(kind, node) for kind in types_of(node)) or "any value"


def unknown_key(path: Sequence[str | int], rest: Sequence[str] = ()) -> SettingsError:
    """The refusal of the key at ``path`` (followed by ``rest``, for an environment variable
    that names keys below it), with the nearest declared key."""
    written = format_path((*path, *rest))
    moved = RENAMED.get(written)
    if moved:
        return SettingsError(f"{written} is now {moved}")
    parent_path, key = tuple(path[:-1]), str(path[-1])
    siblings = list(node_at(parent_path).get("properties", {}))
    # not the key's own section: "idle.zzz" is no typo of "idle"
    ancestors = {format_path(path[:i]) for i in range(len(path))}
    known = [p for p in setting_paths() if p not in ancestors]
    guess = _nearest(key, siblings)
    suggestion = None
    if guess and (not rest or format_path((*parent_path, guess, *rest)) in known):
        suggestion = format_path((*parent_path, guess, *rest))
    suggestion = suggestion or _nearest(written, known)
    if guess and not suggestion:
        suggestion = format_path((*parent_path, guess))
    if suggestion:
        return SettingsError(f"{written} is not a setting; did you mean {suggestion}?")
    where = format_path(parent_path) or "the top level"
    return SettingsError(f"{written} is not a setting; {where} has: {', '.join(siblings)}")


def unsupported_keywords(node: Mapping[str, Any], path: str = "") -> Iterator[str]:
    """Keywords of ``node`` (and below) this validator would ignore: the schema must use none."""
    for word in node:
        if word not in SUPPORTED:
            yield f"{path or '/'}: {word}"
    for key, child in node.get("properties", {}).items():
        yield from unsupported_keywords(child, f"{path}/{key}")
    for word in ("items", "additionalProperties", "propertyNames"):
        if isinstance(node.get(word), dict):
            yield from unsupported_keywords(node[word], f"{path}/{word}")


def _check(value: Any, node: Mapping[str, Any], path: tuple[str | int, ...]) -> None:
    kinds = types_of(node)
    if kinds and not any(_is(value, kind) for kind in kinds):
        raise _wrong(value, node, path)
    if "enum" in node and value not in node["enum"]:
        raise _wrong(value, node, path)
    if isinstance(value, str) and not _string_fits(value, node):
        raise _wrong(value, node, path)
    if _is(value, "number") and not _number_fits(value, node):
        raise _wrong(value, node, path)
    if isinstance(value, list) and "items" in node:
        for i, item in enumerate(value):
            _check(item, node["items"], (*path, i))
    if isinstance(value, Mapping):
        _check_mapping(value, node, path)


def _check_mapping(value: Mapping, node: Mapping[str, Any], path: tuple[str | int, ...]) -> None:
    for key in node.get("required", []):
        if key not in value:
            what = node["properties"][key].get("description", "")
            raise SettingsError(f"{format_path(path)} needs {key}: {what}".rstrip(": "))
    properties = node.get("properties", {})
    others = node.get("additionalProperties", True)
    names = node.get("propertyNames")
    for key, item in value.items():
        key = str(key)
        if names is not None and not (_string_fits(key, names)):
            raise SettingsError(f"{format_path(path)}: {key!r} must be {describe(names)}")
        if key in properties:
            _check(item, properties[key], (*path, key))
        elif others is False:
            raise unknown_key((*path, key))
        elif isinstance(others, dict):
            _check(item, others, (*path, key))


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(
        value,
        {
            "string": str,
            "boolean": bool,
            "array": list,
            "object": Mapping,
            "null": type(None),
        }[kind],
    )


def _string_fits(value: str, node: Mapping[str, Any]) -> bool:
    if len(value) < node.get("minLength", 0):
        return False
    if "maxLength" in node and len(value) > node["maxLength"]:
        return False
    return "pattern" not in node or _regex(node["pattern"]).search(value) is not None


def _number_fits(value: float, node: Mapping[str, Any]) -> bool:
    return not (
        ("minimum" in node and value < node["minimum"])
        or ("maximum" in node and value > node["maximum"])
        or ("exclusiveMinimum" in node and value <= node["exclusiveMinimum"])
        or ("exclusiveMaximum" in node and value >= node["exclusiveMaximum"])
    )


@functools.cache
def _regex(pattern: str) -> re.Pattern[str]:
    # JSON Schema's (ECMA-262) final $ is Python's \Z: "acme\n" must not pass "^[a-z]+$"
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def _wrong(value: Any, node: Mapping[str, Any], path: tuple[str | int, ...]) -> SettingsError:
    where = format_path(path) or "the settings"
    return SettingsError(f"{where} must be {describe(node)}, not {_shown(value, path)}")


def _shown(value: Any, path: tuple[str | int, ...]) -> str:
    """``value`` as a message may show it: shortened, a URL's password masked, a secret's
    value not at all."""
    if is_secret(path) and value not in ("", None):
        return f"{_kind(value)} (not shown: it may be a secret)"
    text = _URL_PASSWORD.sub(r"\1***@", repr(value))
    if len(text) > _SHOWN_LENGTH:
        text = f"{text[: _SHOWN_LENGTH - 10]}... ({len(text)} characters)"
    return text


def _kind(value: Any) -> str:
    for kind, text in (
        ("boolean", "true or false"),
        ("number", "a number"),
        ("string", "a string"),
        ("array", "a list"),
        ("object", "a mapping"),
    ):
        if _is(value, kind):
            return text
    return "a value"


def _describe_type(kind: str, node: Mapping[str, Any]) -> str:
    if kind in ("integer", "number"):
        return ("a whole number" if kind == "integer" else "a number") + _range(node)
    if kind == "string":
        text = "a non-empty string" if node.get("minLength", 0) >= 1 else "a string"
        return text + (f" matching {node['pattern']}" if "pattern" in node else "")
    if kind == "array":
        items = node.get("items")
        if not items:
            return "a list"
        if "title" in items or "enum" in items:
            return f"a list, each item {describe(items)}"
        plural = " or ".join(_PLURALS[k] for k in types_of(items))
        if types_of(items) in (["integer"], ["number"]):
            plural += _range(items)
        if types_of(items) == ["string"] and items.get("minLength", 0) >= 1:
            plural = "non-empty strings"
        return f"a list of {plural}"
    return {"boolean": "true or false", "object": "a mapping", "null": "null"}[kind]


def _range(node: Mapping[str, Any]) -> str:
    low, high = node.get("minimum"), node.get("maximum")
    if low is not None and high is not None:
        return f" from {low} to {high}"
    bounds = [
        f"{sign} {node[word]}"
        for word, sign in (
            ("minimum", ">="),
            ("exclusiveMinimum", ">"),
            ("maximum", "<="),
            ("exclusiveMaximum", "<"),
        )
        if word in node
    ]
    return (" " + " and ".join(bounds)) if bounds else ""


def _nearest(word: str, choices: Sequence[str]) -> str | None:
    folded = {choice.lower(): choice for choice in choices}
    found = difflib.get_close_matches(word.lower(), list(folded), n=1)
    return folded[found[0]] if found else None
