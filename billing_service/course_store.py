"""Courses on the database: rules, instructors, students, weekly allowances, roster usage.

A mixin of :class:`billing_service.store.Store` (it uses the store's transactions and ledger
primitives). The week's allowance is granted lazily, the first time billing touches a student
of a course in a new week (an admission, a charge pass, a stop, a view): first the student's
running course sessions are charged up to the boundary from the old week's pool (the session
crossing it is split exactly there), then what is left of the old week expires (a negative
balance, enforcement's overrun, is written off too), then the new week is granted under the key
``allowance:{course}:{user}:{week start}``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gputap_common.money import format_credits

from .domain import ledger
from .domain.courses import (
    JOIN_ATTEMPTS,
    JOIN_WINDOW,
    CourseRecord,
    CourseRules,
    StudentCourse,
    new_join_code,
    overlap_seconds,
)
from .domain.errors import JoinRateLimited, NotFound
from .domain.money import billed_seconds, cost_micro
from .orm import (
    Account,
    BillingSession,
    Course,
    CourseInstructor,
    Enrollment,
    Hold,
    Instructor,
    JoinAttempt,
    LedgerAccount,
    LedgerTransaction,
    Posting,
)


def _course_record(row: Course, instructors: list[str]) -> CourseRecord:
    return CourseRecord(
        slug=row.slug,
        name=row.name,
        weekly_seconds=row.weekly_seconds,
        allowed=tuple(json.loads(row.allowed)),
        max_concurrent_gpus=row.max_concurrent_gpus,
        budget_cap_micro=row.budget_cap_micro,
        github_team=row.github_team,
        join_code=row.join_code,
        reset_weekday=row.reset_weekday,
        reset_time=row.reset_time,
        timezone=row.timezone,
        created_by=row.created_by,
        created_at=row.created_at,
        archived_at=row.archived_at,
        instructors=tuple(sorted(instructors)),
    )


class CourseOps:
    """Course operations; mixed into Store."""

    # -- records -----------------------------------------------------------------------

    def _course_row(self, db: Session, slug: str) -> Course:
        row = db.get(Course, slug)
        if row is None:
            raise NotFound(f"No course {slug!r}")
        return row

    def _course(self, db: Session, row: Course) -> CourseRecord:
        names = db.scalars(
            select(CourseInstructor.username).where(CourseInstructor.course == row.slug)
        ).all()
        return _course_record(row, list(names))

    def course(self, slug: str) -> CourseRecord:
        with self._sessionmaker() as db:
            return self._course(db, self._course_row(db, slug))

    def courses(
        self, *, instructor: str | None = None, student: str | None = None
    ) -> list[CourseRecord]:
        """Courses by name: all, those ``instructor`` teaches, or those ``student`` takes."""
        query = select(Course).order_by(Course.name, Course.slug)
        if instructor is not None:
            taught = select(CourseInstructor.course).where(CourseInstructor.username == instructor)
            query = query.where(Course.slug.in_(taught))
        if student is not None:
            taken = select(Enrollment.course).where(Enrollment.username == student)
            query = query.where(Course.slug.in_(taken))
        with self._sessionmaker() as db:
            return [self._course(db, row) for row in db.scalars(query)]

    def teaches(self, username: str, slug: str) -> bool:
        with self._sessionmaker() as db:
            return db.get(CourseInstructor, (slug, username)) is not None

    def is_instructor(self, username: str) -> bool:
        """Made an instructor by an admin (GitHub-team instructors have the hub's scope)."""
        with self._sessionmaker() as db:
            return db.get(Instructor, username) is not None

    def make_instructor(self, username: str, granted_by: str, now: datetime) -> bool:
        def work(db: Session) -> bool:
            if db.get(Instructor, username) is not None:
                return False
            db.add(Instructor(username=username, granted_by=granted_by, created_at=now))
            return True

        return self._write(work)

    # -- instructors' actions ----------------------------------------------------------

    def create_course(
        self, instructor: str, rules: CourseRules, slug: str, now: datetime, join_code: bool
    ) -> CourseRecord:
        """A new course taught by ``instructor``; ``ValueError`` if the slug is taken."""

        def work(db: Session) -> CourseRecord:
            if db.get(Course, slug) is not None:
                raise ValueError(f"slug: a course {slug!r} exists already; choose another slug")
            row = Course(
                slug=slug,
                name=rules.name,
                weekly_seconds=round(rules.weekly_hours * 3600),
                allowed=json.dumps(list(rules.allowed)),
                max_concurrent_gpus=rules.max_concurrent_gpus,
                budget_cap_micro=rules.budget_cap_micro,
                github_team=rules.github_team,
                join_code=new_join_code() if join_code else None,
                reset_weekday=rules.reset_weekday,
                reset_time=rules.reset_time.strftime("%H:%M"),
                timezone=rules.timezone,
                created_by=instructor,
                created_at=now,
            )
            db.add(row)
            db.add(CourseInstructor(course=slug, username=instructor))
            db.flush()
            return self._course(db, row)

        return self._write(work)

    def archive_course(self, slug: str, now: datetime) -> CourseRecord:
        """No new servers and no new weeks for it; its records stay."""

        def work(db: Session) -> CourseRecord:
            row = self._course_row(db, slug)
            if row.archived_at is None:
                row.archived_at = now
                row.join_code = None
            return self._course(db, row)

        return self._write(work)

    def enroll(self, slug: str, username: str, source: str, now: datetime) -> bool:
        """Make ``username`` a student (their billing account opens too); True when new."""

        def work(db: Session) -> bool:
            row = self._course_row(db, slug)
            if row.archived_at is not None:
                raise ValueError(f"{row.name} is archived and takes no new students")
            self._open(db, username, now)
            if db.get(Enrollment, (slug, username)) is not None:
                return False
            db.add(
                Enrollment(
                    course=slug, username=username, source=source, fallback=False, created_at=now
                )
            )
            return True

        return self._write(work)

    def enroll_by_groups(self, username: str, groups: list[str], now: datetime) -> list[str]:
        """At login: enrol ``username`` in every active course bound to one of their teams."""
        if not groups:
            return []
        with self._sessionmaker() as db:
            slugs = db.scalars(
                select(Course.slug).where(
                    Course.github_team.in_(groups), Course.archived_at.is_(None)
                )
            ).all()
        return [slug for slug in slugs if self.enroll(slug, username, "team", now)]

    def join(self, username: str, code: str, now: datetime) -> CourseRecord:
        """Join the course with join code ``code``; wrong codes are counted and limited."""

        def work(db: Session) -> CourseRecord | str:
            recent = db.scalar(
                select(func.count())
                .select_from(JoinAttempt)
                .where(JoinAttempt.username == username, JoinAttempt.created_at > now - JOIN_WINDOW)
            )
            if recent >= JOIN_ATTEMPTS:
                return "limited"
            row = db.scalar(
                select(Course).where(Course.join_code == code, Course.archived_at.is_(None))
            )
            if row is None:  # counted (committed) before the refusal
                db.add(JoinAttempt(username=username, created_at=now))
                return "wrong"
            return self._course(db, row)

        course = self._write(work)
        if course == "wrong":
            raise ValueError(
                "code: no active course has that join code; check it with your instructor"
            )
        if course == "limited":
            raise JoinRateLimited(
                f"Too many wrong join codes: try again in {JOIN_WINDOW.seconds // 60} minutes"
            )
        self.enroll(course.slug, username, "code", now)
        return course

    def set_fallback(self, slug: str, username: str, fallback: bool) -> None:
        """The student's choice: their own credit pays on when course hours run out."""

        def work(db: Session) -> None:
            row = db.get(Enrollment, (slug, username))
            if row is None:
                raise NotFound(f"{username} is not a student of {slug!r}")
            row.fallback = fallback

        self._write(work)

    def students(self, slug: str) -> list[tuple[str, str, bool]]:
        """(username, how they joined, fallback) of a course's students."""
        with self._sessionmaker() as db:
            self._course_row(db, slug)
            return [
                (row.username, row.source, row.fallback)
                for row in db.scalars(
                    select(Enrollment)
                    .where(Enrollment.course == slug)
                    .order_by(Enrollment.username)
                )
            ]

    def extra_hours(
        self,
        slug: str,
        username: str,
        hours: float,
        reason: str,
        key: str,
        by: str,
        now: datetime,
    ):
        """Grant ``username`` extra hours of the reference option for this week only."""

        def work(db: Session):
            row = self._course_row(db, slug)
            if db.get(Enrollment, (slug, username)) is None:
                raise ValueError(f"username: {username} is not a student of {row.name}")
            existing = db.scalar(
                select(LedgerTransaction).where(LedgerTransaction.idempotency_key == f"grant:{key}")
            )
            if existing is not None:
                return self._transaction_record(db, existing), False
            self._ensure_week(db, row, username, now)
            account = self._account(db, username)
            course = self._course(db, row)
            amount = cost_micro(self._reference_price(course, now), 1, round(hours * 3600))
            if amount <= 0:
                raise ValueError("hours: too few to be worth a micro-credit")
            pool = self._allowance_pool(db, account, slug)
            tx = self._post(
                db,
                key=f"grant:{key}",
                kind="allowance",
                account_id=account.id,
                moves=[
                    (pool, amount),
                    (self._system(db, ledger.counter_account("allowance")), -amount),
                ],
                now=now,
                memo=f"{row.name}: {hours:g} extra h this week ({reason})",
                created_by=by,
            )
            return self._transaction_record(db, tx), True

        return self._write(work)

    # -- weeks -------------------------------------------------------------------------

    def _reference_price(self, course: CourseRecord, at: datetime) -> int:
        book = self.price_book_at(at)[1]
        return max((book.price(sku) or 0) for sku in course.allowed)

    def _allowance_pool(self, db: Session, account: Account, slug: str) -> LedgerAccount:
        code = ledger.pool_code(account.username, "allowance", slug)
        return self._ledger_account(db, code, account.id, "allowance", slug)

    def _ensure_week(self, db: Session, row: Course, username: str, now: datetime) -> None:
        """Grant this week's allowance if not yet (see the module docstring)."""
        course = self._course(db, row)
        start, _ = course.week(now)
        key = f"allowance:{row.slug}:{username}:{start.isoformat()}"
        if db.scalar(select(LedgerTransaction.id).where(LedgerTransaction.idempotency_key == key)):
            return
        account = self._account(db, username)
        if account is None:
            account, _ = self._open(db, username, now)
        crossing = db.scalars(
            select(BillingSession)
            .where(
                BillingSession.account_id == account.id,
                BillingSession.course == row.slug,
                BillingSession.ended_at.is_(None),
                BillingSession.started_at < start,
            )
            .order_by(BillingSession.id)
            .with_for_update()
        ).all()
        for session in crossing:
            target = cost_micro(
                session.price_per_hour_micro,
                session.count,
                billed_seconds(session.started_at, start),
            )
            if target > session.charged_micro:
                self._charge_to(
                    db, session, target, f"charge:{session.id}:week:{start.isoformat()}", now
                )
        pool = self._allowance_pool(db, account, row.slug)
        db.refresh(pool)
        counter = self._system(db, ledger.counter_account("allowance"))
        if pool.balance_micro:
            self._post(
                db,
                key=f"allowance-expiry:{row.slug}:{username}:{start.isoformat()}",
                kind="allowance-expiry",
                account_id=account.id,
                moves=[(pool, -pool.balance_micro), (counter, pool.balance_micro)],
                now=now,
                memo=f"{row.name}: last week's hours expire",
            )
        if row.archived_at is not None:
            return
        amount = cost_micro(self._reference_price(course, start), 1, row.weekly_seconds)
        if row.budget_cap_micro is not None:
            amount = max(0, min(amount, row.budget_cap_micro - self._course_spent(db, row.slug)))
        if amount:
            self._post(
                db,
                key=key,
                kind="allowance",
                account_id=account.id,
                moves=[(pool, amount), (counter, -amount)],
                now=now,
                memo=f"{row.name}: {row.weekly_seconds / 3600:g} h, week of {start:%Y-%m-%d}",
            )

    def _course_spent(self, db: Session, slug: str) -> int:
        """Credits a course has granted and not taken back: what it has spent or still owes."""
        total = db.scalar(
            select(func.coalesce(func.sum(Posting.amount_micro), 0))
            .join(LedgerAccount, LedgerAccount.id == Posting.ledger_account_id)
            .join(LedgerTransaction, LedgerTransaction.id == Posting.transaction_id)
            .where(
                LedgerAccount.pool == "allowance",
                LedgerAccount.course == slug,
                LedgerTransaction.kind.in_(("allowance", "allowance-expiry")),
            )
        )
        return int(total)

    def roll_course_weeks(self, now: datetime) -> int:
        """Grant the new week to every student with a running course session (the charge
        pass runs this first, so a session crossing the boundary is split there)."""
        with self._sessionmaker() as db:
            pairs = db.execute(
                select(BillingSession.course, BillingSession.username)
                .where(BillingSession.ended_at.is_(None), BillingSession.course != "")
                .distinct()
            ).all()
        for slug, username in pairs:
            self._write(
                lambda db, s=slug, u=username: self._ensure_week(db, db.get(Course, s), u, now)
            )
        return len(pairs)

    # -- what students and instructors see ---------------------------------------------

    def student_courses(self, username: str, now: datetime) -> list[StudentCourse]:
        """The user's active courses with what is left this week (weeks granted first)."""

        def work(db: Session) -> list[StudentCourse]:
            account = self._account(db, username)
            rows = db.execute(
                select(Course, Enrollment.fallback)
                .join(Enrollment, Enrollment.course == Course.slug)
                .where(Enrollment.username == username, Course.archived_at.is_(None))
                .order_by(Course.name)
            ).all()
            result = []
            for row, fallback in rows:
                self._ensure_week(db, row, username, now)
                course = self._course(db, row)
                start, end = course.week(now)
                state = self._state(db, account or self._account(db, username), now)
                book = self.price_book_at(now)[1]
                result.append(
                    StudentCourse(
                        course=course,
                        fallback=fallback,
                        week_start=start,
                        week_end=end,
                        left_micro=state.course_available_at(row.slug, now),
                        prices={sku: book.price(sku) or 0 for sku in course.allowed},
                    )
                )
            return result

        return self._write(work)

    def course_admission(
        self, db: Session, account: Account, slug: str, sku: str, count: int, now: datetime
    ) -> tuple[CourseRecord, bool]:
        """Check a course-funded spawn's rules (ValueError names the broken one) and grant the
        week; returns the course and whether the student pays on from their own credit."""
        row = db.get(Course, slug)
        if row is None or row.archived_at is not None:
            raise ValueError(f"course: no active course {slug!r}")
        course = self._course(db, row)
        enrollment = db.get(Enrollment, (slug, account.username))
        if enrollment is None:
            raise ValueError(
                f"course: you are not a student of {course.name}; join it with its code or "
                "ask its instructor"
            )
        if sku not in course.allowed:
            raise ValueError(
                f"{course.name} pays for {', '.join(course.allowed)} only, not {sku}. Pick one "
                "of those, or start without the course to pay with your own credit."
            )
        used = db.scalar(
            select(func.coalesce(func.sum(BillingSession.count), 0)).where(
                BillingSession.account_id == account.id,
                BillingSession.course == slug,
                BillingSession.ended_at.is_(None),
            )
        )
        held = db.scalar(
            select(func.coalesce(func.sum(Hold.count), 0)).where(
                Hold.account_id == account.id,
                Hold.course == slug,
                Hold.released_at.is_(None),
                Hold.expires_at > now,
            )
        )
        if used + held + count > course.max_concurrent_gpus:
            raise ValueError(
                f"{course.name} allows {course.max_concurrent_gpus} GPU(s) at once per student; "
                f"you have {used + held} running or starting"
            )
        self._ensure_week(db, row, account.username, now)
        return course, enrollment.fallback

    def roster_usage(
        self, slug: str, at: datetime
    ) -> tuple[CourseRecord, datetime, datetime, list[dict[str, Any]]]:
        """Per student of the course: GPU-seconds, sessions and cost of course sessions in the
        week containing ``at`` (sessions crossing a boundary count their part only)."""
        with self._sessionmaker() as db:
            course = self._course(db, self._course_row(db, slug))
            start, end = course.week(at)
            usage: dict[str, dict[str, int]] = defaultdict(
                lambda: {"gpu_seconds": 0, "sessions": 0, "cost_micro": 0}
            )
            for name in db.scalars(select(Enrollment.username).where(Enrollment.course == slug)):
                usage[name]
            for s in db.scalars(
                select(BillingSession).where(
                    BillingSession.course == slug,
                    BillingSession.started_at < end,
                    (BillingSession.ended_at.is_(None)) | (BillingSession.ended_at > start),
                )
            ):
                seconds = overlap_seconds(s.started_at, s.ended_at or at, start, end)
                row = usage[s.username]
                row["gpu_seconds"] += seconds * s.count
                row["sessions"] += 1
                row["cost_micro"] += cost_micro(s.price_per_hour_micro, s.count, seconds)
        rows = [
            {
                "username": name,
                **values,
                "gpu_hours": values["gpu_seconds"] / 3600,
                "cost": format_credits(values["cost_micro"]),
            }
            for name, values in sorted(usage.items())
        ]
        return course, start, end, rows
