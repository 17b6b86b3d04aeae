"""The one clock of gputap: timezone-aware UTC. Tests move time by patching :func:`utcnow`
(callers look it up as ``clock.utcnow()``, so one patch moves every side at once)."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)
