"""JSON as the extension reads it from others: request bodies (the Lab routes, the worker's
agent) and the hub's and agents' answers.

A text nested deeper than any real body or answer is refused as unreadable, with a sentence
saying so, rather than failing with a RecursionError (a 500) where it is read, or later where
it is written or shown again. The hub and billing keep the same rule
(``gputap_common/bodies.py``), which this package, installed on its own in the single-user
environments, cannot import.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

#: how deep JSON may nest arrays and objects: no real body or answer goes past 6
MAX_DEPTH = 32
#: why a text nested deeper than MAX_DEPTH is refused
TOO_DEEP = f"it is nested too deep: more than {MAX_DEPTH} levels of [ ] and {{ }}"


class NotJSON(ValueError):
    """Why a text cannot be read as JSON, as a clause ("it is nested too deep ...")."""


def read_json(raw: bytes | str) -> Any:
    """``raw`` as JSON, or :class:`NotJSON` saying why not (never a RecursionError)."""
    try:
        data = json.loads(raw)
    except RecursionError:
        raise NotJSON(TOO_DEEP) from None
    except ValueError as e:
        raise NotJSON(str(e)) from None
    if nested_deeper(data, MAX_DEPTH):
        raise NotJSON(TOO_DEEP)
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
