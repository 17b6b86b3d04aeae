"""What a refusal may say about what a caller sent: never all of it, and which fields of a
request body are unknown. Billing and the hub's gputap API refuse the same way."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: what a refusal shows of a key or value the caller sent, at most
SHOWN_CHARACTERS = 40


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
