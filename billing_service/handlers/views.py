"""JSON views of billing records, the shapes the REST API answers with (and the pages show)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields
from datetime import datetime
from typing import Any

from gputap_common.money import format_credits

from ..domain.courses import WEEKDAYS, CourseRecord, StudentCourse
from ..domain.money import seconds_covered
from ..domain.records import (
    AccountState,
    HoldRecord,
    PriceBookRecord,
    SessionRecord,
    TransactionRecord,
)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def record_view(record: Any) -> dict[str, Any]:
    """A record's fields as JSON, in their order: times in ISO 8601, and after each amount in
    micro-credits (``NAME_micro``) the same amount as exact credits (``NAME``)."""
    view: dict[str, Any] = {}
    for field in fields(record):
        value = getattr(record, field.name)
        view[field.name] = _iso(value) if isinstance(value, datetime) else value
        if field.name.endswith("_micro"):
            view[field.name.removesuffix("_micro")] = format_credits(value)
    return view


#: one pool's part in paying for a session: (pool, course, course name, micro-credits)
Paid = tuple[str, str, str, int]


def paid_by_view(paid: tuple[Paid, ...]) -> list[dict[str, Any]]:
    """What paid for a session so far, pool by pool in funding order."""
    return [
        {
            "pool": pool,
            "course": course or None,
            "name": f"course {name}" if pool == "allowance" else pool,
            "amount_micro": micro,
            "amount": format_credits(micro),
        }
        for pool, course, name, micro in paid
    ]


def paid_by_text(paid: tuple[Paid, ...]) -> str:
    """ "trial", "paid", "course Intro to DL", or a mix with the amounts: "course Intro to DL
    0.50 + trial 0.25"; "" when nothing was charged yet."""
    parts = paid_by_view(paid)
    if len(parts) == 1:
        return parts[0]["name"]
    return " + ".join(f"{p['name']} {p['amount']}" for p in parts)


def session_view(
    session: SessionRecord, now: datetime, paid: tuple[Paid, ...] | None = None
) -> dict[str, Any]:
    """A session; a running one shows its seconds and cost so far. With ``paid`` (what its
    charges took from each pool), also what paid for it."""
    cost = session.cost_at(now)
    extra = {}
    if paid is not None:
        extra = {"paid_by": paid_by_view(paid), "paid_by_text": paid_by_text(paid)}
    return {
        "id": session.id,
        "username": session.username,
        "server_name": session.server_name,
        "worker": session.worker,
        "sku": session.sku,
        "count": session.count,
        "price_per_hour_micro": session.price_per_hour_micro,
        "price_per_hour": format_credits(session.price_per_hour_micro),
        "price_class": session.price_class,
        "started_at": _iso(session.started_at),
        "ended_at": _iso(session.ended_at),
        "billed_seconds": session.seconds_at(now),
        "cost_micro": cost,
        "cost": format_credits(cost),
        "charged_micro": session.charged_micro,
        "course": session.course,
        "environment": session.environment,
        "price_book_version": session.price_book_version,
        "state": "ended" if session.ended_at is not None else "running",
        **extra,
    }


def warnings_view(
    seconds_left: int | None,
    rate_per_hour_micro: int,
    thresholds: tuple[int, ...],
    course: str = "",
    servers: bool = True,
) -> list[dict[str, Any]]:
    """The "credit runs out soon" warning for the smallest threshold crossed, if any; for a
    course's sessions (``course``), about its hours this week; with no ``servers`` (data
    disks alone), that nothing stops and new servers are refused."""
    if seconds_left is None:
        return []
    crossed = [t for t in thresholds if seconds_left <= t]
    if not crossed:
        return []
    threshold = min(crossed)
    left = "no" if seconds_left <= 0 else f"about {format_duration_short(seconds_left)} of"
    what = f"course {course} hours this week" if course else "credit"
    then = (
        "running servers stop when it runs out (files are kept). Stop a server or ask for "
        "credit to keep going."
        if servers
        else "data disks are never stopped: the balance goes below zero and new servers are "
        "refused until credit is added. Delete a disk you no longer need or ask for credit."
    )
    return [
        {
            "threshold_seconds": threshold,
            "seconds_left": seconds_left,
            "course": course or None,
            "message": (
                f"{left[0].upper()}{left[1:]} {what} left at "
                f"{format_credits(rate_per_hour_micro)}/h; {then}"
            ),
        }
    ]


def format_duration_short(seconds: int) -> str:
    """Whole minutes ("14 min") above a minute, else seconds ("45 s")."""
    return f"{seconds} s" if seconds < 60 else f"{seconds // 60} min"


def account_view(
    state: AccountState, now: datetime, currency: str, warning_seconds: tuple[int, ...] = ()
) -> dict[str, Any]:
    """Balance, what open sessions cost so far, and how long the rest lasts.

    ``balance`` already includes the interval charges of open sessions; ``available`` is
    the balance less what they cost beyond those charges. Servers are listed in ``running``,
    data disks in ``storage``; both count in the running cost, the rate and ``seconds_left``."""
    running_cost = state.running_cost_at(now)
    available = state.available_at(now)
    rate = state.rate_per_hour_micro
    seconds_left = seconds_covered(available, rate)
    return {
        "username": state.username,
        "currency": currency,
        "created_at": _iso(state.created_at),
        "balance_micro": state.balance_micro,
        "balance": format_credits(state.balance_micro),
        "pools": {
            code.split(":", 2)[2]: {"balance_micro": micro, "balance": format_credits(micro)}
            for code, micro in state.pools.items()
        },
        "held_micro": state.held_micro,
        "held": format_credits(state.held_micro),
        "running_cost_micro": running_cost,
        "running_cost": format_credits(running_cost),
        "available_micro": available,
        "available": format_credits(available),
        "rate_per_hour_micro": rate,
        "rate_per_hour": format_credits(rate),
        "seconds_left": seconds_left,
        "warnings": [
            warning
            for course, group_available, sessions in state.funding_groups(now)
            for warning in warnings_view(
                seconds_covered(group_available, sum(s.rate_per_hour_micro for s in sessions)),
                sum(s.rate_per_hour_micro for s in sessions),
                warning_seconds,
                course,
                servers=any(not s.is_storage for s in sessions),
            )
        ],
        "running": [session_view(s, now) for s in state.servers],
        "storage": [session_view(s, now) for s in state.disks],
        "groups": groups_view(state.servers),
        **money_view(state, now),
        "as_of": now.isoformat(),
    }


def groups_view(sessions: Iterable[SessionRecord]) -> list[dict[str, Any]]:
    """The scale-out worker groups among running ``sessions``: per server with running
    workers, its workers (by number) and what they cost per hour together (the server's own
    session is not in it: it is listed in ``running`` with the workers)."""
    by_server: dict[str, list[SessionRecord]] = {}
    for s in sessions:
        if s.is_worker and s.ended_at is None:
            by_server.setdefault(s.server_name, []).append(s)
    groups = []
    for server, workers in sorted(by_server.items()):
        workers.sort(key=lambda s: int(s.worker[1:]))
        rate = sum(s.rate_per_hour_micro for s in workers)
        groups.append(
            {
                "server": server,
                "workers": [
                    {
                        "worker": s.worker,
                        "session_id": s.id,
                        "offering": s.sku,
                        "count": s.count,
                        "rate_per_hour_micro": s.rate_per_hour_micro,
                        "rate_per_hour": format_credits(s.rate_per_hour_micro),
                        "started_at": _iso(s.started_at),
                    }
                    for s in workers
                ],
                "rate_per_hour_micro": rate,
                "rate_per_hour": format_credits(rate),
            }
        )
    return groups


def _credits(**amounts: int) -> dict[str, Any]:
    """``NAME_micro`` and ``NAME`` (exact credits) for each amount."""
    view: dict[str, Any] = {}
    for name, micro in amounts.items():
        view[f"{name}_micro"] = micro
        view[name] = format_credits(micro)
    return view


def money_view(state: AccountState, now: datetime) -> dict[str, Any]:
    """The account's money apart: ``credit`` (own: trial + paid) with the arithmetic its
    page shows, and ``courses`` (each course's allowance left). Course hours are never
    credit; ``available`` above is the two together."""
    money = state.money_at(now)
    own = money.own
    return {
        "credit": {
            **_credits(
                trial=own.trial_micro,
                paid=own.paid_micro,
                balance=own.balance_micro,
                running_cost=own.running_cost_micro,
                charged=own.charged_micro,
                uncharged=own.uncharged_micro,
                available=own.available_micro,
                held=own.held_micro,
                free=own.free_micro,
                rate_per_hour=own.rate_per_hour_micro,
            ),
            "seconds_left": seconds_covered(own.available_micro, own.rate_per_hour_micro),
        },
        "courses": [
            {
                "course": c.course,
                **_credits(
                    allowance=c.pool_micro,
                    available=c.available_micro,
                    rate_per_hour=c.rate_per_hour_micro,
                ),
                "seconds_left": seconds_covered(c.available_micro, c.rate_per_hour_micro),
            }
            for c in money.courses
        ],
    }


def transaction_view(tx: TransactionRecord) -> dict[str, Any]:
    """A ledger transaction: the net to the user's pools, and every posting."""
    return {
        **record_view(tx),
        "postings": [
            {"account": code, "amount_micro": micro, "amount": format_credits(micro)}
            for code, micro in tx.postings
        ],
        "idempotency_key": tx.idempotency_key.removeprefix("grant:"),
    }


def hold_view(hold: HoldRecord) -> dict[str, Any]:
    """A hold: every field, the amount also as credits."""
    return record_view(hold)


def price_book_view(record: PriceBookRecord) -> dict[str, Any]:
    book = record.book
    return {
        "version": record.version,
        "created_at": _iso(record.created_at),
        "created_by": record.created_by,
        "source": record.source,
        "prices": book.configured_credits(),
        "spot_discount_percent": book.spot_discount_percent,
        "shared_percent": book.shared_percent,
    }


def course_view(course: CourseRecord, *, full: bool) -> dict[str, Any]:
    """A course; ``full`` (its instructors, admins) adds the join code and binding."""
    view: dict[str, Any] = {
        "slug": course.slug,
        "name": course.name,
        "weekly_hours": course.weekly_seconds / 3600,
        "allowed": list(course.allowed),
        "max_concurrent_gpus": course.max_concurrent_gpus,
        "max_workers": course.max_workers,
        "reset_weekday": WEEKDAYS[course.reset_weekday],
        "reset_time": course.reset_time,
        "timezone": course.timezone,
        "environment": course.environment,
        "instructors": list(course.instructors),
        "archived": course.archived_at is not None,
    }
    if full:
        view.update(
            github_team=course.github_team,
            join_code=course.join_code,
            budget_cap=(
                format_credits(course.budget_cap_micro) if course.budget_cap_micro else None
            ),
            created_by=course.created_by,
            created_at=course.created_at.isoformat(),
            archived_at=course.archived_at.isoformat() if course.archived_at else None,
        )
    return view


def student_course_view(taken: StudentCourse) -> dict[str, Any]:
    """A course as its student sees it this week: no join code, the hours left."""
    return {
        **course_view(taken.course, full=False),
        "fallback": taken.fallback,
        "week_start": taken.week_start.isoformat(),
        "week_end": taken.week_end.isoformat(),
        "left_micro": taken.left_micro,
        "left": format_credits(taken.left_micro),
        "hours_left": {sku: round(taken.hours_left(sku), 4) for sku in taken.course.allowed},
    }
