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
import secrets
import unicodedata
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gputap_common.github_names import team_name
from gputap_common.money import format_credits

from .money import billed_seconds, cost_micro, parse_credits
from .pricing import PriceBook
from .records import SessionRecord

#: a course name as the refusals show one
EXAMPLE_NAME = "Deep Learning 101 (spring)"
OFFERING = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]*(/(\d+g\.\d+gb|shared))?")
#: the fields of a course's rules, as an instructor sends them (:func:`course_rules`)
COURSE_FIELDS = (
    "name",
    "weekly_hours",
    "allowed",
    "max_concurrent_gpus",
    "budget_cap",
    "github_team",
    "reset_weekday",
    "reset_time",
    "timezone",
    "environment",
    "max_workers",
)
#: an environment's key, as the hub's settings name it (environments.KEY)
ENVIRONMENT_KEY = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
MAX_WEEKLY_HOURS = 168
MAX_GPUS = 64
#: the most workers a course may let each of its students' servers scale out to
MAX_WORKERS = 64
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
#: failed join attempts per user allowed within JOIN_WINDOW before joining is refused
JOIN_ATTEMPTS = 5
JOIN_WINDOW = timedelta(minutes=15)


@dataclass(frozen=True)
class CourseRules:
    """What an instructor decides; validated by :func:`course_rules`."""

    name: str
    #: the allowance per student and week: this long on one GPU of the reference option
    weekly_seconds: int
    allowed: tuple[str, ...]
    max_concurrent_gpus: int
    budget_cap_micro: int | None
    github_team: str | None
    #: a week starts on this weekday (0 = Monday) at ``reset_time`` ("HH:MM") in ``timezone``
    reset_weekday: int
    reset_time: str
    timezone: str
    #: the environment its students' servers run ("": the one they choose)
    environment: str
    #: workers each of its students' servers may scale out to; 0 forbids scale-out
    max_workers: int


@dataclass(frozen=True)
class CourseRecord(CourseRules):
    """A course: its rules, and what billing keeps beside them."""

    slug: str
    join_code: str | None
    created_by: str
    created_at: datetime
    archived_at: datetime | None
    instructors: tuple[str, ...]

    def week(self, at: datetime) -> tuple[datetime, datetime]:
        return week_of(at, self.reset_weekday, time.fromisoformat(self.reset_time), self.timezone)

    @property
    def resets(self) -> str:
        return f"{WEEKDAYS[self.reset_weekday].capitalize()} {self.reset_time} {self.timezone}"


def _number(value: object, field: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{field} must be a number, not {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{field} must be from {low:g} to {high:g}, not {value!r}")
    return float(value)


def course_rules(
    body: Mapping[str, object], known_skus: set[str], environments: Collection[str] = ()
) -> CourseRules:
    """Validate an instructor's course; ``ValueError`` says which field is wrong and why.

    ``known_skus`` are the options billing has a price for: an allowed option without a price
    could never be admitted, so it is refused here; ``environments`` the hub's environments,
    one of which the course may pin."""
    name = body.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise ValueError("name must be a non-empty string of at most 200 characters")
    if any(unicodedata.category(ch).startswith("C") for ch in name):
        raise ValueError(
            f"name must be text of at most 200 characters without control characters "
            f"(newlines, tabs, NUL) or invisible ones, such as {EXAMPLE_NAME!r}"
        )
    if not any(ch.isalnum() for ch in name):
        raise ValueError(f"name must be text with a letter or digit, such as {EXAMPLE_NAME!r}")
    weekly = _number(body.get("weekly_hours", 6), "weekly_hours", 0, MAX_WEEKLY_HOURS)
    allowed = body.get("allowed")
    if not isinstance(allowed, list) or not allowed:
        raise ValueError(
            'allowed must be a non-empty list of options the course pays for, e.g. ["T4", '
            '"A100-80GB/1g.10gb"]'
        )
    for sku in allowed:
        if not isinstance(sku, str) or not OFFERING.fullmatch(sku):
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
    if team is not None:
        # kept as the hub's groups are (lower-case org:team-slug), or it would match none
        team = team_name(team, "github_team")
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
    environment = body.get("environment") or ""
    if not isinstance(environment, str) or (
        environment and not ENVIRONMENT_KEY.fullmatch(environment)
    ):
        raise ValueError("environment must be the key of one of the hub's environments, or empty")
    if environment and environment not in environments:
        raise ValueError(
            f"environment: {environment!r} is not one of the hub's environments; "
            f"choose one of {', '.join(sorted(environments))}"
        )
    return CourseRules(
        environment=environment,
        max_workers=max_workers_field(body.get("max_workers", 0)),
        name=name.strip(),
        weekly_seconds=round(weekly * 3600),
        allowed=tuple(dict.fromkeys(allowed)),
        max_concurrent_gpus=gpus,
        budget_cap_micro=cap_micro,
        github_team=team,
        reset_weekday=WEEKDAYS.index(weekday.lower()),
        reset_time=reset.strftime("%H:%M"),
        timezone=zone,
    )


def max_workers_field(value: object) -> int:
    """A course's ``max_workers``: a whole number from 0 (no scale-out) to MAX_WORKERS."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_WORKERS:
        raise ValueError(
            f"max_workers must be a whole number from 0 (its students' servers may not scale "
            f"out) to {MAX_WORKERS} (workers per server)"
        )
    return value


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


@dataclass(frozen=True)
class StudentCourse:
    """A student's view of one course this week."""

    course: CourseRecord
    fallback: bool
    week_start: datetime
    week_end: datetime
    left_micro: int
    prices: dict[str, int]

    def hours_left(self, sku: str, count: int = 1) -> float:
        price = self.prices.get(sku)
        if not price or self.left_micro <= 0:
            return 0.0
        return self.left_micro / (price * count)


def new_join_code() -> str:
    """A join code: 10 characters from an alphabet without look-alikes (about 50 bits)."""
    alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
    return "".join(secrets.choice(alphabet) for _ in range(10))


def reference_price(book: PriceBook, allowed: Iterable[str]) -> int:
    """The price per hour of a course's reference option: the dearest option it allows."""
    return max((book.price(sku) or 0) for sku in allowed)


def week_allowance(
    reference_price_micro: int, weekly_seconds: int, cap_micro: int | None, spent_micro: int
) -> int:
    """A student's allowance for a new week: the weekly hours of the reference option, within
    what the course's budget cap leaves (``spent_micro``: granted and not taken back)."""
    amount = cost_micro(reference_price_micro, 1, weekly_seconds)
    if cap_micro is not None:
        amount = max(0, min(amount, cap_micro - spent_micro))
    return amount


def overlap_seconds(start: datetime, end: datetime, lo: datetime, hi: datetime) -> int:
    """Whole seconds of [start, end) inside [lo, hi)."""
    a, b = max(start, lo), min(end, hi)
    return billed_seconds(a, b) if b > a else 0


def roster_rows(
    students: Iterable[str],
    sessions: Iterable[SessionRecord],
    start: datetime,
    end: datetime,
    at: datetime,
) -> list[dict[str, Any]]:
    """Per student, by name: GPU-seconds, sessions and cost of the course ``sessions`` in the
    week [start, end), running ones until ``at`` (sessions crossing a boundary count their
    part only)."""
    usage: dict[str, dict[str, int]] = defaultdict(
        lambda: {"gpu_seconds": 0, "sessions": 0, "cost_micro": 0}
    )
    for name in students:
        usage[name]  # a student without sessions is a row of zeros
    for s in sessions:
        seconds = overlap_seconds(s.started_at, s.ended_at or at, start, end)
        row = usage[s.username]
        row["gpu_seconds"] += seconds * s.count
        row["sessions"] += 1
        row["cost_micro"] += cost_micro(s.price_per_hour_micro, s.count, seconds)
    return [
        {
            "username": name,
            **values,
            "gpu_hours": values["gpu_seconds"] / 3600,
            "cost": format_credits(values["cost_micro"]),
        }
        for name, values in sorted(usage.items())
    ]
