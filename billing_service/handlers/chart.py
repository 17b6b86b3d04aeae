"""The billing page's GPU-hours chart as data for its template: one row per day with its date,
its value in words and its bar's length on a shared axis, the axis's ticks, and a one-line
summary (the chart's text alternative). Pure: the template draws it, server-side."""

from __future__ import annotations

import math
from datetime import date
from typing import Any

#: the steps an axis may count in, times a power of ten: 0.25, 0.5, 1, 2, 2.5, 5, 10, ...
_STEPS = (1, 2, 2.5, 5)
#: at most this many intervals between the axis's ticks
_MAX_INTERVALS = 4


def axis_ticks(top: float) -> list[float]:
    """Evenly spaced round ticks from 0 to at least ``top`` (0 or less: 0 to 1), at most
    five of them: 2.0 -> [0, 0.5, 1, 1.5, 2], 7 -> [0, 2, 4, 6, 8]."""
    if top <= 0:
        top = 1.0
    power = 10.0 ** math.floor(math.log10(top / _MAX_INTERVALS))
    step = next(
        m * p
        for p in (power, power * 10)
        for m in _STEPS
        if math.ceil(round(top / (m * p), 9)) <= _MAX_INTERVALS
    )
    intervals = math.ceil(round(top / step, 9))
    return [round(i * step, 9) for i in range(intervals + 1)]


def tick_text(value: float) -> str:
    """A tick as the axis writes it: "0", "0.5", "2", "0.25"."""
    return f"{value:g}"


def hours_text(seconds: int) -> str:
    """A day's GPU-hours beside its bar: "0", "< 0.01", "1.50"."""
    if seconds == 0:
        return "0"
    hours = seconds / 3600
    return "< 0.01" if hours < 0.005 else f"{hours:.2f}"


def day_text(day: date) -> str:
    """A day as the chart labels it: "Tue 14 Jul"."""
    return f"{day:%a} {day.day} {day:%b}"


def chart_view(days: list[dict[str, Any]]) -> dict[str, Any]:
    """The chart of ``days`` (``daily_gpu_hours``: ``day`` ISO date, ``gpu_seconds``), oldest
    first: ``rows`` (day, label, value, percent of the axis), ``ticks`` (text, percent),
    ``summary``."""
    top_seconds = max((d["gpu_seconds"] for d in days), default=0)
    ticks = axis_ticks(top_seconds / 3600)
    axis_seconds = ticks[-1] * 3600
    rows = [
        {
            "day": d["day"],
            "label": day_text(date.fromisoformat(d["day"])),
            "gpu_seconds": d["gpu_seconds"],
            "value": hours_text(d["gpu_seconds"]),
            "percent": round(100 * d["gpu_seconds"] / axis_seconds, 3),
        }
        for d in days
    ]
    return {
        "rows": rows,
        "ticks": [{"text": tick_text(t), "percent": round(100 * t / ticks[-1], 3)} for t in ticks],
        "summary": summary(rows),
    }


def summary(rows: list[dict[str, Any]]) -> str:
    """The chart in one sentence: the total, and the busiest day."""
    span = f"in the last {len(rows)} days" if len(rows) != 1 else "today"
    total = sum(r["gpu_seconds"] for r in rows)
    if not total:
        return f"No GPU use {span}."
    busiest = max(rows, key=lambda r: r["gpu_seconds"])
    return f"{hours_text(total)} GPU-hours {span}; most on {busiest['label']} ({busiest['value']})."
