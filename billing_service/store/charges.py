"""Charges on the database: bringing a session's charges to a target (its stop, a week's
boundary), and the interval charges of open sessions in batches.

While a session runs, interval charges bring what it has been charged up to the cost of its
first ``k × interval`` seconds, under the key ``charge:{session}:{k}``; the stop posts
``charge:{session}:final`` for the rest (or credits back what interval charges took beyond the
final cost, when the stop time arrives late). A replay of any key changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import func, insert, select, text
from sqlalchemy.orm import Session

from ..domain import ledger
from ..domain.money import billed_seconds, cost_micro
from ..orm import Account, BillingSession, LedgerAccount, LedgerTransaction, Posting
from . import ledger_writes, postings

T = TypeVar("T")

SESSIONS = BillingSession.__table__
LEDGER_ACCOUNTS = LedgerAccount.__table__
#: what a batch reads of each open session
CHARGE_COLUMNS = (
    SESSIONS.c.id,
    SESSIONS.c.account_id,
    SESSIONS.c.username,
    SESSIONS.c.server_name,
    SESSIONS.c.sku,
    SESSIONS.c.count,
    SESSIONS.c.price_per_hour_micro,
    SESSIONS.c.started_at,
    SESSIONS.c.charged_micro,
    SESSIONS.c.course,
    SESSIONS.c.fallback,
    SESSIONS.c.worker,
)


def _postgresql(db: Session) -> bool:
    return db.get_bind().dialect.name == "postgresql"


def charge_columns(row: Any) -> ledger_writes.TransactionColumns:
    """What a charge transaction of session ``row`` says: its owner, the session, and whose
    server (or worker of it) it is and what it holds."""
    worker = f"#{row.worker}" if row.worker else ""
    return {
        "kind": ledger.CHARGE,
        "account_id": row.account_id,
        "session_id": row.id,
        "memo": f"{row.username}/{row.server_name}{worker}: {row.count} x {row.sku}",
    }


def charge_to(
    db: Session,
    row: BillingSession,
    target: int,
    key: str,
    now: datetime,
    revenue: postings.RevenueShards,
) -> int:
    """Bring ``row``'s charges to ``target`` under ``key``, from its pools in funding order
    (back to them, newest takings first, when ``target`` is lower); returns the amount posted
    (0: nothing)."""
    amount = target - row.charged_micro
    if amount == 0:
        return 0
    account = db.get(Account, row.account_id)
    pools = postings.funding_pools(db, account, row.course, row.fallback)
    if amount > 0:
        parts = ledger.split_charge(amount, [p.balance_micro for p in pools])
    else:
        taken = dict(
            db.execute(
                select(Posting.ledger_account_id, func.sum(Posting.amount_micro))
                .join(LedgerTransaction, LedgerTransaction.id == Posting.transaction_id)
                .where(
                    LedgerTransaction.session_id == row.id,
                    LedgerTransaction.kind == ledger.CHARGE,
                )
                .group_by(Posting.ledger_account_id)
            ).all()
        )
        back = ledger.split_refund(-amount, [-int(taken.get(p.id) or 0) for p in pools])
        parts = [-part for part in back]
    shard = db.get(LedgerAccount, revenue.ids(db)[ledger.revenue_shard(row.id)])
    moves = [(pool, -part) for pool, part in zip(pools, parts, strict=True)]
    postings.post(db, key=key, moves=[*moves, (shard, amount)], now=now, **charge_columns(row))
    row.charged_micro = target
    return amount


def charge_pass(
    write: Callable[[Callable[[Session], T]], T],
    revenue: postings.RevenueShards,
    now: datetime,
    interval_seconds: int,
    batch_size: int,
    shard: int,
) -> int:
    """Charge open sessions in batches of ``batch_size``, in id order, each batch one
    ``write`` (the store's retrying transaction), until fewer than a batch are left that
    nobody else holds; credits revenue shard ``shard``. Returns the charges posted."""
    posted = 0
    after = ""
    while True:

        def work(db: Session, after: str = after) -> tuple[int, str, int]:
            if _postgresql(db):
                # an interval charge lost in a database crash is posted again by the next
                # pass (same key, cumulative amount, charged_micro lost with it), so it
                # need not wait for the disk; stops and grants keep synchronous commits
                db.execute(text("SET LOCAL synchronous_commit TO OFF"))
            rows = db.execute(
                select(*CHARGE_COLUMNS)
                .where(SESSIONS.c.ended_at.is_(None), SESSIONS.c.id > after)
                .order_by(SESSIONS.c.id)
                .limit(batch_size)
                .with_for_update(skip_locked=True)
            ).all()
            last = rows[-1].id if rows else after
            charged = charge_batch(db, rows, now, interval_seconds, revenue, shard)
            return charged, last, len(rows)

        count, after, seen = write(work)
        posted += count
        if seen < batch_size:
            return posted


def charge_batch(
    db: Session,
    rows: Sequence[Any],
    now: datetime,
    interval: int,
    revenue: postings.RevenueShards,
    shard: int,
) -> int:
    """Interval charges of ``rows`` in bulk, into revenue shard ``shard``: the pools
    are read (and locked) in one query, the splits computed here, and everything is written
    at once by :func:`.ledger_writes.write` (on PostgreSQL in one statement), with the
    sessions' new ``charged_micro``."""
    due: list[tuple[Any, int, int]] = []
    for row in rows:
        if now <= row.started_at:
            continue
        k = billed_seconds(row.started_at, now) // interval
        target = cost_micro(row.price_per_hour_micro, row.count, k * interval)
        if k > 0 and target > row.charged_micro:
            due.append((row, k, target))
    if not due:
        return 0
    owners = {row.account_id for row, _, _ in due}
    pools = locked_pools(db, owners, {(r.account_id, r.username, r.course) for r, _, _ in due})
    revenue_id = revenue.ids(db)[shard]
    balances = {code: balance for code, (_, balance) in pools.items()}
    entries: list[ledger_writes.Entry] = []
    for row, k, target in due:
        amount = target - row.charged_micro
        order = [
            ledger.pool_code(row.username, pool, course)
            for pool, course in ledger.funding_order(row.course, row.fallback)
        ]
        parts = ledger.split_charge(amount, [balances[code] for code in order])
        moves = []
        for code, part in zip(order, parts, strict=True):
            if part:
                balances[code] -= part
                moves.append((pools[code][0], -part))
        entries.append(
            ledger_writes.Entry(
                f"charge:{row.id}:{k}", charge_columns(row), (*moves, (revenue_id, amount))
            )
        )
    ledger_writes.write(db, entries, now, {row.id: target for row, _, target in due})
    return len(due)


def locked_pools(
    db: Session, owners: set[int], users: set[tuple[int, str, str]]
) -> dict[str, tuple[int, int]]:
    """``code -> (id, balance)`` of the funding pools of ``users`` ((account id, username,
    course) triples), created where missing, locked for this transaction."""

    def load() -> dict[str, tuple[int, int]]:
        rows = db.execute(
            select(LEDGER_ACCOUNTS.c.code, LEDGER_ACCOUNTS.c.id, LEDGER_ACCOUNTS.c.balance_micro)
            .where(LEDGER_ACCOUNTS.c.account_id.in_(owners))
            .order_by(LEDGER_ACCOUNTS.c.id)
            .with_for_update()
        )
        return {code: (pool_id, balance) for code, pool_id, balance in rows}

    pools = load()
    missing = {}
    for owner, username, course in users:
        for pool, pool_course in ledger.funding_order(course):
            code = ledger.pool_code(username, pool, pool_course)
            if code not in pools:
                missing[code] = {
                    "code": code,
                    "account_id": owner,
                    "pool": pool,
                    "course": pool_course,
                    "balance_micro": 0,
                }
    if not missing:
        return pools
    db.execute(insert(LEDGER_ACCOUNTS), list(missing.values()))
    return load()
