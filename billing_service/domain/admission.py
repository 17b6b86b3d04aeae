"""Admission, pure: may a user start a server now, and what are they told.

The store reads the facts in one transaction (the account's state, a course's rules, what the
student runs and holds of it) and places the hold; these functions make the decisions and
write the messages. A server is admitted when the credit it may claim covers its minimum
billable period: the account's (or, course-funded, the course allowance's) available credit,
less active holds and the rest of the minimum period of servers started within it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gputap_common.money import format_credits

from .courses import CourseRecord
from .money import format_duration, seconds_covered
from .pricing import DISK, STORAGE
from .records import AccountState, HoldRecord


@dataclass(frozen=True)
class Claim:
    """What an admission asks for: ``count`` x ``sku`` in ``price_class`` at its price now,
    and the credit its minimum billable period needs (what a hold claims)."""

    sku: str
    count: int
    price_class: str
    price_per_hour_micro: int
    needed_micro: int


@dataclass(frozen=True)
class Judgement:
    """What the store read and did for an admission, in its transaction: the account state
    it was judged on, the hold placed (or the earlier one a replay found), whether it was a
    replay, and a course's refusal."""

    state: AccountState
    hold: HoldRecord | None = None
    replayed: bool = False
    refusal: str | None = None


@dataclass(frozen=True, kw_only=True)
class Admission(Claim):
    """The answer to an admission: its claim, whether it is allowed, and what the user is
    told."""

    allowed: bool
    available_micro: int
    seconds_left: int | None
    message: str
    hold: HoldRecord | None = None


def check_admission_request(sku: str, price_class: str) -> None:
    """``ValueError`` for a data disk: its storage session opens without admission."""
    if sku == DISK or price_class == STORAGE:
        raise ValueError(
            "Data disks need no admission: open the disk's storage session with "
            "POST api/sessions (sku 'disk', price_class 'storage') when it is created"
        )


def check_course_spawn(
    course: CourseRecord | None, slug: str, enrolled: bool, sku: str, count: int, in_use: int
) -> None:
    """``ValueError`` naming the course rule a course-funded spawn breaks: the course must be
    active, the user its student, ``sku`` one of its options, and ``in_use`` (GPUs of the
    course running or held for this student) plus ``count`` within its limit."""
    # a course the user does not take reads as one that does not exist: its name and
    # rules are not told to strangers (docs/security.md)
    if course is None or course.archived_at is not None or not enrolled:
        raise ValueError(
            f"course: you take no active course {slug!r}; join it with its code or ask its "
            "instructor, or start without the course to pay with your own credit"
        )
    if sku not in course.allowed:
        raise ValueError(
            f"{course.name} pays for {', '.join(course.allowed)} only, not {sku}. Pick one "
            "of those, or start without the course to pay with your own credit."
        )
    if in_use + count > course.max_concurrent_gpus:
        raise ValueError(
            f"{course.name} allows {course.max_concurrent_gpus} GPU(s) at once per student; "
            f"you have {in_use} running or starting"
        )


def course_admissible_at(
    state: AccountState, course: str, held_micro: int, now: datetime, min_billable_seconds: int
) -> int:
    """The course's allowance a new server may claim: what is left, less the course's active
    holds (``held_micro``) and the rest of the minimum period of its young servers."""
    young = sum(
        s.minimum_left_at(now, min_billable_seconds) for s in state.running if s.course == course
    )
    return state.course_available_at(course, now) - held_micro - young


def course_refusal(
    course: CourseRecord,
    sku: str,
    needed_micro: int,
    course_free_micro: int,
    own_free_micro: int,
    fallback: bool,
    now: datetime,
    min_billable_seconds: int,
) -> str | None:
    """None when the course's allowance covers ``needed_micro``, or the student opted in to
    paying on (``fallback``) and their own credit does; else the refusal, saying when the
    hours reset and what to do meanwhile."""
    if course_free_micro >= needed_micro or (fallback and own_free_micro >= needed_micro):
        return None
    _, end = course.week(now)
    return (
        f"No {course.name} hours left this week for {sku}: "
        f"{format_duration(min_billable_seconds)} needs "
        f"{format_credits(needed_micro)} of the course's allowance, "
        f"{format_credits(max(course_free_micro, 0))} is left. Hours reset {course.resets} "
        f"({end.isoformat()}). Opt in to go on with your own credit, or start "
        "without the course."
    )


def credit_refusal(
    state: AccountState,
    what: str,
    rate_micro: int,
    needed_micro: int,
    free_micro: int,
    now: datetime,
    min_billable_seconds: int,
) -> str:
    """Why the user's own credit does not admit ``what``: what it needs, what is available and
    what of it young servers hold, and what to do (data disks named, as they drain it)."""
    period = format_duration(min_billable_seconds)
    claimed = ""
    if free_micro < state.available_at(now):
        claimed = (
            f" ({format_credits(state.available_at(now) - free_micro)} is held for servers "
            f"starting or started in the last {period})"
        )
    message = (
        f"Not enough credit for {what}: {period} "
        f"at {format_credits(rate_micro)}/h needs {format_credits(needed_micro)} credits, "
        f"you have {format_credits(max(free_micro, 0))} available{claimed}. "
        "Stop a running server or ask an admin for credit."
    )
    if state.disks:
        disks = sum(s.rate_per_hour_micro for s in state.disks)
        message += (
            f" Your data disks cost {format_credits(disks)}/h while they exist; "
            "delete one you no longer need."
        )
    return message


def decide(
    judged: Judgement, claim: Claim, now: datetime, min_billable_seconds: int, course: str
) -> Admission:
    """The answer to an admission, from what it was judged on: admitted when a hold was
    placed (or this is a replay of one), or, asked without a hold, when the credit covers it;
    else refused with the course's refusal or why the credit does not cover it."""
    state, hold = judged.state, judged.hold
    rate = claim.price_per_hour_micro * claim.count
    free = state.admissible_at(now, min_billable_seconds)
    # a replay answers as the first time did: its hold is already among the held credit
    if judged.replayed and hold is not None and hold.released_at is None:
        free += hold.amount_micro
    allowed = (
        judged.replayed
        or hold is not None
        or (judged.refusal is None and free >= claim.needed_micro)
    )
    what = claim.sku if claim.count == 1 else f"{claim.count} x {claim.sku}"
    if allowed:
        message = f"Admitted {what} at {format_credits(rate)}/h"
        if course:
            message += f", paid by course {course}"
    elif judged.refusal:
        message = judged.refusal
    else:
        message = credit_refusal(
            state, what, rate, claim.needed_micro, free, now, min_billable_seconds
        )
    return Admission(
        **vars(claim),
        allowed=allowed,
        available_micro=free,
        seconds_left=seconds_covered(state.available_at(now), state.rate_per_hour_micro + rate),
        message=message,
        hold=hold,
    )
