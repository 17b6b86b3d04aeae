"""The billing domain on the database: accounts, the double-entry ledger, holds, sessions.

Everything here is synchronous and takes ``now`` explicitly; the web layer runs it in a
single-thread executor, so one process's writes are serialised. Writers elsewhere (another
replica on the same PostgreSQL database) are met by row locks (``SELECT … FOR UPDATE`` on the
account for admissions, on sessions for charges and stops, on pools for postings) and by the
unique keys: a write that loses a race rolls back and is run again, and then returns the
winner's result. Results are frozen records, detached from the database session.

Charges: while a session runs, interval charges bring what it has been charged up to the cost
of its first ``k × interval`` seconds, under the key ``charge:{session}:{k}``; the stop posts
``charge:{session}:final`` for the rest (or credits back what interval charges took beyond the
final cost, when the stop time arrives late). A replay of any key changes nothing.

Storage sessions (price class "storage", sku "disk", count = GB) are data disks, metered from
creation to deletion and charged exactly like servers, from the user's own credit (trial, then
paid; never a course's allowance). They take no admission or hold, and nothing here or in
enforcement stops them: their cost drains the credit and may take it below zero, and then new
servers are refused until credit is added.
"""

from __future__ import annotations

import json
import random
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Engine, func, insert, select, text, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from gputap_common.money import format_credits

from .charge_writes import write_charges, write_charges_postgresql
from .course_store import CourseOps
from .domain import ledger
from .domain.errors import NotFound
from .domain.money import billed_seconds, cost_micro, format_duration, seconds_covered
from .domain.pricing import (
    DISK,
    STORAGE,
    PriceBook,
    check_price_class,
    check_storage_session,
    make_price_book,
)
from .domain.records import (
    AccountState,
    HoldRecord,
    LedgerProblem,
    PriceBookRecord,
    SessionRecord,
    TransactionRecord,
)
from .orm import (
    Account,
    BillingSession,
    Course,
    Enrollment,
    Hold,
    LedgerAccount,
    LedgerTransaction,
    Posting,
    PriceBookVersion,
)

T = TypeVar("T")

ACCOUNTS = Account.__table__
SESSIONS = BillingSession.__table__
LEDGER_ACCOUNTS = LedgerAccount.__table__
_CHARGE_COLUMNS = (
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
)


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
    hold: HoldRecord | None = None


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
        charged_micro=row.charged_micro,
        course=row.course,
        price_book_version=row.price_book_version,
        last_seen_at=row.last_seen_at,
        fallback=row.fallback,
    )


def _hold_record(row: Hold, username: str) -> HoldRecord:
    return HoldRecord(
        id=row.id,
        username=username,
        sku=row.sku,
        count=row.count,
        price_class=row.price_class,
        amount_micro=row.amount_micro,
        created_at=row.created_at,
        expires_at=row.expires_at,
        released_at=row.released_at,
        release_reason=row.release_reason,
        session_id=row.session_id,
    )


def book_json(book: PriceBook) -> str:
    """A price book as stored: exact decimal strings, sorted, so equal books compare equal."""
    prices = {sku: format_credits(micro) for sku, micro in sorted(book.configured().items())}
    return json.dumps(
        {
            "prices": prices,
            "spot_discount_percent": book.spot_discount_percent,
            "shared_percent": book.shared_percent,
        },
        sort_keys=True,
    )


def book_from_json(text: str) -> PriceBook:
    data = json.loads(text)
    return make_price_book(data["prices"], data["spot_discount_percent"], data["shared_percent"])


WRITE_ATTEMPTS = 4


def _deadlock(error: OperationalError) -> bool:
    """PostgreSQL chose this transaction as a deadlock (or serialization) victim."""
    return getattr(error.orig, "sqlstate", None) in ("40P01", "40001")


def _not_found(username: str) -> NotFound:
    return NotFound(f"No billing account for {username!r}; it is opened at first login")


class Store(CourseOps):
    """Billing operations on one database."""

    def __init__(
        self,
        engine: Engine,
        price_book: PriceBook,
        *,
        trial_credit_micro: int,
        min_billable_seconds: int,
        hold_seconds: int = 900,
    ) -> None:
        self.engine = engine
        #: the price book of the settings; ``sync_price_book`` records it as a version
        self.settings_price_book = price_book
        self.trial_credit_micro = trial_credit_micro
        self.min_billable_seconds = min_billable_seconds
        self.hold_seconds = hold_seconds
        self._sessionmaker = sessionmaker(engine, expire_on_commit=False)
        self._books: dict[int, PriceBook] = {}
        #: ledger account ids of the revenue shards (ledger.REVENUE_CODES), once all exist
        self._revenue_ids: tuple[int, ...] | None = None
        #: charge worker k credits shard (base + k): this process's workers never share a
        #: shard, and replicas most likely start elsewhere
        self._shard_base = random.randrange(ledger.REVENUE_SHARDS)

    def _write(self, work: Callable[[Session], T]) -> T:
        """Run ``work`` in one transaction, again if a concurrent writer took its key.

        The unique keys (account username, ledger account code, session id, idempotency key)
        make the loser of a race fail with IntegrityError; its rollback undoes everything it
        did, and the next run finds the winner's rows and answers as a replay would. One run
        can lose more than one race (a new user's pools and the revenue account are created
        on first use), and PostgreSQL may pick it as a deadlock victim: up to WRITE_ATTEMPTS.
        """
        for attempt in range(1, WRITE_ATTEMPTS + 1):
            try:
                with self._sessionmaker.begin() as db:
                    return work(db)
            except (IntegrityError, OperationalError) as e:
                retry = isinstance(e, IntegrityError) or _deadlock(e)
                if not retry or attempt == WRITE_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    # -- ledger primitives -----------------------------------------------------------------

    def _ledger_account(
        self, db: Session, code: str, account_id: int | None, pool: str, course: str = ""
    ) -> LedgerAccount:
        row = db.scalar(select(LedgerAccount).where(LedgerAccount.code == code))
        if row is None:
            row = LedgerAccount(
                code=code, account_id=account_id, pool=pool, course=course, balance_micro=0
            )
            db.add(row)
            db.flush()
        return row

    def _system(self, db: Session, code: str) -> LedgerAccount:
        return self._ledger_account(db, code, None, "system")

    def _revenue(self, db: Session) -> tuple[int, ...]:
        """Ids of the revenue shards, in shard order. They are made by the migration; one
        missing is created here (and the ids are kept only once all of them existed, so an
        id is never kept from a transaction that rolled back)."""
        if self._revenue_ids is not None:
            return self._revenue_ids
        found = dict(
            db.execute(
                select(LEDGER_ACCOUNTS.c.code, LEDGER_ACCOUNTS.c.id).where(
                    LEDGER_ACCOUNTS.c.code.in_(ledger.REVENUE_CODES)
                )
            ).all()
        )
        ids = tuple(found.get(code) or self._system(db, code).id for code in ledger.REVENUE_CODES)
        if len(found) == len(ledger.REVENUE_CODES):
            self._revenue_ids = ids
        return ids

    def revenue_micro(self) -> int:
        """All charges so far, net of what final charges gave back: the sum of the shards."""
        with self._sessionmaker() as db:
            total = db.scalar(
                select(func.coalesce(func.sum(LEDGER_ACCOUNTS.c.balance_micro), 0)).where(
                    LEDGER_ACCOUNTS.c.code.in_(ledger.REVENUE_CODES)
                )
            )
        return int(total)  # PostgreSQL sums BIGINT as NUMERIC

    def _pools(
        self, db: Session, account: Account, course: str, fallback: bool = True
    ) -> list[LedgerAccount]:
        """The account's pools in funding order, locked for this transaction."""
        rows = []
        for pool, pool_course in ledger.funding_order(course, fallback):
            code = ledger.pool_code(account.username, pool, pool_course)
            self._ledger_account(db, code, account.id, pool, pool_course)
            rows.append(code)
        locked = db.scalars(
            select(LedgerAccount)
            .where(LedgerAccount.code.in_(rows))
            .order_by(LedgerAccount.id)
            .with_for_update()
        ).all()
        by_code = {row.code: row for row in locked}
        return [by_code[code] for code in rows]

    def _post(
        self,
        db: Session,
        *,
        key: str,
        kind: str,
        account_id: int | None,
        moves: Sequence[tuple[LedgerAccount, int]],
        now: datetime,
        memo: str = "",
        created_by: str = "",
        session_id: str | None = None,
    ) -> LedgerTransaction:
        """One balanced transaction; each account's balance moves in the same transaction."""
        moves = [(account, amount) for account, amount in moves if amount]
        if sum(amount for _, amount in moves) != 0:
            raise AssertionError(f"unbalanced transaction {key}: {moves}")
        tx = LedgerTransaction(
            idempotency_key=key,
            kind=kind,
            account_id=account_id,
            session_id=session_id,
            memo=memo,
            created_by=created_by,
            created_at=now,
        )
        db.add(tx)
        db.flush()
        for account, amount in moves:
            db.add(Posting(transaction_id=tx.id, ledger_account_id=account.id, amount_micro=amount))
            db.execute(
                update(LedgerAccount)
                .where(LedgerAccount.id == account.id)
                .values(balance_micro=LedgerAccount.balance_micro + amount)
                .execution_options(synchronize_session=False)
            )
        db.flush()
        for account, _ in moves:
            db.refresh(account, ["balance_micro"])
        return tx

    def _transaction_record(self, db: Session, tx: LedgerTransaction) -> TransactionRecord:
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

    # -- accounts --------------------------------------------------------------------------

    def _account(self, db: Session, username: str) -> Account | None:
        return db.scalar(select(Account).where(Account.username == username))

    def _open(self, db: Session, username: str, now: datetime) -> tuple[Account, bool]:
        account = self._account(db, username)
        if account is not None:
            return account, False
        account = Account(username=username, created_at=now)
        db.add(account)
        db.flush()
        # both pools at once: charges then never create them one at a time
        pool = self._ledger_account(db, ledger.pool_code(username, "trial"), account.id, "trial")
        self._ledger_account(db, ledger.pool_code(username, "paid"), account.id, "paid")
        if self.trial_credit_micro:
            counter = self._system(db, ledger.counter_account("trial"))
            self._post(
                db,
                key=f"trial:{username}",
                kind="trial",
                account_id=account.id,
                moves=[(pool, self.trial_credit_micro), (counter, -self.trial_credit_micro)],
                now=now,
                memo="trial credit",
            )
        return account, True

    def _states(
        self, db: Session, accounts: Sequence[Account], now: datetime, scope=None
    ) -> list[AccountState]:
        """States of many accounts in four queries (enforcement reads every running account).

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
            running[row.account_id].append(_session_record(row))
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

    def _state(self, db: Session, account: Account, now: datetime) -> AccountState:
        return self._states(db, [account], now)[0]

    def open_account(self, username: str, now: datetime) -> tuple[AccountState, bool]:
        """Open ``username``'s account with trial credit once; True when it was created."""

        def work(db: Session) -> tuple[AccountState, bool]:
            account, created = self._open(db, username, now)
            db.flush()
            return self._state(db, account, now), created

        return self._write(work)

    def account(self, username: str, now: datetime) -> AccountState:
        """The account of ``username``; ``NotFound`` when it was never opened."""
        with self._sessionmaker() as db:
            account = self._account(db, username)
            if account is None:
                raise _not_found(username)
            return self._state(db, account, now)

    def accounts(self, now: datetime) -> list[AccountState]:
        """Every account, by username."""
        with self._sessionmaker() as db:
            rows = db.scalars(select(Account).order_by(Account.username)).all()
            return self._states(db, rows, now)

    def accounts_with_running_sessions(self, now: datetime) -> list[AccountState]:
        """Every account that has at least one open session (rows, not ORM objects: enforcement
        reads them all every few seconds)."""
        with self._sessionmaker() as db:
            ids = select(SESSIONS.c.account_id).where(SESSIONS.c.ended_at.is_(None))
            rows = db.execute(
                select(ACCOUNTS).where(ACCOUNTS.c.id.in_(ids)).order_by(ACCOUNTS.c.id)
            )
            return self._states(db, rows.all(), now, scope=ids)

    # -- funding ---------------------------------------------------------------------------

    def grant(
        self,
        username: str,
        kind: str,
        amount_micro: int,
        reason: str,
        idempotency_key: str,
        now: datetime,
        *,
        created_by: str = "",
        course: str = "",
    ) -> tuple[TransactionRecord, bool]:
        """Fund (or, for an adjustment, debit) an account; the same key returns the first one.

        ``kind`` is one of ``ledger.FUNDING_KINDS``; only adjustments may be negative, and
        only allowances name a course."""
        if kind not in ledger.FUNDING_KINDS:
            raise ValueError(f"kind must be one of {', '.join(ledger.FUNDING_KINDS)}, not {kind!r}")
        if amount_micro == 0 or (amount_micro < 0 and kind != "adjustment"):
            raise ValueError(
                f"amount: a {kind} must be positive"
                + (" (a negative adjustment takes credit away)" if kind == "adjustment" else "")
            )
        if (kind == "allowance") != bool(course):
            raise ValueError(
                "course: an allowance names its course"
                if kind == "allowance"
                else f"course: only an allowance names a course, not a {kind}"
            )
        key = f"grant:{idempotency_key}"

        def work(db: Session) -> tuple[TransactionRecord, bool]:
            existing = db.scalar(
                select(LedgerTransaction).where(LedgerTransaction.idempotency_key == key)
            )
            if existing is not None:
                return self._transaction_record(db, existing), False
            account = self._account(db, username)
            if account is None:
                raise _not_found(username)
            pool_name = ledger.funding_pool(kind)
            pool = self._ledger_account(
                db, ledger.pool_code(username, pool_name, course), account.id, pool_name, course
            )
            counter = self._system(db, ledger.counter_account(kind))
            tx = self._post(
                db,
                key=key,
                kind=kind,
                account_id=account.id,
                moves=[(pool, amount_micro), (counter, -amount_micro)],
                now=now,
                memo=reason,
                created_by=created_by,
            )
            return self._transaction_record(db, tx), True

        return self._write(work)

    def adjust(
        self, username: str, amount_micro: int, reason: str, idempotency_key: str, now: datetime
    ) -> tuple[TransactionRecord, bool]:
        """An admin's signed adjustment of the paid pool (``grant`` of kind adjustment)."""
        return self.grant(username, "adjustment", amount_micro, reason, idempotency_key, now)

    def transactions(self, username: str) -> list[TransactionRecord]:
        """The ledger of ``username``, oldest first."""
        with self._sessionmaker() as db:
            account = self._account(db, username)
            if account is None:
                raise _not_found(username)
            rows = db.scalars(
                select(LedgerTransaction)
                .where(LedgerTransaction.account_id == account.id)
                .order_by(LedgerTransaction.id)
            )
            return [self._transaction_record(db, row) for row in rows]

    # -- price books -----------------------------------------------------------------------

    def _book(self, db: Session, version: int | None) -> PriceBookRecord | None:
        if version is None:
            return None
        row = db.get(PriceBookVersion, version)
        if version not in self._books:
            self._books[version] = book_from_json(row.book)
        return PriceBookRecord(
            version=row.version,
            created_at=row.created_at,
            created_by=row.created_by,
            source=row.source,
            book=self._books[version],
        )

    def price_book_at(self, when: datetime | None = None) -> tuple[int | None, PriceBook]:
        """The version in force at ``when`` (now when None): the newest published by then.

        Before any version is recorded, the settings' book (version None)."""
        with self._sessionmaker() as db:
            query = select(func.max(PriceBookVersion.version))
            if when is not None:
                query = query.where(PriceBookVersion.created_at <= when)
            version = db.scalar(query)
            if version is None and when is not None:  # a start before the first version
                version = db.scalar(select(func.min(PriceBookVersion.version)))
            record = self._book(db, version)
        if record is None:
            return None, self.settings_price_book
        return record.version, record.book

    def price_books(self) -> list[PriceBookRecord]:
        """Every published version, newest first."""
        with self._sessionmaker() as db:
            versions = db.scalars(
                select(PriceBookVersion.version).order_by(PriceBookVersion.version.desc())
            ).all()
            return [self._book(db, v) for v in versions]

    def publish_price_book(
        self, book: PriceBook, created_by: str, source: str, now: datetime
    ) -> tuple[PriceBookRecord, bool]:
        """Record ``book`` as the newest version unless it equals the newest one already."""
        text = book_json(book)

        def work(db: Session) -> tuple[PriceBookRecord, bool]:
            latest = db.scalar(
                select(PriceBookVersion).order_by(PriceBookVersion.version.desc()).limit(1)
            )
            if latest is not None and latest.book == text:
                return self._book(db, latest.version), False
            version = (latest.version + 1) if latest is not None else 1
            db.add(
                PriceBookVersion(
                    version=version,
                    created_at=max(now, latest.created_at) if latest else now,
                    created_by=created_by,
                    source=source,
                    book=text,
                )
            )
            db.flush()
            return self._book(db, version), True

        return self._write(work)

    def sync_price_book(self, now: datetime) -> PriceBookRecord:
        """At start-up: the settings' book becomes a new version if it changed since the
        settings were last recorded (an admin's later version stays in force otherwise)."""
        text = book_json(self.settings_price_book)
        with self._sessionmaker() as db:
            last_settings = db.scalar(
                select(PriceBookVersion.book)
                .where(PriceBookVersion.source == "settings")
                .order_by(PriceBookVersion.version.desc())
                .limit(1)
            )
        if last_settings != text:
            self.publish_price_book(self.settings_price_book, "settings", "settings", now)
        versions = self.price_books()
        return versions[0]

    def price(self, sku: str, price_class: str = "on-demand", at: datetime | None = None) -> int:
        """Micro-credits per hour of ``sku`` at ``at`` (now); ``UnknownSku`` says what to do,
        ``ValueError`` when the price class does not fit the SKU."""
        check_price_class(sku, price_class)
        return self.price_book_at(at)[1].require(sku, price_class)

    # -- admission and holds ---------------------------------------------------------------

    def admit(
        self,
        username: str,
        sku: str,
        count: int,
        now: datetime,
        price_class: str = "on-demand",
        *,
        hold: bool = True,
        idempotency_key: str | None = None,
        course: str = "",
    ) -> Admission:
        """May ``username`` start ``count`` x ``sku``? Needs credit for the minimum period
        beyond what holds and young servers already claim; when allowed, a hold claims it.

        With ``idempotency_key`` the hold's id is that key: asking again (a retried request)
        answers with the same hold instead of placing a second one. With ``course`` the
        course's rules must allow it (``ValueError`` names the rule) and its allowance this
        week pays, or the student's own credit if they opted in. Data disks need no
        admission (``ValueError``): their storage session opens when the disk is created."""
        if sku == DISK or price_class == STORAGE:
            raise ValueError(
                "Data disks need no admission: open the disk's storage session with "
                "POST api/sessions (sku 'disk', price_class 'storage') when it is created"
            )
        price = self.price(sku, price_class)
        rate = price * count
        needed = cost_micro(price, count, self.min_billable_seconds)

        def work(db: Session) -> tuple[AccountState, HoldRecord | None, bool, str | None]:
            account, _ = self._open(db, username, now)
            db.flush()
            # one admission per account at a time, across replicas
            db.scalar(select(Account.id).where(Account.id == account.id).with_for_update())
            if idempotency_key is not None:
                earlier = db.get(Hold, idempotency_key)
                if earlier is not None:
                    if earlier.account_id != account.id:
                        raise ValueError(
                            "idempotency_key: already used by another account's admission"
                        )
                    state = self._state(db, account, now)
                    return state, _hold_record(earlier, username), True, None
            refusal = None
            if course:
                rules, fallback = self.course_admission(db, account, course, sku, count, now)
                state = self._state(db, account, now)
                free = self._course_admissible(db, account, state, course, now)
                if free < needed and not (
                    fallback and state.admissible_at(now, self.min_billable_seconds) >= needed
                ):
                    start, end = rules.week(now)
                    refusal = (
                        f"No {rules.name} hours left this week for {sku}: "
                        f"{format_duration(self.min_billable_seconds)} needs "
                        f"{format_credits(needed)} of the course's allowance, "
                        f"{format_credits(max(free, 0))} is left. Hours reset {rules.resets} "
                        f"({end.isoformat()}). Opt in to go on with your own credit, or start "
                        "without the course."
                    )
                    return state, None, False, refusal
            else:
                state = self._state(db, account, now)
                if state.admissible_at(now, self.min_billable_seconds) < needed:
                    return state, None, False, refusal
            if not hold:
                return state, None, False, refusal
            row = Hold(
                id=idempotency_key or uuid.uuid4().hex,
                account_id=account.id,
                sku=sku,
                count=count,
                price_class=price_class,
                amount_micro=needed,
                created_at=now,
                expires_at=now + timedelta(seconds=self.hold_seconds),
                release_reason="",
                course=course,
            )
            db.add(row)
            db.flush()
            return state, _hold_record(row, username), False, None

        state, placed, replayed, refusal = self._write(work)
        free = state.admissible_at(now, self.min_billable_seconds)
        # a replay answers as the first time did: its hold is already among the held credit
        if replayed and placed.released_at is None:
            free += placed.amount_micro
        allowed = replayed or placed is not None or (refusal is None and free >= needed)
        what = sku if count == 1 else f"{count} x {sku}"
        if allowed:
            message = f"Admitted {what} at {format_credits(rate)}/h"
            if course:
                message += f", paid by course {course}"
        elif refusal:
            message = refusal
        else:
            claimed = ""
            if free < state.available_at(now):
                claimed = (
                    f" ({format_credits(state.available_at(now) - free)} is held for servers "
                    "starting or started in the last "
                    f"{format_duration(self.min_billable_seconds)})"
                )
            message = (
                f"Not enough credit for {what}: {format_duration(self.min_billable_seconds)} "
                f"at {format_credits(rate)}/h needs {format_credits(needed)} credits, "
                f"you have {format_credits(max(free, 0))} available{claimed}. "
                "Stop a running server or ask an admin for credit."
            )
            if state.disks:
                disks = sum(s.rate_per_hour_micro for s in state.disks)
                message += (
                    f" Your data disks cost {format_credits(disks)}/h while they exist; "
                    "delete one you no longer need."
                )
        return Admission(
            allowed=allowed,
            sku=sku,
            count=count,
            price_per_hour_micro=price,
            needed_micro=needed,
            available_micro=free,
            seconds_left=seconds_covered(state.available_at(now), state.rate_per_hour_micro + rate),
            message=message,
            hold=placed,
        )

    def _course_admissible(
        self, db: Session, account: Account, state: AccountState, course: str, now: datetime
    ) -> int:
        """The course's allowance a new server may claim: what is left, less the course's
        active holds and the rest of the minimum period of its young servers."""
        held = db.scalar(
            select(func.coalesce(func.sum(Hold.amount_micro), 0)).where(
                Hold.account_id == account.id,
                Hold.course == course,
                Hold.released_at.is_(None),
                Hold.expires_at > now,
            )
        )
        young = sum(
            s.minimum_left_at(now, self.min_billable_seconds)
            for s in state.running
            if s.course == course
        )
        return state.course_available_at(course, now) - int(held) - young

    def release_hold(self, hold_id: str, now: datetime, reason: str = "released") -> HoldRecord:
        """Give a hold's credit back (a start failed); a released hold stays as it was."""

        def work(db: Session) -> HoldRecord:
            row = db.get(Hold, hold_id, with_for_update=True)
            if row is None:
                raise NotFound(f"No hold {hold_id!r}; holds come from POST api/admission")
            if row.released_at is None:
                row.released_at = now
                row.release_reason = reason
            username = db.scalar(select(Account.username).where(Account.id == row.account_id))
            return _hold_record(row, username)

        return self._write(work)

    def holds(self, username: str, now: datetime) -> list[HoldRecord]:
        """Active holds of ``username``, oldest first."""
        with self._sessionmaker() as db:
            account = self._account(db, username)
            if account is None:
                raise _not_found(username)
            rows = db.scalars(
                select(Hold)
                .where(
                    Hold.account_id == account.id,
                    Hold.released_at.is_(None),
                    Hold.expires_at > now,
                )
                .order_by(Hold.created_at, Hold.id)
            )
            return [_hold_record(row, username) for row in rows]

    # -- sessions --------------------------------------------------------------------------

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
        *,
        hold_id: str | None = None,
        course: str = "",
    ) -> tuple[SessionRecord, bool]:
        """Record a started server, priced by the book in force when it started; the same id
        returns the first record. ``hold_id`` (its admission's hold) is released as started.

        A data disk's storage session (sku "disk", price class "storage", count = GB) is named
        "disk:NAME" and takes neither a hold nor a course (``ValueError`` otherwise)."""
        check_price_class(sku, price_class)
        if price_class == STORAGE:
            check_storage_session(server_name, hold_id, course)

        def work(db: Session) -> tuple[SessionRecord, bool]:
            existing = db.get(BillingSession, session_id)
            if existing is not None:
                # another source (the pod meter) opened it first: the spawner's hold is done
                self._hold_started(db, hold_id, existing.account_id, session_id, now)
                return _session_record(existing), False
            version, book = self.price_book_at(started_at)
            price = book.require(sku, price_class)
            account, _ = self._open(db, username, now)
            fallback = False
            if course:
                enrollment = db.get(Enrollment, (course, username))
                if enrollment is None:
                    raise ValueError(f"course: {username} is not a student of {course!r}")
                fallback = enrollment.fallback
                self._ensure_week(db, db.get(Course, course), username, now)
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
            )
            db.add(row)
            db.flush()
            self._hold_started(db, hold_id, account.id, session_id, now)
            return _session_record(row), True

        return self._write(work)

    def _hold_started(
        self, db: Session, hold_id: str | None, account_id: int, session_id: str, now: datetime
    ) -> None:
        """The admission's hold became the session: release it as started."""
        if not hold_id:
            return
        held = db.get(Hold, hold_id, with_for_update=True)
        if held is not None and held.account_id == account_id:
            if held.released_at is None:
                held.released_at = now
                held.release_reason = "started"
            held.session_id = session_id

    def _charge_to(
        self, db: Session, row: BillingSession, target: int, key: str, now: datetime
    ) -> int:
        """Bring ``row``'s charges to ``target``; returns the amount posted (0: nothing)."""
        amount = target - row.charged_micro
        if amount == 0:
            return 0
        account = db.get(Account, row.account_id)
        pools = self._pools(db, account, row.course, row.fallback)
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
        revenue = db.get(LedgerAccount, self._revenue(db)[ledger.revenue_shard(row.id)])
        moves = [(pool, -part) for pool, part in zip(pools, parts, strict=True)]
        self._post(
            db,
            key=key,
            kind=ledger.CHARGE,
            account_id=row.account_id,
            session_id=row.id,
            moves=[*moves, (revenue, amount)],
            now=now,
            memo=f"{row.username}/{row.server_name}: {row.count} x {row.sku}",
        )
        row.charged_micro = target
        return amount

    def stop_session(self, session_id: str, ended_at: datetime, now: datetime) -> SessionRecord:
        """Settle a session: final seconds and cost, the final charge. Replays change nothing."""

        def work(db: Session) -> SessionRecord:
            # the row lock makes a concurrent stop (or charge) wait, then see this one's result
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
            if row.course:  # a new week first: the part before its start is last week's
                course = db.get(Course, row.course)
                if course is not None:
                    self._ensure_week(db, course, row.username, max(ended_at, row.started_at))
            seconds = billed_seconds(row.started_at, ended_at)
            cost = cost_micro(row.price_per_hour_micro, row.count, seconds)
            row.ended_at = ended_at
            row.billed_seconds = seconds
            row.cost_micro = cost
            self._charge_to(db, row, cost, f"charge:{row.id}:final", now)
            db.flush()
            return _session_record(row)

        return self._write(work)

    def post_interval_charges(
        self, now: datetime, interval_seconds: int, batch_size: int = 200, workers: int = 1
    ) -> int:
        """Charge every open session up to its last whole interval; returns charges posted.

        Sessions are taken in batches of ``batch_size`` (one transaction each), locked with
        SKIP LOCKED so ``workers`` threads here, and other replicas, share the work instead
        of waiting for each other (more than one worker needs PostgreSQL); each worker
        credits its own revenue shard, so their transactions touch no common row. The batch
        path uses Core statements, one per table and kind of write, not ORM objects: it is
        the hot loop."""
        self.roll_course_weeks(now)
        if workers <= 1:
            return self._charge_pass(now, interval_seconds, batch_size, 0)
        with ThreadPoolExecutor(workers, thread_name_prefix="billing-charge") as pool:
            passes = [
                pool.submit(self._charge_pass, now, interval_seconds, batch_size, worker)
                for worker in range(workers)
            ]
            return sum(p.result() for p in passes)

    def _charge_pass(
        self, now: datetime, interval_seconds: int, batch_size: int, worker: int
    ) -> int:
        """Batches in id order until fewer than a batch are left that nobody else holds."""
        shard = (self._shard_base + worker) % ledger.REVENUE_SHARDS
        posted = 0
        after = ""
        while True:

            def work(db: Session, after: str = after) -> tuple[int, str, int]:
                if self.engine.dialect.name == "postgresql":
                    # an interval charge lost in a database crash is posted again by the next
                    # pass (same key, cumulative amount, charged_micro lost with it), so it
                    # need not wait for the disk; stops and grants keep synchronous commits
                    db.execute(text("SET LOCAL synchronous_commit TO OFF"))
                rows = db.execute(
                    select(*_CHARGE_COLUMNS)
                    .where(SESSIONS.c.ended_at.is_(None), SESSIONS.c.id > after)
                    .order_by(SESSIONS.c.id)
                    .limit(batch_size)
                    .with_for_update(skip_locked=True)
                ).all()
                last = rows[-1].id if rows else after
                charged = self._charge_batch(db, rows, now, interval_seconds, shard)
                return charged, last, len(rows)

            count, after, seen = self._write(work)
            posted += count
            if seen < batch_size:
                return posted

    def _charge_batch(
        self, db: Session, rows: Sequence, now: datetime, interval: int, shard: int
    ) -> int:
        """Interval charges of ``rows`` in bulk, into revenue shard ``shard``: the pools are
        read (and locked) in one query, the splits computed here, and everything is written
        at once (on PostgreSQL in one statement, ``CHARGES_POSTGRESQL``)."""
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
        pools = self._locked_pools(
            db, owners, {(r.account_id, r.username, r.course) for r, _, _ in due}
        )
        revenue = self._revenue(db)[shard]
        balances = {code: balance for code, (_, balance) in pools.items()}
        tx_rows: list[dict] = []
        splits: list[list[tuple[int, int]]] = []
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
            splits.append([*moves, (revenue, amount)])
            tx_rows.append(
                {
                    "idempotency_key": f"charge:{row.id}:{k}",
                    "kind": ledger.CHARGE,
                    "account_id": row.account_id,
                    "session_id": row.id,
                    "memo": f"{row.username}/{row.server_name}: {row.count} x {row.sku}",
                    "created_by": "",
                    "created_at": now,
                }
            )
        # every balance moves by its postings' sum: the pools down, the revenue shard up
        moved = {
            pools[code][0]: balance - pools[code][1]
            for code, balance in balances.items()
            if balance != pools[code][1]
        }
        moved[revenue] = sum(target - row.charged_micro for row, _, target in due)
        charged = {row.id: target for row, _, target in due}
        if self.engine.dialect.name == "postgresql":
            write_charges_postgresql(db, tx_rows, splits, moved, charged, now)
        else:
            write_charges(db, tx_rows, splits, moved, charged)
        return len(due)

    def _locked_pools(
        self, db: Session, owners: set[int], users: set[tuple[int, str, str]]
    ) -> dict[str, tuple[int, int]]:
        """``code -> (id, balance)`` of the funding pools of ``users`` ((account id, username,
        course) triples), created where missing, locked for this transaction."""

        def load() -> dict[str, tuple[int, int]]:
            rows = db.execute(
                select(
                    LEDGER_ACCOUNTS.c.code, LEDGER_ACCOUNTS.c.id, LEDGER_ACCOUNTS.c.balance_micro
                )
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

    def running_count(self) -> int:
        """How many sessions are open."""
        with self._sessionmaker() as db:
            return db.scalar(
                select(func.count())
                .select_from(BillingSession)
                .where(BillingSession.ended_at.is_(None))
            )

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

    def sessions(
        self,
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
            query = query.where(
                (BillingSession.ended_at.is_(None)) | (BillingSession.ended_at > since)
            )
        if until is not None:
            query = query.where(BillingSession.started_at < until)
        query = query.order_by(BillingSession.started_at.desc(), BillingSession.id.desc())
        with self._sessionmaker() as db:
            return [_session_record(row) for row in db.scalars(query)]

    # -- the ledger check ------------------------------------------------------------------

    def check_ledger(self) -> list[LedgerProblem]:
        """Everything that would make the books wrong; an empty list means they balance.

        Every transaction has postings summing to zero; every ledger account's balance is the
        sum of its postings; all balances sum to zero; revenue, the sum of its shards, is what
        charges took from users' pools; every session's ``charged_micro`` is what its charge
        transactions took from its owner's pools, and an ended session was charged exactly its
        cost."""
        problems: list[LedgerProblem] = []
        with self._sessionmaker() as db:
            sums = (
                select(
                    LedgerTransaction.idempotency_key,
                    func.coalesce(func.sum(Posting.amount_micro), 0),
                    func.count(Posting.id),
                )
                .outerjoin(Posting, Posting.transaction_id == LedgerTransaction.id)
                .group_by(LedgerTransaction.id, LedgerTransaction.idempotency_key)
            )
            for key, total, n in db.execute(sums):
                if total != 0 or n < 2:
                    problems.append(
                        LedgerProblem("unbalanced transaction", f"{key}: sum {total}, {n} postings")
                    )
            balances = (
                select(
                    LedgerAccount.code,
                    LedgerAccount.balance_micro,
                    func.coalesce(func.sum(Posting.amount_micro), 0),
                )
                .outerjoin(Posting, Posting.ledger_account_id == LedgerAccount.id)
                .group_by(LedgerAccount.id, LedgerAccount.code, LedgerAccount.balance_micro)
            )
            grand = 0
            for code, balance, total in db.execute(balances):
                grand += balance
                if balance != total:
                    problems.append(
                        LedgerProblem("balance differs", f"{code}: {balance} != sum {total}")
                    )
            if grand != 0:
                problems.append(LedgerProblem("books do not sum to zero", str(grand)))
            revenue = int(
                db.scalar(
                    select(func.coalesce(func.sum(LedgerAccount.balance_micro), 0)).where(
                        LedgerAccount.code.in_(ledger.REVENUE_CODES)
                    )
                )
            )
            charged = dict(
                db.execute(
                    select(LedgerTransaction.session_id, -func.sum(Posting.amount_micro))
                    .join(Posting, Posting.transaction_id == LedgerTransaction.id)
                    .join(LedgerAccount, LedgerAccount.id == Posting.ledger_account_id)
                    .where(
                        LedgerTransaction.kind == ledger.CHARGE,
                        LedgerAccount.account_id.is_not(None),
                    )
                    .group_by(LedgerTransaction.session_id)
                ).all()
            )
            # revenue (the sum of its shards) is exactly what charges took from the users
            taken = sum(int(v or 0) for v in charged.values())
            if revenue != taken:
                problems.append(
                    LedgerProblem("revenue differs from charges", f"{revenue} != {taken}")
                )
            for row in db.execute(
                select(
                    BillingSession.id,
                    BillingSession.charged_micro,
                    BillingSession.cost_micro,
                    BillingSession.ended_at,
                )
            ):
                posted = int(charged.get(row.id) or 0)
                if posted != row.charged_micro:
                    problems.append(
                        LedgerProblem(
                            "session charges differ",
                            f"{row.id}: charged_micro {row.charged_micro}, postings {posted}",
                        )
                    )
                if row.ended_at is not None and row.charged_micro != row.cost_micro:
                    problems.append(
                        LedgerProblem(
                            "ended session not settled",
                            f"{row.id}: cost {row.cost_micro}, charged {row.charged_micro}",
                        )
                    )
        return problems
