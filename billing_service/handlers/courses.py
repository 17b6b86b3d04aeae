"""Courses: instructors run them, students join them, admins see everything.

Who may do what:

- an **instructor** has the hub scope ``custom:gputap-billing:instructor`` (given by the hub to
  the settings' instructors and instructor teams) or was made one by a billing admin
  (``PUT api/instructors/{username}``); they create courses and act on those they teach only;
- a **student** sees the courses they take (no join code, no roster) and their own hours;
- **admins** (and the hub, for reading) see and act on every course.

A course that exists but is not the caller's answers 404, as an unknown one does: its name
and rules are not disclosed to others.
"""

from __future__ import annotations

import functools
import logging
import re
from datetime import datetime, time
from typing import Any
from zoneinfo import ZoneInfo

from tornado import web

from gputap_common.github_names import login_name
from gputap_common.scopes import BILLING_INSTRUCTOR

from ..domain.courses import (
    COURSE_FIELDS,
    CourseRecord,
    course_rules,
    max_workers_field,
    slug_of,
)
from ..domain.errors import JoinRateLimited
from ..domain.usage import csv_text
from .base import APIHandler
from .fields import MAX_LENGTH, check_text, optional_text, text_field
from .views import course_view, student_course_view, transaction_view

log = logging.getLogger("billing")


class CourseHandler(APIHandler):
    """Shared checks of who may see and run a course."""

    async def may_teach(self) -> bool:
        if self.is_admin or BILLING_INSTRUCTOR in self.scopes:
            return True
        return self.caller_is_user and await self.blocking(self.store.is_instructor, self.caller)

    async def course_for(self, slug: str, *, teach: bool) -> tuple[CourseRecord, bool]:
        """The course if the caller may see it (``teach``: run it); (course, full view)."""
        check_text(slug, "course", MAX_LENGTH["course"])
        hidden = web.HTTPError(404, f"No course {slug!r} of yours")
        try:
            course = await self.blocking(self.store.course, slug)
        except web.HTTPError:
            raise hidden from None
        if self.is_admin or (self.is_hub and not teach):
            return course, True
        if self.caller_is_user and self.caller in course.instructors:
            return course, True
        if not teach and self.caller_is_user:
            taken = await self.blocking(self.store.courses, student=self.caller)
            if any(c.slug == slug for c in taken):
                return course, False
        raise hidden


class CoursesHandler(CourseHandler):
    @web.authenticated
    async def get(self) -> None:
        if self.sees_everyone:
            view = functools.partial(course_view, full=True)
            await self.write_records("courses", view, self.store.courses)
            return
        taught = await self.blocking(self.store.courses, instructor=self.caller)
        taken = await self.blocking(self.store.courses, student=self.caller)
        self.write_json(
            {
                "courses": [course_view(c, full=True) for c in taught]
                + [course_view(c, full=False) for c in taken if c not in taught]
            }
        )

    @web.authenticated
    async def post(self) -> None:
        if not await self.may_teach():
            raise web.HTTPError(403, "Only instructors may create courses; ask an admin")
        body = self.body((*COURSE_FIELDS, "slug", "join_code"))
        skus = set((await self.blocking(self.store.price_book_at))[1].skus())
        try:
            known = skus | self._slice_skus(body, skus)
            rules = course_rules(body, known, self.config.environments)
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None
        slug = optional_text(body, "slug") or slug_of(rules.name)
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{1,62}", slug):
            raise web.HTTPError(400, f"slug must be 2-63 of a-z, 0-9 and -, not {slug!r}")
        join_code = body.get("join_code", True)
        if not isinstance(join_code, bool):
            raise web.HTTPError(400, "join_code must be true (make one) or false")
        course = await self.blocking(
            self.store.create_course, self.caller, rules, slug, self.now(), join_code
        )
        self.write_json(course_view(course, full=True), 201)

    def _slice_skus(self, body: dict[str, Any], configured: set[str]) -> set[str]:
        """Slices and shares priced by rule (CARD/<g>g.<m>gb, CARD/shared) of priced cards."""
        allowed = body.get("allowed")
        if not isinstance(allowed, list):
            return set()
        book = self.store.settings_price_book
        return {
            sku
            for sku in allowed
            if isinstance(sku, str) and "/" in sku and book.price(sku) is not None
        }


class CourseDetailHandler(CourseHandler):
    @web.authenticated
    async def get(self, slug: str) -> None:
        course, full = await self.course_for(slug, teach=False)
        self.write_json(course_view(course, full=full))

    @web.authenticated
    async def patch(self, slug: str) -> None:
        """Edit a course's rules; ``max_workers`` is the one that may change after creation."""
        await self.course_for(slug, teach=True)
        body = self.body(("max_workers",))
        if "max_workers" not in body:
            raise web.HTTPError(400, "Missing field 'max_workers': the rule to change")
        try:
            max_workers = max_workers_field(body["max_workers"])
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None
        course = await self.blocking(self.store.set_max_workers, slug, max_workers)
        log.info("Course %s: max_workers set to %s by %s", slug, max_workers, self.caller)
        self.write_json(course_view(course, full=True))


class ArchiveHandler(CourseHandler):
    @web.authenticated
    async def post(self, slug: str) -> None:
        await self.course_for(slug, teach=True)
        course = await self.blocking(self.store.archive_course, slug, self.now())
        self.write_json(course_view(course, full=True))


class StudentsHandler(CourseHandler):
    @web.authenticated
    async def get(self, slug: str) -> None:
        await self.course_for(slug, teach=True)
        students = await self.blocking(self.store.students, slug)
        self.write_json(
            {
                "students": [
                    {"username": name, "joined_by": source, "fallback": fallback}
                    for name, source, fallback in students
                ]
            }
        )

    @web.authenticated
    async def post(self, slug: str) -> None:
        await self.course_for(slug, teach=True)
        username = text_field(self.body(("username",)), "username")
        check_text(username, "username", MAX_LENGTH["username"])
        await self.require_hub_user(username)
        created = await self.blocking(self.store.enroll, slug, username, "instructor", self.now())
        self.write_saved({"username": username, "course": slug}, created)


class CourseGrantsHandler(CourseHandler):
    @web.authenticated
    async def post(self, slug: str) -> None:
        await self.course_for(slug, teach=True)
        body = self.body(("username", "hours", "reason", "idempotency_key"))
        username = text_field(body, "username")
        hours = body.get("hours")
        if isinstance(hours, bool) or not isinstance(hours, int | float) or not 0 < hours <= 168:
            raise web.HTTPError(
                400, f"hours must be a number above 0 and at most 168, not {hours!r}"
            )
        tx, created = await self.blocking(
            self.store.extra_hours,
            slug,
            username,
            float(hours),
            text_field(body, "reason"),
            text_field(body, "idempotency_key"),
            self.caller,
            self.now(),
        )
        self.write_saved(transaction_view(tx), created)


class RosterUsageHandler(CourseHandler):
    """This week's (or ``?week=``'s) usage of a course's students."""

    #: answer as a CSV download (``usage.csv``) instead of JSON
    csv = False

    @web.authenticated
    async def get(self, slug: str) -> None:
        await self.course_for(slug, teach=True)
        week = self.get_argument("week", None)
        at = self.now()
        if week is not None:
            try:
                day = datetime.strptime(week, "%Y-%m-%d")
            except ValueError:
                raise web.HTTPError(
                    400, f"week must be a date like 2025-03-03, not {week!r}"
                ) from None
            if not 2000 <= day.year <= 2099:
                raise web.HTTPError(400, "week must be a date from 2000 to 2099")
            course = await self.blocking(self.store.course, slug)
            at = datetime.combine(day.date(), time(12), tzinfo=ZoneInfo(course.timezone))
        _, start, end, rows = await self.blocking(self.store.roster_usage, slug, at)
        if self.csv:
            columns = ("username", "gpu_seconds", "gpu_hours", "sessions", "cost")
            text = csv_text(columns, ([row[c] for c in columns] for row in rows))
            self.write_csv(f"{slug}-{start:%Y-%m-%d}.csv", text)
            return
        self.write_json(
            {
                "course": slug,
                "week_start": start.isoformat(),
                "week_end": end.isoformat(),
                "students": rows,
            }
        )


class RosterUsageCSVHandler(RosterUsageHandler):
    csv = True


class JoinHandler(CourseHandler):
    @web.authenticated
    async def post(self) -> None:
        if not self.caller_is_user:
            raise web.HTTPError(400, "Only users join courses")
        code = text_field(self.body(("code",)), "code")
        check_text(code, "code", 64)
        try:
            course = await self.blocking(self.store.join, self.caller, code.strip(), self.now())
        except JoinRateLimited as e:
            raise web.HTTPError(429, str(e)) from None
        self.write_json(course_view(course, full=False))


class EnrollmentHandler(CourseHandler):
    @web.authenticated
    async def put(self, slug: str) -> None:
        check_text(slug, "course", MAX_LENGTH["course"])
        fallback = self.body(("fallback",)).get("fallback")
        if not isinstance(fallback, bool):
            raise web.HTTPError(400, "fallback must be true (pay on with my credit) or false")
        await self.blocking(self.store.set_fallback, slug, self.caller, fallback)
        self.write_json({"course": slug, "username": self.caller, "fallback": fallback})


class StudentCoursesHandler(CourseHandler):
    @web.authenticated
    async def get(self, username: str) -> None:
        self.require_reader_of(username)
        read = self.store.student_courses
        await self.write_records("courses", student_course_view, read, username, self.now())


class InstructorsHandler(CourseHandler):
    @web.authenticated
    async def put(self, username: str) -> None:
        self.require_admin()
        try:
            # lower case, as the hub names its users; a path or a control character never is one
            username = login_name(username, "An instructor's username")
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None
        created = await self.blocking(self.store.make_instructor, username, self.caller, self.now())
        self.write_saved({"username": username, "instructor": True}, created)


default_handlers = [
    (r"api/courses", CoursesHandler),
    # before api/courses/([^/]+), which would take "join" for a course's slug
    (r"api/courses/join", JoinHandler),
    (r"api/courses/([^/]+)", CourseDetailHandler),
    (r"api/courses/([^/]+)/archive", ArchiveHandler),
    (r"api/courses/([^/]+)/students", StudentsHandler),
    (r"api/courses/([^/]+)/grants", CourseGrantsHandler),
    (r"api/courses/([^/]+)/usage", RosterUsageHandler),
    (r"api/courses/([^/]+)/usage\.csv", RosterUsageCSVHandler),
    (r"api/courses/([^/]+)/enrollment", EnrollmentHandler),
    (r"api/accounts/([^/]+)/courses", StudentCoursesHandler),
    (r"api/instructors/([^/]+)", InstructorsHandler),
]
