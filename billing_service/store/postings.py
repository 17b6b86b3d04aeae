"""The ledger on the database: ledger accounts, balanced transactions and their postings, the
revenue shards. The codes, kinds and splits are pure, in :mod:`billing_service.domain.ledger`;
every transaction is written by :mod:`.ledger_writes`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Unpack

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gputap_common.bodies import shown
from gputap_common.money import format_credits

from ..domain import ledger
from ..domain.errors import Conflict
from ..domain.records import TransactionRecord
from ..orm import Account, LedgerAccount, LedgerTransaction, Posting
from .ledger_writes import Entry, TransactionColumns, write
from .operations import reads

LEDGER_ACCOUNTS = LedgerAccount.__table__


def ledger_account(
    db: Session, code: str, account_id: int | None, pool: str, course: str = ""
) -> LedgerAccount:
    """The ledger account ``code``, created (balance 0) on first use."""
    row = db.scalar(select(LedgerAccount).where(LedgerAccount.code == code))
    if row is None:
        row = LedgerAccount(
            code=code, account_id=account_id, pool=pool, course=course, balance_micro=0
        )
        db.add(row)
        db.flush()
    return row


def system_account(db: Session, code: str) -> LedgerAccount:
    """A system counter-account (``system:...``), created on first use."""
    return ledger_account(db, code, None, "system")


class RevenueShards:
    """The ids of the revenue shards (``ledger.REVENUE_CODES``), in shard order, kept once
    all of them exist."""

    def __init__(self) -> None:
        self._ids: tuple[int, ...] | None = None

    def ids(self, db: Session) -> tuple[int, ...]:
        """The shards are made by the migration; one missing is created here. The ids are
        kept only once all of them existed, so an id is never kept from a transaction that
        rolled back."""
        if self._ids is not None:
            return self._ids
        found = dict(
            db.execute(
                select(LEDGER_ACCOUNTS.c.code, LEDGER_ACCOUNTS.c.id).where(
                    LEDGER_ACCOUNTS.c.code.in_(ledger.REVENUE_CODES)
                )
            ).all()
        )
        ids = tuple(found.get(code) or system_account(db, code).id for code in ledger.REVENUE_CODES)
        if len(found) == len(ledger.REVENUE_CODES):
            self._ids = ids
        return ids


@reads
def revenue_micro(db: Session) -> int:
    """All charges so far, net of what final charges gave back: the sum of the shards."""
    total = db.scalar(
        select(func.coalesce(func.sum(LEDGER_ACCOUNTS.c.balance_micro), 0)).where(
            LEDGER_ACCOUNTS.c.code.in_(ledger.REVENUE_CODES)
        )
    )
    return int(total)  # PostgreSQL sums BIGINT as NUMERIC


def funding_pools(
    db: Session, account: Account, course: str, fallback: bool = True
) -> list[LedgerAccount]:
    """The account's pools in funding order, created where missing, locked for this
    transaction."""
    codes = []
    for pool, pool_course in ledger.funding_order(course, fallback):
        code = ledger.pool_code(account.username, pool, pool_course)
        ledger_account(db, code, account.id, pool, pool_course)
        codes.append(code)
    locked = db.scalars(
        select(LedgerAccount)
        .where(LedgerAccount.code.in_(codes))
        .order_by(LedgerAccount.id)
        .with_for_update()
    ).all()
    by_code = {row.code: row for row in locked}
    return [by_code[code] for code in codes]


def find_transaction(db: Session, key: str) -> LedgerTransaction | None:
    """The transaction posted under idempotency key ``key``, if any."""
    return db.scalar(select(LedgerTransaction).where(LedgerTransaction.idempotency_key == key))


#: the answer to a key another caller, or the same caller for another account, used first:
#: it says nothing of that request (docs/security.md, "Idempotency keys")
KEY_TAKEN = (
    "idempotency_key: this key was already used for another request; send a new key "
    "(a key is yours for one request: same caller, same account, same body)"
)


def replayed(
    db: Session,
    tx: LedgerTransaction,
    *,
    account_id: int,
    created_by: str,
    same: Callable[[TransactionRecord], bool],
) -> TransactionRecord:
    """The first transaction under a key, when this request is its replay: the same caller
    (``created_by``) for the same account, and ``same`` body. ``Conflict`` otherwise, never
    showing the first one: a key reused by someone else answers nothing of theirs."""
    if tx.account_id != account_id or tx.created_by != created_by:
        raise Conflict(KEY_TAKEN)
    record = transaction_record(db, tx)
    if not same(record):
        raise Conflict(
            "idempotency_key: the same key came before with a different body "
            f"(it granted {format_credits(record.amount_micro)}: {shown(record.memo)}); "
            "a replay must repeat the first request exactly. Send a new key for a new grant"
        )
    return record


def post(
    db: Session,
    *,
    key: str,
    moves: Sequence[tuple[LedgerAccount, int]],
    now: datetime,
    **columns: Unpack[TransactionColumns],
) -> LedgerTransaction:
    """One balanced transaction under idempotency key ``key``, saying ``columns``, written by
    :func:`.ledger_writes.write` (moves of zero are left out); the accounts' ORM objects then
    hold their new balances."""
    entry = Entry(key, columns, tuple((account.id, amount) for account, amount in moves if amount))
    [tx_id] = write(db, [entry], now)
    for account in {account.id: account for account, amount in moves if amount}.values():
        db.refresh(account, ["balance_micro"])
    return db.get_one(LedgerTransaction, tx_id)


def transaction_record(db: Session, tx: LedgerTransaction) -> TransactionRecord:
    """``tx`` with its postings, as its owner sees it (the net to their pools)."""
    rows = db.execute(
        select(LedgerAccount.code, LedgerAccount.account_id, Posting.amount_micro)
        .join(LedgerAccount, LedgerAccount.id == Posting.ledger_account_id)
        .where(Posting.transaction_id == tx.id)
        .order_by(Posting.id)
    ).all()
    username = None
    if tx.account_id is not None:
        username = db.scalar(select(Account.username).where(Account.id == tx.account_id))
    net = sum(amount for _, owner, amount in rows if owner is not None)
    return TransactionRecord(
        id=tx.id,
        username=username,
        kind=tx.kind,
        amount_micro=net,
        postings=tuple((code, amount) for code, _, amount in rows),
        session_id=tx.session_id,
        idempotency_key=tx.idempotency_key,
        memo=tx.memo,
        created_by=tx.created_by,
        created_at=tx.created_at,
    )
