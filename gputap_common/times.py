"""Times as other systems write them, read as timezone-aware datetimes."""

from __future__ import annotations

from datetime import datetime


def parse_kube_time(value: str | None) -> datetime | None:
    """A Kubernetes RFC 3339 time ("2026-11-29T19:00:00Z") as an aware datetime."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))
