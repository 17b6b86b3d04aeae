"""The billing domain on the database: accounts, ledger, sessions, admission.

Everything here is synchronous and takes ``now`` explicitly; the web layer runs it in a
single-thread executor, so one process's writes are serialised. Writers elsewhere (another
process on the same PostgreSQL database) are met by the unique keys: a write that loses a race
rolls back and is run again, and then returns the winner's result. Results are frozen records,
detached from the database session.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from sqlalchemy import Engine, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from .money import (
    billed_seconds,
    cost_micro,
    format_credits,
    format_duration,
    seconds_covered,
)
from .orm import Account, BillingSession, LedgerEntry
from .pricing import PriceBook

T = TypeVar("T")


class UnknownSku(ValueError):
    """A SKU without a price."""


class NotFound(LookupError):
    """An account or session that does not exist; the message says which."""


@dataclass(frozen=True)
class SessionRecord:
    id: str
    username: str
    server_name: str
    sku: str
    count: int
    price_per_hour_micro: int
    started_at: datetime
    ended_at: datetime | None
    billed_seconds: int | None
    cost_micro: int | None
    price_class: str = "on-demand"

    @property
    def rate_per_hour_micro(self) -> int:
        return self.price_per_hour_micro * self.count

    def seconds_at(self, now: datetime) -> int:
        """Billed seconds: final when ended, so far (until ``now``) when running."""
        if self.billed_seconds is not None:
            return self.billed_seconds
        return billed_seconds(self.started_at, max(now, self.started_at))

    def cost_at(self, now: datetime) -> int:
        """Cost in micro-credits: final when ended, running cost until ``now`` otherwise."""
        if self.cost_micro is not None:
            return self.cost_micro
        return cost_micro(self.price_per_hour_micro, self.count, self.seconds_at(now))


@dataclass(frozen=True)
class EntryRecord:
    id: int
    username: str
    kind: str
    amount_micro: int
    session_id: str | None
    idempotency_key: str
    memo: str
    created_at: datetime


@dataclass(frozen=True)
class AccountState:
    """An account's balance and its open sessions: enough to price it at any ``now``."""

    username: str
    created_at: datetime
    balance_micro: int
    running: tuple[SessionRecord, ...]

    @property
    def rate_per_hour_micro(self) -> int:
        return sum(s.rate_per_hour_micro for s in self.running)

    def running_cost_at(self, now: datetime) -> int:
        return sum(s.cost_at(now) for s in self.running)

    def available_at(self, now: datetime) -> int:
        return self.balance_micro - self.running_cost_at(now)


@dataclass(frozen=True)
class Admission:
    allowed: bool
    sku: str
    count: int
    price_per_hour_micro: int
    needed_micro: int
    available_micro: int
    seconds_left: int | None
    message: str


def _session_record(row: BillingSession) -> SessionRecord:
    return SessionRecord(
        id=row.id,
        username=row.username,
        server_name=row.server_name,
        sku=row.sku,
        count=row.count,
        price_per_hour_micro=row.price_per_hour_micro,
        started_at=row.started_at,
        ended_at=row.ended_at,
        billed_seconds=row.billed_seconds,
        cost_micro=row.cost_micro,
        price_class=row.price_class,
    )


def _entry_record(row: LedgerEntry, username: str) -> EntryRecord:
    return EntryRecord(
        id=row.id,
        username=username,
        kind=row.kind,
        amount_micro=row.amount_micro,
        session_id=row.session_id,
        idempotency_key=row.idempotency_key,
        memo=row.memo,
        created_at=row.created_at,
    )


class Store:
    """Billing operations on one database."""

    def __init__(
        self,
        engine: Engine,
        price_book: PriceBook,
        *,
        trial_credit_micro: int,
        min_billable_seconds: int,
    ) -> None:
        self.engine = engine
        self.price_book = price_book
        self.trial_credit_micro = trial_credit_micro
        self.min_billable_seconds = min_billable_seconds
        self._sessionmaker = sessionmaker(engine, expire_on_commit=False)

    def _write(self, work: Callable[[Session], T]) -> T:
        """Run ``work`` in one transaction, once more if a concurrent writer took its key.

        The unique keys (account username, session id, idempotency key) make the loser of a
        race fail with IntegrityError; its rollback undoes everything it did, and the second
        run finds the winner's rows and answers as a replay would.
        """
        try:
            with self._sessionmaker.begin() as db:
                return work(db)
        except IntegrityError:
            with self._sessionmaker.begin() as db:
                return work(db)

    # accounts and ledger

    def _account(self, db: Session, username: str) -> Account | None:
        return db.scalar(select(Account).where(Account.username == username))

    def _open(self, db: Session, username: str, now: datetime) -> tuple[Account, bool]:
        account = self._account(db, username)
        if account is not None:
            return account, False
        account = Account(username=username, created_at=now)
        db.add(account)
        db.flush()
        if self.trial_credit_micro:
            db.add(
                LedgerEntry(
                    account_id=account.id,
                    kind="trial",
                    amount_micro=self.trial_credit_micro,
                    idempotency_key=f"trial:{username}",
                    memo="trial credit",
                    created_at=now,
                )
            )
        return account, True

    def _state(self, db: Session, account: Account) -> AccountState:
        balance = db.scalar(
            select(func.coalesce(func.sum(LedgerEntry.amount_micro), 0)).where(
                LedgerEntry.account_id == account.id
            )
        )
        running = db.scalars(
            select(BillingSession)
            .where(BillingSession.account_id == account.id, BillingSession.ended_at.is_(None))
            .order_by(BillingSession.started_at.desc(), BillingSession.id)
        )
        return AccountState(
            username=account.username,
            created_at=account.created_at,
            balance_micro=int(balance),
            running=tuple(_session_record(row) for row in running),
        )

    def open_account(self, username: str, now: datetime) -> tuple[AccountState, bool]:
        """Open ``username``'s account with trial credit once; True when it was created."""

        def work(db: Session) -> tuple[AccountState, bool]:
            account, created = self._open(db, username, now)
            db.flush()
            return self._state(db, account), created

        return self._write(work)

    def account(self, username: str) -> AccountState:
        """The account of ``username``; ``NotFound`` when it was never opened."""
        with self._sessionmaker() as db:
            account = self._account(db, username)
            if account is None:
                raise NotFound(f"No billing account for {username!r}; it is opened at first login")
            return self._state(db, account)

    def accounts_with_running_sessions(self) -> list[AccountState]:
        """Every account that has at least one open session."""
        with self._sessionmaker() as db:
            ids = select(BillingSession.account_id).where(BillingSession.ended_at.is_(None))
            accounts = db.scalars(select(Account).where(Account.id.in_(ids)).order_by(Account.id))
            return [self._state(db, account) for account in accounts]

    def adjust(
        self, username: str, amount_micro: int, reason: str, idempotency_key: str, now: datetime
    ) -> tuple[EntryRecord, bool]:
        """Credit (or debit) an account by an admin; the same key returns the first entry."""
        key = f"adjustment:{idempotency_key}"

        def work(db: Session) -> tuple[EntryRecord, bool]:
            existing = db.scalar(select(LedgerEntry).where(LedgerEntry.idempotency_key == key))
            if existing is not None:
                owner = db.get(Account, existing.account_id)
                return _entry_record(existing, owner.username), False
            account = self._account(db, username)
            if account is None:
                raise NotFound(f"No billing account for {username!r}; it is opened at first login")
            entry = LedgerEntry(
                account_id=account.id,
                kind="adjustment",
                amount_micro=amount_micro,
                idempotency_key=key,
                memo=reason,
                created_at=now,
            )
            db.add(entry)
            db.flush()
            return _entry_record(entry, username), True

        return self._write(work)

    def entries(self, username: str) -> list[EntryRecord]:
        """The ledger of ``username``, oldest first."""
        with self._sessionmaker() as db:
            account = self._account(db, username)
            if account is None:
                raise NotFound(f"No billing account for {username!r}")
            rows = db.scalars(
                select(LedgerEntry)
                .where(LedgerEntry.account_id == account.id)
                .order_by(LedgerEntry.id)
            )
            return [_entry_record(row, username) for row in rows]

    # admission

    def price(self, sku: str, price_class: str = "on-demand") -> int:
        """Micro-credits per hour of ``sku``; ``UnknownSku`` says what to do."""
        price = self.price_book.price(sku, price_class)
        if price is None:
            raise UnknownSku(
                f"No price for SKU {sku!r}; use a card, 'cpu', or CARD/<g>g.<m>gb "
                "listed by GET api/prices"
            )
        return price

    def admit(
        self, username: str, sku: str, count: int, now: datetime, price_class: str = "on-demand"
    ) -> Admission:
        """May ``username`` start ``count`` x ``sku``? Needs credit for the minimum period."""
        price = self.price(sku, price_class)

        def work(db: Session) -> AccountState:
            account, _ = self._open(db, username, now)
            db.flush()
            return self._state(db, account)

        state = self._write(work)
        rate = price * count
        needed = cost_micro(price, count, self.min_billable_seconds)
        available = state.available_at(now)
        allowed = available >= needed
        what = sku if count == 1 else f"{count} x {sku}"
        if allowed:
            message = f"Admitted {what} at {format_credits(rate)}/h"
        else:
            message = (
                f"Not enough credit for {what}: {format_duration(self.min_billable_seconds)} "
                f"at {format_credits(rate)}/h needs {format_credits(needed)} credits, "
                f"you have {format_credits(max(available, 0))} available. "
                "Stop a running server or ask an admin for credit."
            )
        return Admission(
            allowed=allowed,
            sku=sku,
            count=count,
            price_per_hour_micro=price,
            needed_micro=needed,
            available_micro=available,
            seconds_left=seconds_covered(available, state.rate_per_hour_micro + rate),
            message=message,
        )

    # sessions

    def start_session(
        self,
        session_id: str,
        username: str,
        server_name: str,
        sku: str,
        count: int,
        started_at: datetime,
        now: datetime,
        price_class: str = "on-demand",
    ) -> tuple[SessionRecord, bool]:
        """Record a started server with today's price; the same id returns the first record."""

        def work(db: Session) -> tuple[SessionRecord, bool]:
            existing = db.get(BillingSession, session_id)
            if existing is not None:
                return _session_record(existing), False
            price = self.price(sku, price_class)
            account, _ = self._open(db, username, now)
            row = BillingSession(
                price_class=price_class,
                id=session_id,
                account_id=account.id,
                username=username,
                server_name=server_name,
                sku=sku,
                count=count,
                price_per_hour_micro=price,
                started_at=started_at,
            )
            db.add(row)
            db.flush()
            return _session_record(row), True

        return self._write(work)

    def stop_session(self, session_id: str, ended_at: datetime, now: datetime) -> SessionRecord:
        """Settle a session: final seconds and cost, one charge entry. Replays change nothing."""

        def work(db: Session) -> SessionRecord:
            # the row lock makes a concurrent stop wait, then see this one's result
            row = db.get(BillingSession, session_id, with_for_update=True)
            if row is None:
                raise NotFound(f"No session {session_id!r}; start it with POST api/sessions")
            if row.ended_at is not None:
                return _session_record(row)
            if ended_at < row.started_at:
                raise ValueError(
                    f"ended_at: {ended_at.isoformat()} is before the session started "
                    f"({row.started_at.isoformat()})"
                )
            seconds = billed_seconds(row.started_at, ended_at)
            cost = cost_micro(row.price_per_hour_micro, row.count, seconds)
            row.ended_at = ended_at
            row.billed_seconds = seconds
            row.cost_micro = cost
            db.add(
                LedgerEntry(
                    account_id=row.account_id,
                    kind="charge",
                    amount_micro=-cost,
                    session_id=row.id,
                    idempotency_key=f"charge:{row.id}",
                    memo=f"{row.username}/{row.server_name}: {row.count} x {row.sku}, {seconds} s",
                    created_at=now,
                )
            )
            db.flush()
            return _session_record(row)

        return self._write(work)

    def sessions(self, username: str | None, state: str | None = None) -> list[SessionRecord]:
        """Sessions newest first; ``username`` None means everyone, ``state`` running|ended."""
        query = select(BillingSession)
        if username is not None:
            query = query.where(BillingSession.username == username)
        if state == "running":
            query = query.where(BillingSession.ended_at.is_(None))
        elif state == "ended":
            query = query.where(BillingSession.ended_at.is_not(None))
        query = query.order_by(BillingSession.started_at.desc(), BillingSession.id.desc())
        with self._sessionmaker() as db:
            return [_session_record(row) for row in db.scalars(query)]

    def mark_seen(self, session_ids: list[str], at: datetime) -> None:
        """Record that the servers of ``session_ids`` were seen running at ``at``."""
        if not session_ids:
            return

        def work(db: Session) -> None:
            db.execute(
                update(BillingSession)
                .where(BillingSession.id.in_(session_ids), BillingSession.ended_at.is_(None))
                .values(last_seen_at=at)
            )

        self._write(work)
