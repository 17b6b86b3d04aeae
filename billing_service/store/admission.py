"""Admission and holds on the database: the facts an admission is judged on, read and locked
in its transaction, and the hold that claims the credit until the server starts. The
decisions and messages are pure, in :mod:`billing_service.domain.admission`."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..domain.admission import (
    Claim,
    Judgement,
    check_course_spawn,
    course_admissible_at,
    course_refusal,
)
from ..domain.courses import CourseRecord
from ..domain.errors import Conflict, NotFound
from ..domain.records import HoldRecord
from ..orm import Account, BillingSession, Course, Enrollment, Hold
from . import accounts, courses
from .operations import reads, writes
from .postings import KEY_TAKEN
from .rows import hold_record
from .terms import Terms


def admit(
    db: Session,
    username: str,
    claim: Claim,
    now: datetime,
    *,
    hold: bool,
    idempotency_key: str | None,
    course: str,
    terms: Terms,
) -> Judgement:
    """Judge an admission of ``claim`` and, when it is covered and ``hold``, place its hold.
    ``ValueError`` names a course rule it breaks; ``Conflict`` when ``idempotency_key``
    came before for another account or with another claim."""
    account, _ = accounts.open_account(db, username, now, terms.trial_credit_micro)
    db.flush()
    # one admission per account at a time, across replicas
    db.scalar(select(Account.id).where(Account.id == account.id).with_for_update())
    if idempotency_key is not None:
        earlier = db.get(Hold, idempotency_key)
        if earlier is not None:
            if earlier.account_id != account.id:
                raise Conflict(KEY_TAKEN)
            asked = (claim.sku, claim.count, claim.price_class, course)
            if (earlier.sku, earlier.count, earlier.price_class, earlier.course) != asked:
                raise Conflict(
                    "idempotency_key: the same key came before with a different body (it "
                    f"admitted {earlier.count} x {earlier.sku}); a replay must repeat the first "
                    "request exactly. Send a new key for another admission"
                )
            state = accounts.state(db, account, now)
            return Judgement(state, hold_record(earlier, username), replayed=True)
    minimum = terms.min_billable_seconds
    needed = claim.needed_micro
    if course:
        rules, fallback = course_spawn(db, account, course, claim.sku, claim.count, now, terms)
        state = accounts.state(db, account, now)
        held = course_holds(db, account.id, course, now, Hold.amount_micro)
        free = course_admissible_at(state, course, held, now, minimum)
        own = state.admissible_at(now, minimum)
        refusal = course_refusal(rules, claim.sku, needed, free, own, fallback, now, minimum)
        if refusal is not None:
            return Judgement(state, refusal=refusal)
    else:
        state = accounts.state(db, account, now)
        if state.admissible_at(now, minimum) < needed:
            return Judgement(state)
    if not hold:
        return Judgement(state)
    row = Hold(
        id=idempotency_key or uuid.uuid4().hex,
        account_id=account.id,
        sku=claim.sku,
        count=claim.count,
        price_class=claim.price_class,
        amount_micro=needed,
        created_at=now,
        expires_at=now + timedelta(seconds=terms.hold_seconds),
        course=course,
    )
    db.add(row)
    db.flush()
    return Judgement(state, hold_record(row, username))


def course_spawn(
    db: Session, account: Account, slug: str, sku: str, count: int, now: datetime, terms: Terms
) -> tuple[CourseRecord, bool]:
    """Check a course-funded spawn against the course's rules (``ValueError`` names the
    broken one) and grant the week; returns the course and whether the student pays on from
    their own credit."""
    row = db.get(Course, slug)
    taken = courses.course_of(db, row) if row is not None else None
    enrollment = db.get(Enrollment, (slug, account.username)) if taken is not None else None
    running = db.scalar(
        select(func.coalesce(func.sum(BillingSession.count), 0)).where(
            BillingSession.account_id == account.id,
            BillingSession.course == slug,
            BillingSession.ended_at.is_(None),
        )
    )
    starting = course_holds(db, account.id, slug, now, Hold.count)
    check_course_spawn(taken, slug, enrollment is not None, sku, count, running + starting)
    courses.ensure_week(db, row, account.username, now, terms)
    return taken, enrollment.fallback


def course_holds(db: Session, account_id: int, course: str, now: datetime, column: Any) -> int:
    """The sum of ``column`` (``Hold.amount_micro``, ``Hold.count``) over the account's
    active holds for ``course``."""
    total = db.scalar(
        select(func.coalesce(func.sum(column), 0)).where(
            Hold.account_id == account_id,
            Hold.course == course,
            Hold.released_at.is_(None),
            Hold.expires_at > now,
        )
    )
    return int(total)


def hold_started(
    db: Session, hold_id: str | None, account_id: int, session_id: str, now: datetime
) -> None:
    """The admission's hold became the session: release it as started."""
    if not hold_id:
        return
    held = db.get(Hold, hold_id, with_for_update=True)
    if held is not None and held.account_id == account_id:
        if held.released_at is None:
            held.released_at = now
            held.release_reason = "started"
        held.session_id = session_id


@writes
def release_hold(db: Session, hold_id: str, now: datetime, reason: str = "released") -> HoldRecord:
    """Give a hold's credit back (a start failed); a released hold stays as it was."""
    row = db.get(Hold, hold_id, with_for_update=True)
    if row is None:
        raise NotFound(f"No hold {hold_id!r}; holds come from POST api/admission")
    if row.released_at is None:
        row.released_at = now
        row.release_reason = reason
    username = db.scalar(select(Account.username).where(Account.id == row.account_id))
    return hold_record(row, username)


@reads(name="holds")
def active_holds(db: Session, username: str, now: datetime) -> list[HoldRecord]:
    """Active holds of ``username``, oldest first; ``NotFound`` for no account."""
    account = accounts.require(db, username)
    rows = db.scalars(
        select(Hold)
        .where(
            Hold.account_id == account.id,
            Hold.released_at.is_(None),
            Hold.expires_at > now,
        )
        .order_by(Hold.created_at, Hold.id)
    )
    return [hold_record(row, username) for row in rows]
