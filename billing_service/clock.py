"""The one clock of the billing service. Tests move time by patching :func:`utcnow`."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)
