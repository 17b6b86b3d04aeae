"""The pages: the user's billing page, the admin page, the courses page. Browsers log in
through the hub (OAuth, ``oauth_callback``); the pages' own fetches go to the JSON API with the
login cookie and the XSRF token."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from jupyterhub.services.auth import HubOAuthCallbackHandler
from tornado import web

from gputap_common.hours import format_hours
from gputap_common.money import format_credits
from gputap_common.scopes import BILLING_ADMIN

from ..domain import ledger
from ..domain.courses import WEEKDAYS
from ..domain.usage import daily_gpu_hours
from .base import BaseHandler
from .chart import chart_view
from .courses import CourseHandler
from .views import course_view, price_book_view, session_view, student_course_view

#: days of GPU-hours the user's page charts: two weeks fit a phone's screen, a row a day
CHART_DAYS = 14


class HubPage:
    """A page in the hub's frame (templates/page.html): the hub's stylesheet and scripts,
    served by the hub, and the hub's navigation bar with gputap's links (docs/billing.md,
    "Pages"). Mixed into billing's page handlers."""

    def get_template_namespace(self) -> dict[str, Any]:
        namespace = super().get_template_namespace()  # type: ignore[misc]
        hub = self.hub_auth.hub_prefix  # type: ignore[attr-defined]
        service = self.settings.get("service_prefix", "/services/billing/")  # type: ignore[attr-defined]
        user = self.current_user or {}  # type: ignore[attr-defined]
        namespace["nav"] = {
            "hub": hub,
            "static": f"{hub}static/",
            "user": user.get("name", ""),
            # the hub shows its Admin link to holders of admin-ui: the hub's admins
            "hub_admin": bool(user.get("admin")),
            "billing_admin": BILLING_ADMIN in (user.get("scopes") or []),
            "billing": service,
            "courses": f"{service}courses",
            "admin": f"{service}admin",
            "here": self.request.path,  # type: ignore[attr-defined]
        }
        return namespace


class PageHandler(HubPage, BaseHandler):
    """The user's billing page; browsers log in through the hub (OAuth)."""

    @web.authenticated
    async def get(self) -> None:
        self.require_user("The billing page")
        now = self.now()
        state, _ = await self.blocking(self.store.open_account, self.caller, now)
        since = datetime(now.year, now.month, now.day, tzinfo=now.tzinfo) - timedelta(
            days=CHART_DAYS - 1
        )
        recent = await self.blocking(self.store.sessions, self.caller, since=since)
        ended = await self.blocking(self.store.sessions, self.caller, "ended")
        paid = await self.blocking(self.store.session_funding, [s.id for s in ended])
        taken = await self.blocking(self.store.student_courses, self.caller, now)
        self.render(
            "billing.html",
            account=self.account_json(state, now),
            ended=[session_view(s, now, paid.get(s.id, ())) for s in ended],
            courses={t.course.slug: student_course_view(t) for t in taken},
            prices={t.course.slug: {k: v for k, v in t.prices.items() if v} for t in taken},
            hours=format_hours,
            chart=chart_view(daily_gpu_hours(recent, now, since, None)),
            api_url=self.request.path.rstrip("/") + "/api/me",
            # the page's fetches are cookie-authenticated: HubOAuth checks this token
            xsrf=self.xsrf_text,
            when=page_time,
            duration=page_duration,
            rate=lambda s: format_credits(s["price_per_hour_micro"] * s["count"]),
        )


class AdminPageHandler(HubPage, BaseHandler):
    """Billing admins: every account, funding, the price book versions, usage export."""

    @web.authenticated
    async def get(self) -> None:
        self.require_admin()
        now = self.now()
        states = await self.blocking(self.store.accounts, now)
        books = await self.blocking(self.store.price_books)
        self.render(
            "admin.html",
            accounts=[self.account_json(s, now) for s in states],
            books=[price_book_view(b) for b in books],
            kinds=ledger.FUNDING_KINDS,
            api_base=self.request.path.rsplit("/admin", 1)[0] + "/api/",
            xsrf=self.xsrf_text,
            when=page_time,
        )


def page_time(iso: str | None) -> str:
    """ISO 8601 UTC as the page shows it: "2026-11-29 18:51:34 UTC"."""
    return f"{iso[:19].replace('T', ' ')} UTC" if iso else ""


def page_duration(seconds: int) -> str:
    """Time left as "2 h 05 min", "45 min" or "under 1 min"."""
    if seconds < 60:
        return "under 1 min"
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"


class CoursesPageHandler(HubPage, CourseHandler):
    """The courses page: a student's courses and hours, the join form; for instructors their
    courses with this week's roster usage and the form to create one."""

    def get_login_url(self) -> str:
        return BaseHandler.get_login_url(self)

    def set_default_headers(self) -> None:
        self.set_header("Cache-Control", "no-store")

    @web.authenticated
    async def get(self) -> None:
        self.require_user("The courses page")
        now = self.now()
        taken = await self.blocking(self.store.student_courses, self.caller, now)
        teaching = await self.may_teach()
        taught = await self.blocking(self.store.courses, instructor=self.caller)
        usage = {}
        for course in taught:
            usage[course.slug] = (await self.blocking(self.store.roster_usage, course.slug, now))[3]
        book = (await self.blocking(self.store.price_book_at))[1]
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.render(
            "courses.html",
            username=self.caller,
            taken=[student_course_view(t) for t in taken],
            teaching=teaching,
            taught=[course_view(c, full=True) for c in taught],
            usage=usage,
            options=sorted(s for s in book.skus() if s != "cpu"),
            weekdays=WEEKDAYS,
            hours=format_hours,
            api_base=self.request.path.rsplit("/courses", 1)[0] + "/api/",
            xsrf=self.xsrf_text,
        )


default_handlers = [
    (r"oauth_callback", HubOAuthCallbackHandler),
    (r"admin", AdminPageHandler),
    (r"courses", CoursesPageHandler),
    # the prefix itself, matched whole (tornado anchors every route): the user's page
    (r"", PageHandler),
]
