"""Usage reports, pure: GPU-hours per day and the CSV export of sessions."""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from gputap_common.money import format_credits

from .records import SessionRecord

CSV_COLUMNS = (
    "session_id",
    "username",
    "server_name",
    "sku",
    "count",
    "price_class",
    "course",
    "price_per_hour",
    "started_at",
    "ended_at",
    "billed_seconds",
    "cost",
    "state",
    # last, so readers of the columns before scale-out read them where they were
    "worker",
)


def gpus(session: SessionRecord) -> int:
    """GPUs a session holds: its count, or none for CPU only and data disks (whose count is
    GB); a slice or share counts one."""
    return 0 if session.sku == "cpu" or session.is_storage else session.count


def daily_gpu_hours(
    sessions: list[SessionRecord],
    now: datetime,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[dict[str, object]]:
    """GPU-hours per UTC day, oldest first, each day's share of every session counted exactly.

    Days run from ``since`` (default: the first session's day) to ``until`` (default: today),
    days without use included, so a chart has no gaps."""
    seconds: dict[str, int] = defaultdict(int)
    first = None
    for s in sessions:
        n = gpus(s)
        start = s.started_at
        end = s.ended_at or now
        if since is not None:
            start = max(start, since)
        if until is not None:
            end = min(end, until)
        first = start if first is None else min(first, start)
        while n and start < end:
            midnight = datetime(start.year, start.month, start.day, tzinfo=UTC) + timedelta(days=1)
            piece = min(end, midnight)
            seconds[start.date().isoformat()] += n * int((piece - start).total_seconds())
            start = piece
    begin = (since or first or now).date()
    last = (until - timedelta(microseconds=1) if until else now).date()
    days = []
    day = begin
    while day <= last:
        key = day.isoformat()
        days.append({"day": key, "gpu_seconds": seconds[key], "gpu_hours": seconds[key] / 3600})
        day += timedelta(days=1)
    return days


def csv_text(columns: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    """A header line and the rows, as CSV."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return out.getvalue()


def usage_csv(sessions: list[SessionRecord], now: datetime) -> str:
    """Sessions as CSV with exact amounts; running sessions show their seconds and cost so far."""
    return csv_text(
        CSV_COLUMNS,
        (
            (
                s.id,
                s.username,
                s.server_name,
                s.sku,
                s.count,
                s.price_class,
                s.course,
                format_credits(s.price_per_hour_micro),
                s.started_at.isoformat(),
                s.ended_at.isoformat() if s.ended_at else "",
                s.seconds_at(now),
                format_credits(s.cost_at(now)),
                "ended" if s.ended_at else "running",
                s.worker,
            )
            for s in sessions
        ),
    )
