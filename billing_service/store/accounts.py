"""Accounts on the database: opening one (with its pools and trial credit), and reading the
state of one or many (pools, open sessions, active holds) in a few queries."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..domain import ledger
from ..domain.errors import NotFound
from ..domain.records import AccountState, Saved, SessionRecord
from ..orm import Account, BillingSession, Hold, LedgerAccount
from . import postings
from .operations import reads, writes
from .rows import session_record
from .terms import Terms

ACCOUNTS = Account.__table__
SESSIONS = BillingSession.__table__


def not_found(username: str) -> NotFound:
    """The refusal for a user without an account: it opens at first login."""
    return NotFound(f"No billing account for {username!r}; it is opened at first login")


def find(db: Session, username: str) -> Account | None:
    """The account of ``username``, None when it was never opened."""
    return db.scalar(select(Account).where(Account.username == username))


def require(db: Session, username: str) -> Account:
    """The account of ``username``; ``NotFound`` when it was never opened."""
    account = find(db, username)
    if account is None:
        raise not_found(username)
    return account


def open_account(
    db: Session, username: str, now: datetime, trial_credit_micro: int
) -> tuple[Account, bool]:
    """The account of ``username``, opened now with ``trial_credit_micro`` if it was not;
    True when it was created."""
    account = find(db, username)
    if account is not None:
        return account, False
    account = Account(username=username, created_at=now)
    db.add(account)
    db.flush()
    # both pools at once: charges then never create them one at a time
    pool = postings.ledger_account(db, ledger.pool_code(username, "trial"), account.id, "trial")
    postings.ledger_account(db, ledger.pool_code(username, "paid"), account.id, "paid")
    if trial_credit_micro:
        counter = postings.system_account(db, ledger.counter_account("trial"))
        postings.post(
            db,
            key=f"trial:{username}",
            kind="trial",
            account_id=account.id,
            moves=[(pool, trial_credit_micro), (counter, -trial_credit_micro)],
            now=now,
            memo="trial credit",
        )
    return account, True


def states(
    db: Session, accounts: Sequence[Any], now: datetime, scope: Any = None
) -> list[AccountState]:
    """States of many accounts (ORM objects or rows) in four queries (enforcement reads every
    running account).

    ``scope``: the accounts are those with open sessions, and this query selects their
    ids; it replaces a long literal IN list, which costs more to render and send than the
    rows it selects."""
    if not accounts:
        return []
    ids = scope if scope is not None else [a.id for a in accounts]
    pools: dict[int, dict[str, int]] = defaultdict(dict)
    for owner, code, balance in db.execute(
        select(LedgerAccount.account_id, LedgerAccount.code, LedgerAccount.balance_micro)
        .where(LedgerAccount.account_id.in_(ids))
        .order_by(LedgerAccount.account_id, LedgerAccount.id)
    ):
        pools[owner][code] = balance
    running: dict[int, list[SessionRecord]] = defaultdict(list)
    query = select(SESSIONS).where(SESSIONS.c.ended_at.is_(None))
    if scope is None:  # else the scope is "accounts with open sessions": all of them
        query = query.where(SESSIONS.c.account_id.in_(ids))
    for row in db.execute(query):
        running[row.account_id].append(session_record(row))
    for sessions in running.values():
        sessions.sort(key=lambda r: (-r.started_at.timestamp(), r.id))
    held: dict[int, int] = dict(
        db.execute(
            select(Hold.account_id, func.sum(Hold.amount_micro))
            .where(
                Hold.account_id.in_(ids),
                Hold.released_at.is_(None),
                Hold.expires_at > now,
                Hold.course == "",
            )
            .group_by(Hold.account_id)
        ).all()
    )
    return [
        AccountState(
            username=a.username,
            created_at=a.created_at,
            balance_micro=sum(pools[a.id].values()),
            running=tuple(running[a.id]),
            pools=dict(pools[a.id]),
            held_micro=int(held.get(a.id) or 0),
        )
        for a in accounts
    ]


def state(db: Session, account: Account, now: datetime) -> AccountState:
    """The state of one account at ``now``."""
    return states(db, [account], now)[0]


@writes(name="open_account")
def open_state(db: Session, username: str, now: datetime, *, terms: Terms) -> Saved[AccountState]:
    """Open ``username``'s account with trial credit once; True when it was created."""
    account, created = open_account(db, username, now, terms.trial_credit_micro)
    db.flush()
    return state(db, account, now), created


@reads(name="account")
def account_state(db: Session, username: str, now: datetime) -> AccountState:
    """The account of ``username``; ``NotFound`` when it was never opened."""
    return state(db, require(db, username), now)


@reads(name="accounts")
def all_states(db: Session, now: datetime) -> list[AccountState]:
    """Every account, by username."""
    rows = db.scalars(select(Account).order_by(Account.username)).all()
    return states(db, rows, now)


@reads(name="accounts_with_running_sessions")
def running_states(db: Session, now: datetime) -> list[AccountState]:
    """Every account with at least one open session (rows, not ORM objects: enforcement
    reads them all every few seconds)."""
    ids = select(SESSIONS.c.account_id).where(SESSIONS.c.ended_at.is_(None))
    rows = db.execute(select(ACCOUNTS).where(ACCOUNTS.c.id.in_(ids)).order_by(ACCOUNTS.c.id))
    return states(db, rows.all(), now, scope=ids)
