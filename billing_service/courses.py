"""Courses, pure: validating a course's rules and the weeks its allowance runs by.

A course pays for GPU time of its students: ``weekly_hours`` per student per week of one GPU of
its *reference option* (the dearest option it allows, at the price in force when the week's
allowance is granted), on the options it allows only (``allowed``: offering keys such as
``T4`` or ``A100-80GB/1g.10gb``), at most ``max_concurrent_gpus`` GPUs at once per student.
The allowance is credit in the student's ``user:U:allowance:COURSE`` pool, so a cheaper option
lasts longer: hours left on an option = pool / (its price × count).

A week starts at ``reset_weekday`` (0 = Monday) ``reset_time`` in ``timezone`` and lasts
until the next one, daylight-saving changes included: the boundaries are wall-clock times in
that zone, turned into exact UTC instants.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .money import parse_credits

SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}$")
TEAM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}:[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
OFFERING = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*(/(\d+g\.\d+gb|shared))?$")
MAX_WEEKLY_HOURS = 168
MAX_GPUS = 64
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


@dataclass(frozen=True)
class CourseRules:
    """What an instructor decides; validated by :func:`course_rules`."""

    name: str
    weekly_hours: float
    allowed: tuple[str, ...]
    max_concurrent_gpus: int
    budget_cap_micro: int | None
    github_team: str | None
    reset_weekday: int
    reset_time: time
    timezone: str


def _number(value: object, field: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{field} must be a number, not {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{field} must be from {low:g} to {high:g}, not {value!r}")
    return float(value)


def course_rules(body: Mapping[str, object], known_skus: set[str]) -> CourseRules:
    """Validate an instructor's course; ``ValueError`` says which field is wrong and why.

    ``known_skus`` are the options billing has a price for: an allowed option without a price
    could never be admitted, so it is refused here."""
    name = body.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ValueError("name must be a non-empty string of at most 200 characters")
    weekly = _number(body.get("weekly_hours", 6), "weekly_hours", 0, MAX_WEEKLY_HOURS)
    allowed = body.get("allowed")
    if not isinstance(allowed, list) or not allowed:
        raise ValueError(
            'allowed must be a non-empty list of options the course pays for, e.g. ["T4", '
            '"A100-80GB/1g.10gb"]'
        )
    for sku in allowed:
        if not isinstance(sku, str) or not OFFERING.match(sku):
            raise ValueError(f"allowed: {sku!r} is not an option such as T4 or A100-80GB/1g.10gb")
        if sku not in known_skus:
            raise ValueError(f"allowed: {sku!r} has no price; see GET api/prices for the options")
    gpus = body.get("max_concurrent_gpus", 1)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= MAX_GPUS:
        raise ValueError(f"max_concurrent_gpus must be a whole number from 1 to {MAX_GPUS}")
    cap = body.get("budget_cap")
    cap_micro = None
    if cap is not None:
        cap_micro = parse_credits(cap, "budget_cap")
        if cap_micro <= 0:
            raise ValueError("budget_cap must be positive, or left out for no cap")
    team = body.get("github_team")
    if team is not None and (not isinstance(team, str) or not TEAM.match(team)):
        raise ValueError(f"github_team must be 'org:team-slug', not {team!r}")
    weekday = body.get("reset_weekday", "monday")
    if not isinstance(weekday, str) or weekday.lower() not in WEEKDAYS:
        raise ValueError(f"reset_weekday must be one of {', '.join(WEEKDAYS)}, not {weekday!r}")
    at = body.get("reset_time", "00:00")
    try:
        if not isinstance(at, str) or not re.fullmatch(r"\d\d:\d\d", at):
            raise ValueError
        reset = time.fromisoformat(at)
    except ValueError:
        raise ValueError(f"reset_time must be HH:MM, e.g. 08:00, not {at!r}") from None
    zone = body.get("timezone", "UTC")
    try:
        if not isinstance(zone, str):
            raise ValueError
        ZoneInfo(zone)
    except (ValueError, ZoneInfoNotFoundError):
        raise ValueError(
            f"timezone must be an IANA name such as Europe/Berlin, not {zone!r}"
        ) from None
    return CourseRules(
        name=name.strip(),
        weekly_hours=weekly,
        allowed=tuple(dict.fromkeys(allowed)),
        max_concurrent_gpus=gpus,
        budget_cap_micro=cap_micro,
        github_team=team,
        reset_weekday=WEEKDAYS.index(weekday.lower()),
        reset_time=reset,
        timezone=zone,
    )


def slug_of(name: str) -> str:
    """A course slug from its name: lower case, dashes, at most 63 characters."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:63].strip("-")
    return slug if len(slug) >= 2 else f"course-{slug}".strip("-")


def week_of(at: datetime, weekday: int, reset: time, timezone: str) -> tuple[datetime, datetime]:
    """The [start, end) instants (UTC) of the course week containing ``at``."""
    zone = ZoneInfo(timezone)
    local = at.astimezone(zone)
    days_back = (local.weekday() - weekday) % 7
    start_date = local.date() - timedelta(days=days_back)
    start = datetime.combine(start_date, reset, tzinfo=zone)
    if start > local:
        start_date -= timedelta(days=7)
        start = datetime.combine(start_date, reset, tzinfo=zone)
    end = datetime.combine(start_date + timedelta(days=7), reset, tzinfo=zone)
    return start.astimezone(UTC), end.astimezone(UTC)
