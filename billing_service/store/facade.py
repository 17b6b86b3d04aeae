"""The billing store: every operation on the billing database, each one transaction.

Everything here is synchronous and takes ``now`` explicitly; the web layer runs it in a
single-thread executor, so one process's writes are serialised. Writers elsewhere (another
replica on the same PostgreSQL database) are met by row locks (``SELECT … FOR UPDATE`` on the
account for admissions, on sessions for charges and stops, on pools for postings) and by the
unique keys: a write that loses a race rolls back and is run again, and then returns the
winner's result. Results are frozen records (:mod:`billing_service.domain.records`), detached
from the database session.

:class:`Store` owns the engine and the transactions; the work of each operation is a function
of a database session in the section modules beside this one (accounts, funding, prices,
admission, sessions, charges, courses, check, moves), and the decisions are pure, in
:mod:`billing_service.domain`. Most methods are that function itself, marked in its
section with ``@reads`` or ``@writes`` (:mod:`.operations`): its parameters (less the session
and the store's :class:`~.terms.Terms`) and its docstring are the method's. The methods
written here do more than run one such function.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from ..domain import ledger
from ..domain.admission import Admission, Claim, check_admission_request, decide
from ..domain.courses import JOIN_WINDOW, CourseRecord
from ..domain.errors import JoinRateLimited
from ..domain.money import cost_micro
from ..domain.pricing import ON_DEMAND, PriceBook, check_price_class
from ..domain.records import PriceBookRecord, Saved, TransactionRecord
from . import (
    accounts,
    admission,
    charges,
    check,
    courses,
    funding,
    moves,
    postings,
    prices,
    sessions,
)
from .operations import WRITE, method, operations
from .terms import Terms

T = TypeVar("T")

WRITE_ATTEMPTS = 4


def _deadlock(error: OperationalError) -> bool:
    """PostgreSQL chose this transaction as a deadlock (or serialization) victim."""
    return getattr(error.orig, "sqlstate", None) in ("40P01", "40001")


def _term(name: str, doc: str) -> property:
    """A read-only property for one of the store's :class:`~.terms.Terms`."""
    return property(lambda self: getattr(self._terms, name), doc=doc)


@operations(accounts, funding, postings, prices, admission, sessions, courses, check, moves)
class Store:
    """Billing operations on one database: the methods written here, and those the
    sections mark (``@reads``, ``@writes``; :mod:`.operations`)."""

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
        self._terms = Terms(
            price_book=price_book,
            trial_credit_micro=trial_credit_micro,
            min_billable_seconds=min_billable_seconds,
            hold_seconds=hold_seconds,
            revenue=postings.RevenueShards(),
        )
        self._sessionmaker = sessionmaker(engine, expire_on_commit=False)
        #: charge worker k credits shard (base + k): this process's workers never share a
        #: shard, and replicas most likely start elsewhere
        self._shard_base = random.randrange(ledger.REVENUE_SHARDS)

    settings_price_book = _term(
        "price_book", "The price book of the settings; ``sync_price_book`` records it as a version."
    )
    trial_credit_micro = _term("trial_credit_micro", "Credit a new account opens with.")
    min_billable_seconds = _term(
        "min_billable_seconds", "The period a spawn must be able to pay for."
    )
    hold_seconds = _term(
        "hold_seconds", "How long an admission's hold lasts unless its server starts."
    )

    # -- transactions ----------------------------------------------------------------------

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

    def _read(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``work(db, *args, **kwargs)`` on a session of its own, writing nothing."""
        with self._sessionmaker() as db:
            return work(db, *args, **kwargs)

    def _run(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``work(db, *args, **kwargs)`` in one write transaction (:meth:`_write`)."""
        return self._write(lambda db: work(db, *args, **kwargs))

    # -- funding ---------------------------------------------------------------------------

    def adjust(
        self, username: str, amount_micro: int, reason: str, idempotency_key: str, now: datetime
    ) -> Saved[TransactionRecord]:
        """An admin's signed adjustment of the paid pool (``grant`` of kind adjustment)."""
        return self.grant(username, "adjustment", amount_micro, reason, idempotency_key, now)

    # -- price books -----------------------------------------------------------------------

    def price_book_at(self, when: datetime | None = None) -> tuple[int | None, PriceBook]:
        """The version in force at ``when`` (now when None): the newest published by then.

        Before any version is recorded, the settings' book (version None)."""
        return self._read(prices.book_at, when, self.settings_price_book)

    def sync_price_book(self, now: datetime) -> PriceBookRecord:
        """At start-up: the settings' book becomes a new version if it changed since the
        settings were last recorded (an admin's later version stays in force otherwise)."""
        if self._read(prices.last_settings_book) != prices.book_json(self.settings_price_book):
            self.publish_price_book(self.settings_price_book, "settings", "settings", now)
        return self.price_books()[0]

    def price(self, sku: str, price_class: str = ON_DEMAND, at: datetime | None = None) -> int:
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
        price_class: str = ON_DEMAND,
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
        check_admission_request(sku, price_class)
        price = self.price(sku, price_class)
        needed = cost_micro(price, count, self.min_billable_seconds)
        claim = Claim(sku, count, price_class, price, needed)
        judged = self._judge(
            username, claim, now, hold=hold, idempotency_key=idempotency_key, course=course
        )
        return decide(judged, claim, now, self.min_billable_seconds, course)

    #: the admission's transaction: the facts judged, the hold placed
    _judge = method(admission.admit, WRITE, "_judge")

    # -- sessions --------------------------------------------------------------------------

    def post_interval_charges(
        self, now: datetime, interval_seconds: int, batch_size: int = 200, workers: int = 1
    ) -> int:
        """Charge every open session up to its last whole interval; returns charges posted.

        Sessions are taken in batches of ``batch_size`` (one transaction each), locked with
        SKIP LOCKED so ``workers`` threads here, and other replicas, share the work instead
        of waiting for each other (more than one worker needs PostgreSQL); each worker
        credits its own revenue shard, so their transactions touch no common row. The batch
        path uses Core statements, one per table and kind of write, not ORM objects: it is
        the hot loop.

        Course weeks are not rolled here: a session crossing a week's boundary is split by
        :meth:`roll_course_weeks`, which the charge loop runs first
        (:func:`billing_service.loops.charge.charge_pass`)."""
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
        shard = (self._shard_base + worker) % ledger.REVENUE_SHARDS
        # self._write looked up now: a caller may wrap it (bench/billing_pg.py times batches)
        return charges.charge_pass(
            self._write, self._terms.revenue, now, interval_seconds, batch_size, shard
        )

    def mark_seen(self, session_ids: list[str], at: datetime) -> None:
        """Record that the servers of ``session_ids`` were seen running at ``at``."""
        if session_ids:
            self._run(sessions.mark_seen, session_ids, at)

    # -- courses ---------------------------------------------------------------------------

    def enroll_by_groups(self, username: str, groups: list[str], now: datetime) -> list[str]:
        """At login: enrol ``username`` in every active course bound to one of their teams."""
        if not groups:
            return []
        slugs = self._read(courses.team_courses, groups)
        return [slug for slug in slugs if self.enroll(slug, username, "team", now)]

    def join(self, username: str, code: str, now: datetime) -> CourseRecord:
        """Join the course with join code ``code``; wrong codes are counted and limited."""
        course = self._run(courses.try_join, username, code, now)
        if course == courses.WRONG_CODE:
            raise ValueError(
                "code: no active course has that join code; check it with your instructor"
            )
        if course == courses.TOO_MANY_ATTEMPTS:
            raise JoinRateLimited(
                f"Too many wrong join codes: try again in {JOIN_WINDOW.seconds // 60} minutes"
            )
        self.enroll(course.slug, username, "code", now)
        return course

    def roll_course_weeks(self, now: datetime) -> int:
        """Grant the new week to every student with a running course session, first
        charging each session that crosses the boundary up to it from the old week's pool;
        returns how many students were looked at. The charge loop's first step, before
        :meth:`post_interval_charges` (:func:`billing_service.loops.charge.charge_pass`)."""
        pairs = self._read(courses.running_students)
        for slug, username in pairs:
            self._run(
                lambda db, s=slug, u=username: courses.ensure_week(
                    db, courses.course_row(db, s), u, now, self._terms
                )
            )
        return len(pairs)

    # -- the ledger check ------------------------------------------------------------------
