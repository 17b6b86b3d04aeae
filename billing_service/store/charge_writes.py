"""Writing a batch of interval charges, once :func:`.charges.charge_batch` has locked the rows
and computed the splits: on PostgreSQL in one statement, elsewhere (SQLite) with one
executemany per table and kind of write. Both write the same rows: a :class:`ChargeBatch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, insert, text, update
from sqlalchemy.orm import Session

from ..domain import ledger
from ..orm import BillingSession, LedgerAccount, LedgerTransaction, Posting, UTCDateTime

SESSIONS = BillingSession.__table__
TRANSACTIONS = LedgerTransaction.__table__
POSTINGS = Posting.__table__
LEDGER_ACCOUNTS = LedgerAccount.__table__


@dataclass(frozen=True)
class ChargeBatch:
    """What a batch of interval charges writes."""

    #: the new charge transactions (``ledger_transactions`` columns)
    tx_rows: list[dict]
    #: their postings, ``(ledger account id, signed amount)`` pairs, one list per transaction
    splits: list[list[tuple[int, int]]]
    #: how much each ledger account's balance moves
    moved: dict[int, int]
    #: each session's new ``charged_micro``
    charged: dict[str, int]


#: a batch of interval charges on PostgreSQL, in one statement: the transactions, their postings
#: (joined to the new transactions by key, in the order given), the balances and the sessions'
#: charged_micro. Its text never changes with the batch (arrays, not lists of rows), so it is
#: parsed and planned once per connection (psycopg prepares it), and it is one round trip.
CHARGES_POSTGRESQL = text(
    """
WITH tx AS (
    INSERT INTO ledger_transactions
        (idempotency_key, kind, account_id, session_id, memo, created_by, created_at)
    SELECT t.key, :kind, t.owner, t.session, t.memo, '', :now
    FROM unnest(CAST(:keys AS text[]), CAST(:owners AS integer[]),
                CAST(:sessions AS text[]), CAST(:memos AS text[])) AS t(key, owner, session, memo)
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
)
UPDATE sessions SET charged_micro = c.charged
FROM unnest(CAST(:charged_ids AS text[]), CAST(:charged AS bigint[])) AS c(id, charged)
WHERE sessions.id = c.id
"""
).bindparams(bindparam("now", type_=UTCDateTime))


def write_charges_postgresql(db: Session, batch: ChargeBatch, now: datetime) -> None:
    """Write a batch of charges on PostgreSQL: ``CHARGES_POSTGRESQL``, one round trip."""
    tx_rows, moved, charged = batch.tx_rows, batch.moved, batch.charged
    postings = [
        (tx["idempotency_key"], account, amount)
        for tx, moves in zip(tx_rows, batch.splits, strict=True)
        for account, amount in moves
    ]
    db.execute(
        CHARGES_POSTGRESQL,
        {
            "kind": ledger.CHARGE,
            "now": now,
            "keys": [tx["idempotency_key"] for tx in tx_rows],
            "owners": [tx["account_id"] for tx in tx_rows],
            "sessions": [tx["session_id"] for tx in tx_rows],
            "memos": [tx["memo"] for tx in tx_rows],
            "posting_keys": [key for key, _, _ in postings],
            "posting_accounts": [account for _, account, _ in postings],
            "posting_amounts": [amount for _, _, amount in postings],
            "moved_ids": list(moved),
            "moved_deltas": list(moved.values()),
            "charged_ids": list(charged),
            "charged": list(charged.values()),
        },
    )


def write_charges(db: Session, batch: ChargeBatch) -> None:
    """Write a batch of charges elsewhere (SQLite): one executemany per table and write."""
    ids = db.execute(
        insert(TRANSACTIONS).returning(TRANSACTIONS.c.id, sort_by_parameter_order=True),
        batch.tx_rows,
    ).scalars()
    db.execute(
        insert(POSTINGS),
        [
            {"transaction_id": tx_id, "ledger_account_id": account, "amount_micro": amount}
            for tx_id, moves in zip(ids, batch.splits, strict=True)
            for account, amount in moves
        ],
    )
    db.execute(
        update(LEDGER_ACCOUNTS)
        .where(LEDGER_ACCOUNTS.c.id == bindparam("account"))
        .values(balance_micro=LEDGER_ACCOUNTS.c.balance_micro + bindparam("delta")),
        [{"account": account, "delta": delta} for account, delta in batch.moved.items()],
    )
    db.execute(
        update(SESSIONS)
        .where(SESSIONS.c.id == bindparam("session"))
        .values(charged_micro=bindparam("charged")),
        [{"session": session, "charged": target} for session, target in batch.charged.items()],
    )
