"""Moving an account to another username on the database, in one transaction: the new name's
untouched trial account discarded, then every row keyed by the old name renamed (the account,
its pools' codes, its sessions, courses, instructor entries, join attempts and the ledger
keys that name it). The rules and refusals are pure, in :mod:`billing_service.domain.moves`.

Who did what stays as recorded (``created_by``, ``granted_by``, memos): history names people
as they were called then.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from ..domain import ledger
from ..domain.errors import Conflict
from ..domain.moves import (
    TRIAL_KEY,
    Holdings,
    Moved,
    busy_refusal,
    check_names,
    holdings_refusal,
    renamed_key,
)
from ..domain.pricing import STORAGE
from ..orm import (
    Account,
    BillingSession,
    CourseInstructor,
    Enrollment,
    Hold,
    Instructor,
    JoinAttempt,
    LedgerAccount,
    LedgerTransaction,
)
from . import accounts, ledger_writes
from .operations import writes

#: the tables whose rows name a user by a ``username`` column, besides accounts and sessions
BY_USERNAME = (Enrollment, CourseInstructor, Instructor, JoinAttempt)


def _locked(db: Session, username: str) -> Account | None:
    return db.scalar(select(Account).where(Account.username == username).with_for_update())


def _active_holds(db: Session, account: Account, now: datetime) -> int:
    return db.scalar(
        select(func.count())
        .select_from(Hold)
        .where(Hold.account_id == account.id, Hold.released_at.is_(None), Hold.expires_at > now)
    )


def holdings(db: Session, account: Account, now: datetime) -> Holdings:
    """What ``account`` holds beyond its trial credit."""
    paid = db.scalar(
        select(func.coalesce(func.sum(LedgerAccount.balance_micro), 0)).where(
            LedgerAccount.account_id == account.id, LedgerAccount.pool == "paid"
        )
    )
    trial_key = f"{TRIAL_KEY}:{account.username}"
    others = db.scalar(
        select(func.count())
        .select_from(LedgerTransaction)
        .where(
            LedgerTransaction.account_id == account.id,
            LedgerTransaction.idempotency_key != trial_key,
        )
    )
    sessions = db.scalar(
        select(func.count())
        .select_from(BillingSession)
        .where(BillingSession.account_id == account.id)
    )
    name = account.username
    return Holdings(
        paid_micro=int(paid),
        other_transactions=others,
        sessions=sessions,
        active_holds=_active_holds(db, account, now),
        student_of=db.scalars(
            select(Enrollment.course).where(Enrollment.username == name).order_by(Enrollment.course)
        ).all(),
        teaches=db.scalars(
            select(CourseInstructor.course)
            .where(CourseInstructor.username == name)
            .order_by(CourseInstructor.course)
        ).all(),
        instructor=db.get(Instructor, name) is not None,
    )


def discard(db: Session, account: Account) -> int:
    """Delete an untouched account (its trial grant, pools, released holds): the trial credit
    goes back to the counter-account it came from, as if never granted. Returns it."""
    trial = db.scalar(
        select(LedgerTransaction).where(LedgerTransaction.account_id == account.id)
    )  # holdings() allowed no other
    granted = 0
    if trial is not None:
        granted = sum(amount for _, amount in ledger_writes.erase(db, trial.id) if amount > 0)
    db.execute(delete(Hold).where(Hold.account_id == account.id))
    db.execute(delete(LedgerAccount).where(LedgerAccount.account_id == account.id))
    db.execute(delete(Account).where(Account.id == account.id))
    db.expunge(account)
    return granted


def rename(db: Session, account: Account, new: str) -> None:
    """Every row keyed by ``account``'s username now names ``new``."""
    old = account.username
    account.username = new
    for pool in db.scalars(select(LedgerAccount).where(LedgerAccount.account_id == account.id)):
        pool.code = ledger.pool_code(new, pool.pool, pool.course)
    db.execute(
        update(BillingSession).where(BillingSession.account_id == account.id).values(username=new)
    )
    for table in BY_USERNAME:
        db.execute(update(table).where(table.username == old).values(username=new))
    for tx in db.scalars(
        select(LedgerTransaction).where(LedgerTransaction.account_id == account.id)
    ):
        key = renamed_key(tx.idempotency_key, old, new)
        if key is not None:
            tx.idempotency_key = key
    db.flush()


@writes(name="move_account")
def move_account(db: Session, old: str, new: str, now: datetime) -> Moved:
    """Move ``old``'s account, with all its history, to the username ``new`` (a renamed
    login). ``new``'s own account, if it has one, must hold nothing but its trial credit,
    which is discarded, not added. ``NotFound`` for no account ``old``; ``Conflict`` naming
    what stands in the way (a server of ``old`` running or starting, what ``new`` holds);
    ``ValueError`` for the same name."""
    check_names(old, new)
    source = _locked(db, old)
    if source is None:
        raise accounts.not_found(old)
    running = db.scalars(
        select(BillingSession.sku)
        .where(
            BillingSession.account_id == source.id,
            BillingSession.ended_at.is_(None),
            BillingSession.price_class != STORAGE,
        )
        .order_by(BillingSession.id)
    ).all()
    refusal = busy_refusal(old, running, _active_holds(db, source, now))
    if refusal:
        raise Conflict(refusal)
    target = _locked(db, new)
    discarded = None
    if target is not None:
        refusal = holdings_refusal(old, new, holdings(db, target, now))
        if refusal:
            raise Conflict(refusal)
        discarded = discard(db, target)
    rename(db, source, new)
    return Moved(accounts.state(db, source, now), discarded)
