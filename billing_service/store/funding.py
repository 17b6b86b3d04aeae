"""Funding on the database: grants (top-ups, refunds, adjustments, trial credit, course
allowances) into a user's pools, and the user's ledger."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..domain import ledger
from ..domain.records import Saved, TransactionRecord
from ..orm import LedgerTransaction
from . import accounts, postings
from .operations import reads, writes


@writes
def grant(
    db: Session,
    username: str,
    kind: str,
    amount_micro: int,
    reason: str,
    idempotency_key: str,
    now: datetime,
    *,
    created_by: str = "",
    course: str = "",
) -> Saved[TransactionRecord]:
    """Fund (or, for an adjustment, debit) an account under ``grant:{idempotency_key}``; a
    replay (same caller, account and body) returns the first one (False), any other use of
    the key is a ``Conflict``. ``kind`` is one of ``ledger.FUNDING_KINDS``; only
    adjustments may be negative, and only allowances name a course (``ValueError`` for a
    grant ``ledger.check_funding`` refuses, ``NotFound`` for no account)."""
    ledger.check_funding(kind, amount_micro, course)
    key = f"grant:{idempotency_key}"
    account = accounts.require(db, username)
    pool_name = ledger.funding_pool(kind)
    code = ledger.pool_code(username, pool_name, course)
    existing = postings.find_transaction(db, key)
    if existing is not None:
        # a replay repeats the first request; any other use of its key is a 409
        def same(first: TransactionRecord) -> bool:
            return (first.kind, first.amount_micro, first.memo) == (
                kind,
                amount_micro,
                reason,
            ) and any(c == code for c, _ in first.postings)

        record = postings.replayed(
            db, existing, account_id=account.id, created_by=created_by, same=same
        )
        return record, False
    pool = postings.ledger_account(db, code, account.id, pool_name, course)
    counter = postings.system_account(db, ledger.counter_account(kind))
    tx = postings.post(
        db,
        key=key,
        kind=kind,
        account_id=account.id,
        moves=[(pool, amount_micro), (counter, -amount_micro)],
        now=now,
        memo=reason,
        created_by=created_by,
    )
    return postings.transaction_record(db, tx), True


@reads
def transactions(db: Session, username: str) -> list[TransactionRecord]:
    """The ledger of ``username``, oldest first; ``NotFound`` for no account."""
    account = accounts.require(db, username)
    rows = db.scalars(
        select(LedgerTransaction)
        .where(LedgerTransaction.account_id == account.id)
        .order_by(LedgerTransaction.id)
    )
    return [postings.transaction_record(db, row) for row in rows]
