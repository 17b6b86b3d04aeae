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
admission, sessions, charges, courses, check), and the decisions are pure, in
:mod:`billing_service.domain`.
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
from ..domain.admission import Admission, check_admission_request, decide
from ..domain.courses import JOIN_WINDOW, CourseRecord, CourseRules, StudentCourse
from ..domain.errors import JoinRateLimited
from ..domain.money import cost_micro
from ..domain.pricing import PriceBook, check_price_class
from ..domain.records import (
    AccountState,
    HoldRecord,
    LedgerProblem,
    PriceBookRecord,
    SessionRecord,
    TransactionRecord,
)
from . import accounts, admission, charges, check, courses, funding, postings, prices, sessions
from .terms import Terms

T = TypeVar("T")

WRITE_ATTEMPTS = 4


def _deadlock(error: OperationalError) -> bool:
    """PostgreSQL chose this transaction as a deadlock (or serialization) victim."""
    return getattr(error.orig, "sqlstate", None) in ("40P01", "40001")


class Store:
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

    @property
    def settings_price_book(self) -> PriceBook:
        """The price book of the settings; ``sync_price_book`` records it as a version."""
        return self._terms.price_book

    @property
    def trial_credit_micro(self) -> int:
        """Credit a new account opens with."""
        return self._terms.trial_credit_micro

    @property
    def min_billable_seconds(self) -> int:
        """The period a spawn must be able to pay for."""
        return self._terms.min_billable_seconds

    @property
    def hold_seconds(self) -> int:
        """How long an admission's hold lasts unless its server starts."""
        return self._terms.hold_seconds

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

    # -- accounts --------------------------------------------------------------------------

    def open_account(self, username: str, now: datetime) -> tuple[AccountState, bool]:
        """Open ``username``'s account with trial credit once; True when it was created."""

        def work(db: Session) -> tuple[AccountState, bool]:
            account, created = accounts.open_account(db, username, now, self.trial_credit_micro)
            db.flush()
            return accounts.state(db, account, now), created

        return self._write(work)

    def account(self, username: str, now: datetime) -> AccountState:
        """The account of ``username``; ``NotFound`` when it was never opened."""
        return self._read(lambda db: accounts.state(db, accounts.require(db, username), now))

    def accounts(self, now: datetime) -> list[AccountState]:
        """Every account, by username."""
        return self._read(accounts.all_states, now)

    def accounts_with_running_sessions(self, now: datetime) -> list[AccountState]:
        """Every account that has at least one open session (rows, not ORM objects: enforcement
        reads them all every few seconds)."""
        return self._read(accounts.running_states, now)

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
        return self._run(
            funding.grant,
            username,
            kind,
            amount_micro,
            reason,
            idempotency_key,
            now,
            created_by=created_by,
            course=course,
        )

    def adjust(
        self, username: str, amount_micro: int, reason: str, idempotency_key: str, now: datetime
    ) -> tuple[TransactionRecord, bool]:
        """An admin's signed adjustment of the paid pool (``grant`` of kind adjustment)."""
        return self.grant(username, "adjustment", amount_micro, reason, idempotency_key, now)

    def transactions(self, username: str) -> list[TransactionRecord]:
        """The ledger of ``username``, oldest first."""
        return self._read(funding.transactions, username)

    def revenue_micro(self) -> int:
        """All charges so far, net of what final charges gave back: the sum of the shards."""
        return self._read(postings.revenue_micro)

    # -- price books -----------------------------------------------------------------------

    def price_book_at(self, when: datetime | None = None) -> tuple[int | None, PriceBook]:
        """The version in force at ``when`` (now when None): the newest published by then.

        Before any version is recorded, the settings' book (version None)."""
        return self._read(prices.book_at, when, self.settings_price_book)

    def price_books(self) -> list[PriceBookRecord]:
        """Every published version, newest first."""
        return self._read(prices.price_books)

    def publish_price_book(
        self, book: PriceBook, created_by: str, source: str, now: datetime
    ) -> tuple[PriceBookRecord, bool]:
        """Record ``book`` as the newest version unless it equals the newest one already."""
        return self._run(prices.publish, book, created_by, source, now)

    def sync_price_book(self, now: datetime) -> PriceBookRecord:
        """At start-up: the settings' book becomes a new version if it changed since the
        settings were last recorded (an admin's later version stays in force otherwise)."""
        if self._read(prices.last_settings_book) != prices.book_json(self.settings_price_book):
            self.publish_price_book(self.settings_price_book, "settings", "settings", now)
        return self.price_books()[0]

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
        check_admission_request(sku, price_class)
        price = self.price(sku, price_class)
        needed = cost_micro(price, count, self.min_billable_seconds)
        state, placed, replayed, refusal = self._run(
            admission.admit,
            username,
            sku,
            count,
            now,
            price_class,
            needed_micro=needed,
            hold=hold,
            idempotency_key=idempotency_key,
            course=course,
            terms=self._terms,
        )
        return decide(
            state,
            sku=sku,
            count=count,
            price_per_hour_micro=price,
            needed_micro=needed,
            now=now,
            min_billable_seconds=self.min_billable_seconds,
            course=course,
            hold=placed,
            replayed=replayed,
            refusal=refusal,
        )

    def release_hold(self, hold_id: str, now: datetime, reason: str = "released") -> HoldRecord:
        """Give a hold's credit back (a start failed); a released hold stays as it was."""
        return self._run(admission.release_hold, hold_id, now, reason)

    def holds(self, username: str, now: datetime) -> list[HoldRecord]:
        """Active holds of ``username``, oldest first."""
        return self._read(admission.active_holds, username, now)

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
        return self._run(
            sessions.start_session,
            session_id,
            username,
            server_name,
            sku,
            count,
            started_at,
            now,
            price_class,
            hold_id=hold_id,
            course=course,
            terms=self._terms,
        )

    def stop_session(self, session_id: str, ended_at: datetime, now: datetime) -> SessionRecord:
        """Settle a session: final seconds and cost, the final charge. Replays change nothing."""
        return self._run(sessions.stop_session, session_id, ended_at, now, self._terms)

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
        shard = (self._shard_base + worker) % ledger.REVENUE_SHARDS
        # self._write looked up now: a caller may wrap it (bench/billing_pg.py times batches)
        return charges.charge_pass(
            self._write, self._terms.revenue, now, interval_seconds, batch_size, shard
        )

    def running_count(self) -> int:
        """How many sessions are open."""
        return self._read(sessions.running_count)

    def mark_seen(self, session_ids: list[str], at: datetime) -> None:
        """Record that the servers of ``session_ids`` were seen running at ``at``."""
        if session_ids:
            self._run(sessions.mark_seen, session_ids, at)

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
        return self._read(sessions.sessions, username, state, since=since, until=until)

    # -- courses ---------------------------------------------------------------------------

    def course(self, slug: str) -> CourseRecord:
        """Course ``slug``; ``NotFound`` when there is none."""
        return self._read(courses.course, slug)

    def courses(
        self, *, instructor: str | None = None, student: str | None = None
    ) -> list[CourseRecord]:
        """Courses by name: all, those ``instructor`` teaches, or those ``student`` takes."""
        return self._read(courses.courses, instructor=instructor, student=student)

    def teaches(self, username: str, slug: str) -> bool:
        """Whether ``username`` is an instructor of course ``slug``."""
        return self._read(courses.teaches, username, slug)

    def is_instructor(self, username: str) -> bool:
        """Made an instructor by an admin (GitHub-team instructors have the hub's scope)."""
        return self._read(courses.is_instructor, username)

    def make_instructor(self, username: str, granted_by: str, now: datetime) -> bool:
        """Make ``username`` an instructor; False when they were one already."""
        return self._run(courses.make_instructor, username, granted_by, now)

    def create_course(
        self, instructor: str, rules: CourseRules, slug: str, now: datetime, join_code: bool
    ) -> CourseRecord:
        """A new course taught by ``instructor``; ``ValueError`` if the slug is taken."""
        return self._run(courses.create_course, instructor, rules, slug, now, join_code)

    def archive_course(self, slug: str, now: datetime) -> CourseRecord:
        """No new servers and no new weeks for it; its records stay."""
        return self._run(courses.archive_course, slug, now)

    def enroll(self, slug: str, username: str, source: str, now: datetime) -> bool:
        """Make ``username`` a student (their billing account opens too); True when new."""
        return self._run(courses.enroll, slug, username, source, now, self.trial_credit_micro)

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

    def set_fallback(self, slug: str, username: str, fallback: bool) -> None:
        """The student's choice: their own credit pays on when course hours run out."""
        self._run(courses.set_fallback, slug, username, fallback)

    def students(self, slug: str) -> list[tuple[str, str, bool]]:
        """(username, how they joined, fallback) of a course's students."""
        return self._read(courses.students, slug)

    def extra_hours(
        self,
        slug: str,
        username: str,
        hours: float,
        reason: str,
        key: str,
        by: str,
        now: datetime,
    ) -> tuple[TransactionRecord, bool]:
        """Grant ``username`` extra hours of the reference option for this week only."""
        return self._run(
            courses.extra_hours, slug, username, hours, reason, key, by, now, self._terms
        )

    def roll_course_weeks(self, now: datetime) -> int:
        """Grant the new week to every student with a running course session (the charge
        pass runs this first, so a session crossing the boundary is split there)."""
        pairs = self._read(courses.running_students)
        for slug, username in pairs:
            self._run(
                lambda db, s=slug, u=username: courses.ensure_week(
                    db, courses.course_row(db, s), u, now, self._terms
                )
            )
        return len(pairs)

    def student_courses(self, username: str, now: datetime) -> list[StudentCourse]:
        """The user's active courses with what is left this week (weeks granted first)."""
        return self._run(courses.student_courses, username, now, self._terms)

    def roster_usage(
        self, slug: str, at: datetime
    ) -> tuple[CourseRecord, datetime, datetime, list[dict[str, Any]]]:
        """Per student of the course: GPU-seconds, sessions and cost of course sessions in the
        week containing ``at`` (sessions crossing a boundary count their part only)."""
        return self._read(courses.roster_usage, slug, at)

    # -- the ledger check ------------------------------------------------------------------

    def check_ledger(self) -> list[LedgerProblem]:
        """Everything that would make the books wrong; an empty list means they balance
        (what is checked: :func:`.check.check_ledger`)."""
        return self._read(check.check_ledger)
