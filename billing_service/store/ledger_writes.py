"""The one writer of the ledger: every posting, and every change of a ledger account's balance,
is written here.

:func:`write` takes a batch of balanced transactions (:class:`Entry`: an idempotency key, the
``ledger_transactions`` columns, the postings). It first checks every transaction of the batch
(:func:`~billing_service.domain.ledger.check_transaction`: postings that sum to zero, none of
zero), as TigerBeetle validates every transfer of a batch, so a bad one refuses the whole
batch before anything is written. Then it writes them: on PostgreSQL in one statement
(:data:`WRITE_POSTGRESQL`), elsewhere (SQLite) with one executemany per table. Each ledger
account's balance moves by the sum of its postings in the batch, computed here from the
postings, so the two cannot disagree. Interval charges, final charges, grants, trial credit
and course weeks all come through :func:`write`; :func:`erase` is its undo, for an account
move's discarded trial grant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Required, TypedDict

from sqlalchemy import bindparam, delete, insert, select, text, update
from sqlalchemy.orm import Session

from ..domain import ledger
from ..orm import BillingSession, LedgerAccount, LedgerTransaction, Posting, UTCDateTime

SESSIONS = BillingSession.__table__
TRANSACTIONS = LedgerTransaction.__table__
POSTINGS = Posting.__table__
LEDGER_ACCOUNTS = LedgerAccount.__table__


class TransactionColumns(TypedDict, total=False):
    """What a ledger transaction says besides its key and time: ``ledger_transactions``
    columns, by name."""

    kind: Required[str]
    account_id: Required[int | None]
    session_id: str | None
    memo: str
    created_by: str


@dataclass(frozen=True, slots=True)
class Entry:
    """One balanced transaction to write."""

    #: its idempotency key (unique: a second write of it fails, and the store's retry then
    #: finds the first)
    key: str
    #: what it says
    columns: TransactionColumns
    #: its postings, ``(ledger account id, signed amount)`` pairs, in the order they are kept
    postings: tuple[tuple[int, int], ...]


#: a batch of transactions on PostgreSQL, in one statement: the transactions, their postings
#: (joined to the new transactions by key, in the order given), the balances, the sessions'
#: charged_micro (none: empty arrays), and the new transactions' ids in the batch's order.
#: Its text never changes with the batch (arrays, not lists of rows), so it is parsed and
#: planned once per connection (psycopg prepares it), and it is one round trip.
WRITE_POSTGRESQL = text(
    """
WITH tx AS (
    INSERT INTO ledger_transactions
        (idempotency_key, kind, account_id, session_id, memo, created_by, created_at)
    SELECT t.key, t.kind, t.owner, t.session, t.memo, t.creator, :now
    FROM unnest(CAST(:keys AS text[]), CAST(:kinds AS text[]), CAST(:owners AS integer[]),
                CAST(:sessions AS text[]), CAST(:memos AS text[]), CAST(:creators AS text[]))
         WITH ORDINALITY AS t(key, kind, owner, session, memo, creator, n)
    ORDER BY t.n
    RETURNING id, idempotency_key
), posted AS (
    INSERT INTO ledger_postings (transaction_id, ledger_account_id, amount_micro)
    SELECT tx.id, p.account, p.amount
    FROM unnest(CAST(:posting_keys AS text[]), CAST(:posting_accounts AS integer[]),
                CAST(:posting_amounts AS bigint[])) WITH ORDINALITY AS p(key, account, amount, n)
    JOIN tx ON tx.idempotency_key = p.key
    ORDER BY p.n
), moved AS (
    UPDATE ledger_accounts SET balance_micro = ledger_accounts.balance_micro + d.delta
    FROM unnest(CAST(:moved_ids AS integer[]), CAST(:moved_deltas AS bigint[])) AS d(id, delta)
    WHERE ledger_accounts.id = d.id
), charged AS (
    UPDATE sessions SET charged_micro = c.charged
    FROM unnest(CAST(:charged_ids AS text[]), CAST(:charged AS bigint[])) AS c(id, charged)
    WHERE sessions.id = c.id
)
SELECT tx.id
FROM tx JOIN unnest(CAST(:keys AS text[])) WITH ORDINALITY AS k(key, n)
    ON k.key = tx.idempotency_key
ORDER BY k.n
"""
).bindparams(bindparam("now", type_=UTCDateTime))


def write(
    db: Session,
    entries: Sequence[Entry],
    now: datetime,
    charged: Mapping[str, int] | None = None,
) -> list[int]:
    """Write ``entries`` as transactions created at ``now``, and set each session's
    ``charged_micro`` in ``charged`` (session id -> new value) with them; returns the new
    transactions' ids, in the order of ``entries``.

    ``UnbalancedTransaction`` (nothing written) when any entry's postings are empty, hold a
    zero, or do not sum to zero. Rows the ORM session still holds (a ledger account made in
    this transaction) are flushed first."""
    for entry in entries:
        ledger.check_transaction(entry.key, entry.postings)
    if not entries:
        return []
    charged = charged or {}
    moved = ledger.balance_moves(posting for entry in entries for posting in entry.postings)
    db.flush()
    if db.get_bind().dialect.name == "postgresql":
        return _write_postgresql(db, entries, now, moved, charged)
    return _write_executemany(db, entries, now, moved, charged)


def _write_postgresql(
    db: Session,
    entries: Sequence[Entry],
    now: datetime,
    moved: dict[int, int],
    charged: Mapping[str, int],
) -> list[int]:
    """:data:`WRITE_POSTGRESQL`, one round trip."""
    postings = [(entry.key, *posting) for entry in entries for posting in entry.postings]
    columns = [entry.columns for entry in entries]
    ids = db.execute(
        WRITE_POSTGRESQL,
        {
            "now": now,
            "keys": [entry.key for entry in entries],
            "kinds": [c["kind"] for c in columns],
            "owners": [c["account_id"] for c in columns],
            "sessions": [c.get("session_id") for c in columns],
            "memos": [c.get("memo", "") for c in columns],
            "creators": [c.get("created_by", "") for c in columns],
            "posting_keys": [key for key, _, _ in postings],
            "posting_accounts": [account for _, account, _ in postings],
            "posting_amounts": [amount for _, _, amount in postings],
            "moved_ids": list(moved),
            "moved_deltas": list(moved.values()),
            "charged_ids": list(charged),
            "charged": list(charged.values()),
        },
    ).scalars()
    return list(ids)


def _write_executemany(
    db: Session,
    entries: Sequence[Entry],
    now: datetime,
    moved: dict[int, int],
    charged: Mapping[str, int],
) -> list[int]:
    """One executemany per table and kind of write (SQLite)."""
    rows = [
        {
            "idempotency_key": entry.key,
            "created_at": now,
            "session_id": None,
            "memo": "",
            "created_by": "",
            **entry.columns,
        }
        for entry in entries
    ]
    ids = list(
        db.execute(
            insert(TRANSACTIONS).returning(TRANSACTIONS.c.id, sort_by_parameter_order=True), rows
        ).scalars()
    )
    db.execute(
        insert(POSTINGS),
        [
            {"transaction_id": tx_id, "ledger_account_id": account, "amount_micro": amount}
            for tx_id, entry in zip(ids, entries, strict=True)
            for account, amount in entry.postings
        ],
    )
    _move_balances(db, moved)
    if charged:
        db.execute(
            update(SESSIONS)
            .where(SESSIONS.c.id == bindparam("session"))
            .values(charged_micro=bindparam("charged")),
            [{"session": session, "charged": target} for session, target in charged.items()],
        )
    return ids


def _move_balances(db: Session, moved: dict[int, int]) -> None:
    if moved:
        db.execute(
            update(LEDGER_ACCOUNTS)
            .where(LEDGER_ACCOUNTS.c.id == bindparam("account"))
            .values(balance_micro=LEDGER_ACCOUNTS.c.balance_micro + bindparam("delta")),
            [{"account": account, "delta": delta} for account, delta in moved.items()],
        )


def erase(db: Session, transaction_id: int) -> list[tuple[int, int]]:
    """Delete transaction ``transaction_id`` with its postings, every balance moved back by
    exactly what they moved it, as if it had never been written (an account move discards
    the new name's untouched trial grant this way). Returns the postings it had."""
    postings = [
        (account, amount)
        for account, amount in db.execute(
            select(POSTINGS.c.ledger_account_id, POSTINGS.c.amount_micro)
            .where(POSTINGS.c.transaction_id == transaction_id)
            .order_by(POSTINGS.c.id)
        )
    ]
    moved = ledger.balance_moves(postings)
    db.flush()
    _move_balances(db, {account: -delta for account, delta in moved.items()})
    db.execute(delete(POSTINGS).where(POSTINGS.c.transaction_id == transaction_id))
    db.execute(delete(TRANSACTIONS).where(TRANSACTIONS.c.id == transaction_id))
    return postings
