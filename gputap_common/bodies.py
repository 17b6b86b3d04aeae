"""Request bodies as billing and the hub's gputap API read them: a JSON object of known
fields, and refusals that never echo in full what a caller sent."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

#: what a refusal shows of a key or value the caller sent, at most
SHOWN_CHARACTERS = 40
#: how deep a body may nest arrays and objects: no real one goes past 4, and a deeper one
#: would fail wherever it is read, written or shown again (Python's recursion limit)
MAX_DEPTH = 32
#: the refusal of a body nested deeper than MAX_DEPTH
TOO_DEEP = (
    f"The body is nested too deep (more than {MAX_DEPTH} levels of [ ] and {{ }}): "
    "send a JSON object of the fields the API documents"
)


def shown(value: object, limit: int = SHOWN_CHARACTERS) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages: what a caller sent is never
    echoed in full into answers and logs."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def unknown_fields(body: Mapping[str, Any], allowed: Iterable[str]) -> str | None:
    """The refusal of a body with keys outside ``allowed`` (naming at most five of them and
    every allowed one), or None when it has none: a misspelt key ("cuorse") is refused rather
    than silently ignored (docs/security.md)."""
    allowed = sorted(allowed)
    unknown = sorted(key for key in body if key not in allowed)
    if not unknown:
        return None
    names = ", ".join(shown(key) for key in unknown[:5])
    return (
        f"Unknown field(s) {names}; the allowed fields are "
        f"{', '.join(allowed) if allowed else 'none (send no body)'}"
    )


class BodyRefused(ValueError):
    """Why a request body is refused, as a sentence for a 400."""


def json_object(raw: bytes, allowed: Iterable[str], *, decimals_only: bool = False) -> dict:
    """``raw`` as a JSON object whose keys are all in ``allowed`` ({} for an empty body), or
    :class:`BodyRefused`. ``decimals_only``: numbers must be written in decimal notation (no
    exponent, NaN or Infinity), as amounts of money are."""
    if not raw:
        return {}
    options: dict[str, Any] = (
        {"parse_float": _decimal_float, "parse_constant": _no_constant} if decimals_only else {}
    )
    try:
        data = json.loads(raw, **options)
    except RecursionError:
        raise BodyRefused(TOO_DEEP) from None
    except ValueError:
        hint = ", with numbers in decimal notation like 12.5" if decimals_only else ""
        raise BodyRefused(f"The body must be JSON (an object){hint}") from None
    if nested_deeper(data, MAX_DEPTH):
        raise BodyRefused(TOO_DEEP)
    if not isinstance(data, dict):
        raise BodyRefused("The body must be a JSON object")
    refusal = unknown_fields(data, allowed)
    if refusal:
        raise BodyRefused(refusal)
    return data


def nested_deeper(data: Any, limit: int) -> bool:
    """Whether ``data`` (as ``json.loads`` reads it) nests arrays and objects more than
    ``limit`` levels deep (``[]`` and ``{}`` are one level); walked without recursion."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: Iterable[Any] = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _decimal_float(text: str) -> float:
    if "e" in text or "E" in text:
        raise ValueError("exponent")
    return float(text)


def _no_constant(text: str) -> float:
    raise ValueError(text)
