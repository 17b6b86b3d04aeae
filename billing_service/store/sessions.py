"""Sessions on the database: a server's (or its scale-out worker's, or a data disk's) start,
priced by the book in force then, and its stop, settled with the final charge; what is open
and was seen running.

Storage sessions (price class "storage", sku "disk", count = GB) are data disks, metered from
creation to deletion and charged exactly like servers, from the user's own credit (trial, then
paid; never a course's allowance). They take no admission or hold, and nothing here or in
enforcement stops them: their cost drains the credit and may take it below zero, and then new
servers are refused until credit is added.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from ..domain import ledger
from ..domain.errors import NotFound
from ..domain.money import billed_seconds, cost_micro
from ..domain.pricing import ON_DEMAND, STORAGE, check_price_class, check_storage_session
from ..domain.records import Saved, SessionRecord
from ..orm import BillingSession, Course, Enrollment, LedgerAccount, LedgerTransaction, Posting
from . import accounts, charges, courses, prices
from .admission import hold_started
from .operations import reads, writes
from .rows import session_record
from .terms import Terms

#: one pool's part in paying for a session: (pool, course, course name, micro-credits)
Paid = tuple[str, str, str, int]


@writes
def start_session(
    db: Session,
    session_id: str,
    username: str,
    server_name: str,
    sku: str,
    count: int,
    started_at: datetime,
    now: datetime,
    price_class: str = ON_DEMAND,
    *,
    hold_id: str | None = None,
    course: str = "",
    environment: str = "",
    worker: str = "",
    terms: Terms,
) -> Saved[SessionRecord]:
    """Record a started server, priced by the book in force when it started; the same id
    returns the first record (False). ``hold_id`` (its admission's hold) is released as
    started. ``ValueError`` for a request that does not fit its price class, ``UnknownSku``
    for a SKU without a price then.

    A data disk's storage session (sku "disk", price class "storage", count = GB) is named
    "disk:NAME" and takes neither a hold nor a course (``ValueError`` otherwise).
    ``environment`` is what the server runs, as the spawner names it; ``worker`` the
    scale-out worker (``wK``, checked by the handler) of ``server_name`` it meters, "" for
    the server itself: a server and each of its workers have an open session of their own."""
    check_price_class(sku, price_class)
    if price_class == STORAGE:
        check_storage_session(server_name, hold_id, course)
        if worker:
            raise ValueError("worker: a data disk's storage session has no workers")
    existing = db.get(BillingSession, session_id)
    if existing is not None:
        # another source (the pod meter) opened it first: the spawner's hold is done
        hold_started(db, hold_id, existing.account_id, session_id, now)
        return session_record(existing), False
    version, book = prices.book_at(db, started_at, terms.price_book)
    price = book.require(sku, price_class)
    account, _ = accounts.open_account(db, username, now, terms.trial_credit_micro)
    fallback = False
    if course:
        enrollment = db.get(Enrollment, (course, username))
        if enrollment is None:
            raise ValueError(f"course: {username} is not a student of {course!r}")
        fallback = enrollment.fallback
        courses.ensure_week(db, db.get(Course, course), username, now, terms)
    row = BillingSession(
        fallback=fallback,
        id=session_id,
        account_id=account.id,
        username=username,
        server_name=server_name,
        sku=sku,
        count=count,
        price_per_hour_micro=price,
        price_class=price_class,
        started_at=started_at,
        charged_micro=0,
        course=course,
        price_book_version=version,
        environment=environment,
        worker=worker,
    )
    db.add(row)
    db.flush()
    hold_started(db, hold_id, account.id, session_id, now)
    return session_record(row), True


@writes
def stop_session(
    db: Session, session_id: str, ended_at: datetime, now: datetime, *, terms: Terms
) -> SessionRecord:
    """Settle a session: final seconds and cost, the final charge. Replays change nothing."""
    # the row lock makes a concurrent stop (or charge) wait, then see this one's result
    row = db.get(BillingSession, session_id, with_for_update=True)
    if row is None:
        raise NotFound(f"No session {session_id!r}; start it with POST api/sessions")
    if row.ended_at is not None:
        return session_record(row)
    if ended_at < row.started_at:
        raise ValueError(
            f"ended_at: {ended_at.isoformat()} is before the session started "
            f"({row.started_at.isoformat()})"
        )
    if row.course:  # a new week first: the part before its start is last week's
        taken = db.get(Course, row.course)
        if taken is not None:
            courses.ensure_week(db, taken, row.username, max(ended_at, row.started_at), terms)
    seconds = billed_seconds(row.started_at, ended_at)
    cost = cost_micro(row.price_per_hour_micro, row.count, seconds)
    row.ended_at = ended_at
    row.billed_seconds = seconds
    row.cost_micro = cost
    charges.charge_to(db, row, cost, f"charge:{row.id}:final", now, terms.revenue)
    db.flush()
    return session_record(row)


@reads
def running_count(db: Session) -> int:
    """How many sessions are open."""
    return db.scalar(
        select(func.count()).select_from(BillingSession).where(BillingSession.ended_at.is_(None))
    )


def mark_seen(db: Session, session_ids: list[str], at: datetime) -> None:
    """Record that the servers of ``session_ids`` were seen running at ``at``."""
    db.execute(
        update(BillingSession)
        .where(BillingSession.id.in_(session_ids), BillingSession.ended_at.is_(None))
        .values(last_seen_at=at)
    )


@reads
def sessions(
    db: Session,
    username: str | None,
    state: str | None = None,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[SessionRecord]:
    """Sessions newest first; ``username`` None means everyone, ``state`` running|ended;
    ``since``/``until`` keep those that overlap that time range."""
    query = select(BillingSession)
    if username is not None:
        query = query.where(BillingSession.username == username)
    if state == "running":
        query = query.where(BillingSession.ended_at.is_(None))
    elif state == "ended":
        query = query.where(BillingSession.ended_at.is_not(None))
    if since is not None:
        query = query.where((BillingSession.ended_at.is_(None)) | (BillingSession.ended_at > since))
    if until is not None:
        query = query.where(BillingSession.started_at < until)
    query = query.order_by(BillingSession.started_at.desc(), BillingSession.id.desc())
    return [session_record(row) for row in db.scalars(query)]


@reads
def session_funding(db: Session, session_ids: list[str]) -> dict[str, tuple[Paid, ...]]:
    """What paid for each session so far: (pool, course, course name, micro-credits) per
    pool its charges took from ("trial", "paid", or "allowance" of a course), in funding
    order; a session nothing was charged for yet has none."""
    if not session_ids:
        return {}
    taken = func.sum(Posting.amount_micro)
    rows = db.execute(
        select(LedgerTransaction.session_id, LedgerAccount.code, Course.name, taken)
        .join(Posting, Posting.transaction_id == LedgerTransaction.id)
        .join(LedgerAccount, LedgerAccount.id == Posting.ledger_account_id)
        .outerjoin(Course, (LedgerAccount.course == Course.slug) & (LedgerAccount.course != ""))
        .where(
            LedgerTransaction.session_id.in_(session_ids),
            LedgerTransaction.kind == ledger.CHARGE,
            LedgerAccount.account_id.is_not(None),
        )
        .group_by(LedgerTransaction.session_id, LedgerAccount.code, Course.name)
    ).all()
    order = {"allowance": 0, "trial": 1, "paid": 2}
    paid: dict[str, list[Paid]] = {}
    for session_id, code, name, amount in rows:
        pool, course = ledger.pool_name(code)
        if -amount:
            paid.setdefault(session_id, []).append((pool, course, name or course, -int(amount)))
    return {k: tuple(sorted(v, key=lambda p: (order.get(p[0], 3), p[1]))) for k, v in paid.items()}
