"""Courses on the database: rules, instructors, students, weekly allowances, roster usage.

The week's allowance is granted lazily, the first time billing touches a student of a course
in a new week (an admission, a charge pass, a stop, a view): first the student's running
course sessions are charged up to the boundary from the old week's pool (the session crossing
it is split exactly there), then what is left of the old week expires (a negative balance,
enforcement's overrun, is written off too), then the new week is granted under the key
``allowance:{course}:{user}:{week start}``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..domain import ledger
from ..domain.courses import (
    JOIN_ATTEMPTS,
    JOIN_WINDOW,
    CourseRecord,
    CourseRules,
    StudentCourse,
    new_join_code,
    reference_price,
    roster_rows,
    week_allowance,
)
from ..domain.errors import NotFound
from ..domain.money import billed_seconds, cost_micro
from ..domain.records import Saved, TransactionRecord
from ..orm import (
    Account,
    BillingSession,
    Course,
    CourseInstructor,
    Enrollment,
    Instructor,
    JoinAttempt,
    LedgerAccount,
    LedgerTransaction,
    Posting,
)
from . import accounts, charges, postings, prices
from .operations import reads, writes
from .rows import course_record, new_course, session_record
from .terms import Terms

#: what :func:`try_join` answers instead of a course
WRONG_CODE = "wrong"
TOO_MANY_ATTEMPTS = "limited"

# -- records ---------------------------------------------------------------------------------


def course_row(db: Session, slug: str) -> Course:
    """The row of course ``slug``; ``NotFound`` when there is none."""
    row = db.get(Course, slug)
    if row is None:
        raise NotFound(f"No course {slug!r}")
    return row


def course_of(db: Session, row: Course) -> CourseRecord:
    """The course of ``row`` with its instructors."""
    names = db.scalars(
        select(CourseInstructor.username).where(CourseInstructor.course == row.slug)
    ).all()
    return course_record(row, names)


@reads
def course(db: Session, slug: str) -> CourseRecord:
    """Course ``slug``; ``NotFound`` when there is none."""
    return course_of(db, course_row(db, slug))


@reads
def courses(
    db: Session, *, instructor: str | None = None, student: str | None = None
) -> list[CourseRecord]:
    """Courses by name: all, those ``instructor`` teaches, or those ``student`` takes."""
    query = select(Course).order_by(Course.name, Course.slug)
    if instructor is not None:
        taught = select(CourseInstructor.course).where(CourseInstructor.username == instructor)
        query = query.where(Course.slug.in_(taught))
    if student is not None:
        taken = select(Enrollment.course).where(Enrollment.username == student)
        query = query.where(Course.slug.in_(taken))
    return [course_of(db, row) for row in db.scalars(query)]


@reads
def teaches(db: Session, username: str, slug: str) -> bool:
    """Whether ``username`` is an instructor of course ``slug``."""
    return db.get(CourseInstructor, (slug, username)) is not None


@reads
def is_instructor(db: Session, username: str) -> bool:
    """Made an instructor by an admin (GitHub-team instructors have the hub's scope)."""
    return db.get(Instructor, username) is not None


@writes
def make_instructor(db: Session, username: str, granted_by: str, now: datetime) -> bool:
    """Make ``username`` an instructor; False when they were one already."""
    if db.get(Instructor, username) is not None:
        return False
    db.add(Instructor(username=username, granted_by=granted_by, created_at=now))
    return True


# -- instructors' actions --------------------------------------------------------------------


@writes
def create_course(
    db: Session, instructor: str, rules: CourseRules, slug: str, now: datetime, join_code: bool
) -> CourseRecord:
    """A new course taught by ``instructor``; ``ValueError`` if the slug is taken."""
    if db.get(Course, slug) is not None:
        raise ValueError(f"slug: a course {slug!r} exists already; choose another slug")
    row = new_course(rules, slug, new_join_code() if join_code else None, instructor, now)
    db.add(row)
    db.add(CourseInstructor(course=slug, username=instructor))
    db.flush()
    return course_of(db, row)


@writes
def archive_course(db: Session, slug: str, now: datetime) -> CourseRecord:
    """No new servers and no new weeks for it; its records stay."""
    row = course_row(db, slug)
    if row.archived_at is None:
        row.archived_at = now
        row.join_code = None
    return course_of(db, row)


@writes
def set_max_workers(db: Session, slug: str, max_workers: int) -> CourseRecord:
    """Change how many workers each of the course's students' servers may scale out to
    (0: none); running workers are left running (the hub checks at the next scale-out)."""
    row = course_row(db, slug)
    row.max_workers = max_workers
    return course_of(db, row)


@writes
def enroll(
    db: Session, slug: str, username: str, source: str, now: datetime, *, terms: Terms
) -> bool:
    """Make ``username`` a student (their billing account opens too); True when new."""
    row = course_row(db, slug)
    if row.archived_at is not None:
        raise ValueError(f"{row.name} is archived and takes no new students")
    accounts.open_account(db, username, now, terms.trial_credit_micro)
    if db.get(Enrollment, (slug, username)) is not None:
        return False
    db.add(
        Enrollment(course=slug, username=username, source=source, fallback=False, created_at=now)
    )
    return True


def team_courses(db: Session, groups: list[str]) -> list[str]:
    """Slugs of the active courses bound to one of ``groups`` (the user's GitHub teams)."""
    return list(
        db.scalars(
            select(Course.slug).where(Course.github_team.in_(groups), Course.archived_at.is_(None))
        ).all()
    )


def try_join(db: Session, username: str, code: str, now: datetime) -> CourseRecord | str:
    """The active course with join code ``code``; else WRONG_CODE (the attempt is recorded,
    to be committed before the refusal), or TOO_MANY_ATTEMPTS after JOIN_ATTEMPTS wrong ones
    within JOIN_WINDOW."""
    recent = db.scalar(
        select(func.count())
        .select_from(JoinAttempt)
        .where(JoinAttempt.username == username, JoinAttempt.created_at > now - JOIN_WINDOW)
    )
    if recent >= JOIN_ATTEMPTS:
        return TOO_MANY_ATTEMPTS
    row = db.scalar(select(Course).where(Course.join_code == code, Course.archived_at.is_(None)))
    if row is None:
        db.add(JoinAttempt(username=username, created_at=now))
        return WRONG_CODE
    return course_of(db, row)


@writes
def set_fallback(db: Session, slug: str, username: str, fallback: bool) -> None:
    """The student's choice: their own credit pays on when course hours run out."""
    row = db.get(Enrollment, (slug, username))
    if row is None:
        raise NotFound(f"{username} is not a student of {slug!r}")
    row.fallback = fallback


@reads
def students(db: Session, slug: str) -> list[tuple[str, str, bool]]:
    """(username, how they joined, fallback) of a course's students."""
    course_row(db, slug)
    return [
        (row.username, row.source, row.fallback)
        for row in db.scalars(
            select(Enrollment).where(Enrollment.course == slug).order_by(Enrollment.username)
        )
    ]


@writes
def extra_hours(
    db: Session,
    slug: str,
    username: str,
    hours: float,
    reason: str,
    key: str,
    by: str,
    now: datetime,
    *,
    terms: Terms,
) -> Saved[TransactionRecord]:
    """Grant ``username`` extra hours of the reference option for this week only, under
    ``grant:{key}``; a replay (same caller, student and body) returns the first grant
    (False), any other use of the key is a ``Conflict``."""
    row = course_row(db, slug)
    if db.get(Enrollment, (slug, username)) is None:
        raise ValueError(f"username: {username} is not a student of {row.name}")
    memo = f"{row.name}: {hours:g} extra h this week ({reason})"
    existing = postings.find_transaction(db, f"grant:{key}")
    if existing is not None:
        # a replay repeats the first request; any other use of its key is a 409
        code = ledger.pool_code(username, "allowance", slug)
        record = postings.replayed(
            db,
            existing,
            account_id=accounts.require(db, username).id,
            created_by=by,
            same=lambda first: first.memo == memo and any(c == code for c, _ in first.postings),
        )
        return record, False
    ensure_week(db, row, username, now, terms)
    account = accounts.find(db, username)
    taught = course_of(db, row)
    book = prices.book_at(db, now, terms.price_book)[1]
    amount = cost_micro(reference_price(book, taught.allowed), 1, round(hours * 3600))
    if amount <= 0:
        raise ValueError("hours: too few to be worth a micro-credit")
    pool = allowance_pool(db, account, slug)
    tx = postings.post(
        db,
        key=f"grant:{key}",
        kind="allowance",
        account_id=account.id,
        moves=[
            (pool, amount),
            (postings.system_account(db, ledger.counter_account("allowance")), -amount),
        ],
        now=now,
        memo=memo,
        created_by=by,
    )
    return postings.transaction_record(db, tx), True


# -- weeks -----------------------------------------------------------------------------------


def allowance_pool(db: Session, account: Account, slug: str) -> LedgerAccount:
    """The student's allowance pool of course ``slug``, created on first use."""
    code = ledger.pool_code(account.username, "allowance", slug)
    return postings.ledger_account(db, code, account.id, "allowance", slug)


def ensure_week(db: Session, row: Course, username: str, now: datetime, terms: Terms) -> None:
    """Grant this week's allowance if not yet (see the module docstring)."""
    taught = course_of(db, row)
    start, _ = taught.week(now)
    key = f"allowance:{row.slug}:{username}:{start.isoformat()}"
    if postings.find_transaction(db, key) is not None:
        return
    account = accounts.find(db, username)
    if account is None:
        account, _ = accounts.open_account(db, username, now, terms.trial_credit_micro)
    crossing = db.scalars(
        select(BillingSession)
        .where(
            BillingSession.account_id == account.id,
            BillingSession.course == row.slug,
            BillingSession.ended_at.is_(None),
            BillingSession.started_at < start,
        )
        .order_by(BillingSession.id)
        .with_for_update()
    ).all()
    for session in crossing:
        target = cost_micro(
            session.price_per_hour_micro,
            session.count,
            billed_seconds(session.started_at, start),
        )
        if target > session.charged_micro:
            key_at = f"charge:{session.id}:week:{start.isoformat()}"
            charges.charge_to(db, session, target, key_at, now, terms.revenue)
    pool = allowance_pool(db, account, row.slug)
    db.refresh(pool)
    counter = postings.system_account(db, ledger.counter_account("allowance"))
    if pool.balance_micro:
        postings.post(
            db,
            key=f"allowance-expiry:{row.slug}:{username}:{start.isoformat()}",
            kind="allowance-expiry",
            account_id=account.id,
            moves=[(pool, -pool.balance_micro), (counter, pool.balance_micro)],
            now=now,
            memo=f"{row.name}: last week's hours expire",
        )
    if row.archived_at is not None:
        return
    book = prices.book_at(db, start, terms.price_book)[1]
    spent = course_spent(db, row.slug) if row.budget_cap_micro is not None else 0
    amount = week_allowance(
        reference_price(book, taught.allowed), row.weekly_seconds, row.budget_cap_micro, spent
    )
    if amount:
        postings.post(
            db,
            key=key,
            kind="allowance",
            account_id=account.id,
            moves=[(pool, amount), (counter, -amount)],
            now=now,
            memo=f"{row.name}: {row.weekly_seconds / 3600:g} h, week of {start:%Y-%m-%d}",
        )


def course_spent(db: Session, slug: str) -> int:
    """Credits a course has granted and not taken back: what it has spent or still owes."""
    total = db.scalar(
        select(func.coalesce(func.sum(Posting.amount_micro), 0))
        .join(LedgerAccount, LedgerAccount.id == Posting.ledger_account_id)
        .join(LedgerTransaction, LedgerTransaction.id == Posting.transaction_id)
        .where(
            LedgerAccount.pool == "allowance",
            LedgerAccount.course == slug,
            LedgerTransaction.kind.in_(("allowance", "allowance-expiry")),
        )
    )
    return int(total)


def running_students(db: Session) -> list[tuple[str, str]]:
    """(course, username) of every student with a running course session."""
    return [
        (slug, username)
        for slug, username in db.execute(
            select(BillingSession.course, BillingSession.username)
            .where(BillingSession.ended_at.is_(None), BillingSession.course != "")
            .distinct()
        ).all()
    ]


# -- what students and instructors see -------------------------------------------------------


@writes
def student_courses(
    db: Session, username: str, now: datetime, *, terms: Terms
) -> list[StudentCourse]:
    """The user's active courses with what is left this week (weeks granted first)."""
    account = accounts.find(db, username)
    rows = db.execute(
        select(Course, Enrollment.fallback)
        .join(Enrollment, Enrollment.course == Course.slug)
        .where(Enrollment.username == username, Course.archived_at.is_(None))
        .order_by(Course.name)
    ).all()
    result = []
    for row, fallback in rows:
        ensure_week(db, row, username, now, terms)
        taken = course_of(db, row)
        start, end = taken.week(now)
        state = accounts.state(db, account or accounts.find(db, username), now)
        book = prices.book_at(db, now, terms.price_book)[1]
        result.append(
            StudentCourse(
                course=taken,
                fallback=fallback,
                week_start=start,
                week_end=end,
                left_micro=state.course_available_at(row.slug, now),
                prices={sku: book.price(sku) or 0 for sku in taken.allowed},
            )
        )
    return result


@reads
def roster_usage(
    db: Session, slug: str, at: datetime
) -> tuple[CourseRecord, datetime, datetime, list[dict[str, Any]]]:
    """Per student of the course: GPU-seconds, sessions and cost of course sessions in the
    week containing ``at`` (:func:`~billing_service.domain.courses.roster_rows`)."""
    taught = course(db, slug)
    start, end = taught.week(at)
    names = db.scalars(select(Enrollment.username).where(Enrollment.course == slug)).all()
    sessions = [
        session_record(row)
        for row in db.scalars(
            select(BillingSession).where(
                BillingSession.course == slug,
                BillingSession.started_at < end,
                (BillingSession.ended_at.is_(None)) | (BillingSession.ended_at > start),
            )
        )
    ]
    return taught, start, end, roster_rows(names, sessions, start, end, at)
