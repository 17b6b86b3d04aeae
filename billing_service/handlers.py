"""REST API and the user's billing page. Thin: parse, authorize, call the store, render."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import yaml
from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated, UserNotAllowed
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado import web

from gputap_common import clock
from gputap_common.money import format_credits
from gputap_common.scopes import BILLING_ACCESS, BILLING_ADMIN, BILLING_HUB, BILLING_METRICS

from . import metrics
from .config import BillingConfig
from .domain import ledger
from .domain.errors import NotFound
from .domain.money import parse_credits
from .domain.pricing import PRICE_CLASSES, make_price_book
from .domain.usage import daily_gpu_hours, usage_csv
from .fields import (
    MAX_LENGTH,
    MAX_PATH_LENGTH,
    check_text,
    count_field,
    optional_text,
    price_class_field,
    text_field,
    time_argument,
    time_field,
)
from .store import Store
from .views import (
    account_view,
    hold_view,
    price_book_view,
    session_view,
    transaction_view,
)

log = logging.getLogger("billing")

T = TypeVar("T")

#: days of GPU-hours the user's page charts
CHART_DAYS = 30


class BaseHandler(HubOAuthenticated, web.RequestHandler):
    """Hub-authenticated handler; the caller is resolved before the verb runs."""

    def initialize(self, store: Store, executor, config: BillingConfig) -> None:
        self.store = store
        self.executor = executor
        self.config = config
        self.currency = config.currency

    def account_json(self, state, now: datetime) -> dict[str, Any]:
        return account_view(state, now, self.currency, self.config.warning_seconds)

    async def prepare(self) -> None:
        # resolve the hub user asynchronously, so the event loop never blocks on the hub
        model = await self.hub_auth.get_user(self, sync=False)
        if model is None:
            self._hub_auth_user_cache = None
            return
        try:
            self._hub_auth_user_cache = self.check_hub_user(model)
        except UserNotAllowed:
            self._hub_auth_user_cache = None
            raise web.HTTPError(
                403,
                f"{model.get('kind', 'user')} {model['name']} may not use billing: "
                f"it needs the scope {BILLING_ACCESS}",
            ) from None
        # a username or id in the path is looked up or stored: refuse what no column holds
        for value in self.path_args:
            check_text(value, "A username or id in the path", MAX_PATH_LENGTH)

    # who is asking

    @property
    def scopes(self) -> set[str]:
        return set(self.current_user.get("scopes") or [])

    @property
    def is_hub(self) -> bool:
        return BILLING_HUB in self.scopes

    @property
    def is_admin(self) -> bool:
        return BILLING_ADMIN in self.scopes

    def require_hub(self) -> None:
        if not self.is_hub:
            raise web.HTTPError(403, f"Only the hub may do this; it needs the scope {BILLING_HUB}")

    def require_admin(self) -> None:
        if not self.is_admin:
            raise web.HTTPError(403, f"Only billing admins may do this (scope {BILLING_ADMIN})")

    def require_reader_of(self, username: str) -> None:
        """The hub, billing admins, and the user themselves may read a user's billing."""
        if self.is_hub or self.is_admin:
            return
        if (
            self.current_user.get("kind", "user") == "user"
            and self.current_user["name"] == username
        ):
            return
        raise web.HTTPError(403, f"You may read only your own billing, not {username!r}'s")

    # doing it

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run store work on the single database thread; domain errors become 400/404."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.executor, fn, *args)
        except NotFound as e:
            raise web.HTTPError(404, str(e)) from None
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None

    def now(self) -> datetime:
        return clock.utcnow()

    @property
    def caller(self) -> str:
        return self.current_user["name"]


class APIHandler(BaseHandler):
    """JSON in, JSON out; errors are ``{"status", "message"}``; no login redirects."""

    async def prepare(self) -> None:
        await super().prepare()
        # @web.authenticated refuses other verbs than GET with a bare 403: say what to send
        if self.current_user is None:
            self.get_login_url()

    def get_login_url(self) -> str:
        raise web.HTTPError(
            403, "Not authenticated: send 'Authorization: token <hub API token>' or log in"
        )

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        if status_code >= 500:
            metrics.ERRORS.labels("http").inc()
        message = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.log_message:
            message = exc.log_message % exc.args if exc.args else exc.log_message
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps({"status": status_code, "message": message}))

    def write_json(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(data))

    def body(self) -> dict[str, Any]:
        try:
            data = json.loads(self.request.body or b"null")
        except (ValueError, RecursionError):  # RecursionError: nested too deep to read
            raise web.HTTPError(400, "Request body must be JSON") from None
        if not isinstance(data, dict):
            raise web.HTTPError(400, "Request body must be a JSON object")
        return data


class HealthHandler(web.RequestHandler):
    def get(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps({"ok": True}))


#: the OpenAPI 3 description of the JSON API, kept beside this module
OPENAPI_YAML = Path(__file__).with_name("openapi.yaml")


@functools.cache
def openapi_json(prefix: str) -> str:
    """The OpenAPI description as JSON text, its server URL the service's ``prefix``.

    The YAML is read once per prefix (one per process), not per request."""
    document = yaml.safe_load(OPENAPI_YAML.read_text())
    document["servers"] = [{"url": prefix.rstrip("/") or "/"}]
    return json.dumps(document)


class OpenAPIHandler(APIHandler):
    """``GET api/openapi.json``: any logged-in caller may read the description."""

    def initialize(self, prefix: str, **kwargs: Any) -> None:
        super().initialize(**kwargs)
        self.prefix = prefix

    @web.authenticated
    def get(self) -> None:
        self.finish(openapi_json(self.prefix))


class PricesHandler(APIHandler):
    @web.authenticated
    async def get(self) -> None:
        version, book = await self.blocking(self.store.price_book_at)
        asked = self.get_arguments("sku")
        price_class = self.get_argument("price_class", "on-demand")
        if price_class not in PRICE_CLASSES:
            raise web.HTTPError(
                400,
                "price_class must be 'on-demand', 'spot' or 'storage' (data disks, per "
                f"GB-hour), not {price_class!r}",
            )
        # storage prices only the disk (per GB-hour); on-demand and spot only servers
        prices, unpriced = book.lookup(asked or book.skus(price_class), price_class)
        result: dict[str, Any] = {
            "currency": self.currency,
            "min_billable_seconds": self.store.min_billable_seconds,
            "spot_discount_percent": book.spot_discount_percent,
            "price_class": price_class,
            "version": version,
            "prices": {
                sku: {"per_hour_micro": micro, "per_hour": format_credits(micro)}
                for sku, micro in prices.items()
            },
        }
        if asked:
            result["unpriced"] = unpriced
        self.write_json(result)


class AccountHandler(APIHandler):
    @web.authenticated
    async def get(self, username: str) -> None:
        self.require_reader_of(username)
        now = self.now()
        state = await self.blocking(self.store.account, username, now)
        self.write_json(self.account_json(state, now))

    @web.authenticated
    async def put(self, username: str) -> None:
        self.require_hub()
        check_text(username, "username", MAX_LENGTH["username"])
        groups = self.body().get("groups", []) if self.request.body else []
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            raise web.HTTPError(400, "groups must be a list of the user's group names")
        now = self.now()
        state, created = await self.blocking(self.store.open_account, username, now)
        if created:
            log.info("Opened billing account %s with trial credit", username)
        joined = await self.blocking(self.store.enroll_by_groups, username, groups, now)
        if joined:
            log.info("%s joined %s through their GitHub teams", username, ", ".join(joined))
        self.write_json(self.account_json(state, now), 201 if created else 200)


class MeHandler(APIHandler):
    @web.authenticated
    async def get(self) -> None:
        if self.current_user.get("kind", "user") != "user":
            raise web.HTTPError(
                400, "api/me is for users; services read GET api/accounts/{username}"
            )
        now = self.now()
        state, _ = await self.blocking(self.store.open_account, self.caller, now)
        self.write_json(self.account_json(state, now))


class AdmissionHandler(APIHandler):
    @web.authenticated
    async def post(self) -> None:
        self.require_hub()
        body = self.body()
        username = text_field(body, "username")
        sku = text_field(body, "sku")
        count = count_field(body)
        price_class = price_class_field(body)
        key = optional_text(body, "idempotency_key")
        course = optional_text(body, "course") or ""
        if course:
            check_text(course, "course", MAX_LENGTH["course"])
        admission = await self.blocking(
            functools.partial(
                self.store.admit,
                username,
                sku,
                count,
                self.now(),
                price_class,
                idempotency_key=key,
                course=course,
            )
        )
        if not admission.allowed:
            log.info("Refused admission of %s for %s x %s", username, count, sku)
            raise web.HTTPError(402, admission.message)
        self.write_json(
            {
                "allowed": True,
                "sku": sku,
                "count": count,
                "price_per_hour_micro": admission.price_per_hour_micro,
                "price_per_hour": format_credits(admission.price_per_hour_micro),
                "seconds_left": admission.seconds_left,
                "message": admission.message,
                "hold_id": admission.hold.id,
                "hold_expires_at": admission.hold.expires_at.isoformat(),
            }
        )


class SessionsHandler(APIHandler):
    @web.authenticated
    async def get(self) -> None:
        username = self.get_argument("username", None)
        state = self.get_argument("state", None)
        if state not in (None, "running", "ended"):
            raise web.HTTPError(400, f"state must be 'running' or 'ended', not {state!r}")
        if username is None and not (self.is_hub or self.is_admin):
            username = self.current_user["name"]
        if username is not None:
            self.require_reader_of(username)
        sessions = await self.blocking(self.store.sessions, username, state)
        now = self.now()
        self.write_json({"sessions": [session_view(s, now) for s in sessions]})

    @web.authenticated
    async def post(self) -> None:
        self.require_hub()
        body = self.body()
        session_id = text_field(body, "id")
        username = text_field(body, "username")
        server_name = text_field(body, "server_name", empty_ok=True)
        sku = text_field(body, "sku")
        count = count_field(body)
        started_at = time_field(body, "started_at")
        price_class = price_class_field(body)
        hold_id = optional_text(body, "hold_id")
        course = optional_text(body, "course") or ""
        now = self.now()
        session, created = await self.blocking(
            functools.partial(
                self.store.start_session,
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
            )
        )
        if created and session.is_storage:
            log.info(
                "Started storage session %s of %s/%s: %s GB at %s per GB-hour",
                session.id,
                username,
                server_name,
                count,
                format_credits(session.price_per_hour_micro),
            )
        elif created:
            log.info(
                "Started session %s of %s/%s: %s x %s at %s/h",
                session.id,
                username,
                server_name,
                count,
                sku,
                format_credits(session.price_per_hour_micro),
            )
        self.write_json(session_view(session, now), 201 if created else 200)


class SessionStopHandler(APIHandler):
    @web.authenticated
    async def post(self, session_id: str) -> None:
        self.require_hub()
        ended_at = time_field(self.body(), "ended_at")
        now = self.now()
        session = await self.blocking(self.store.stop_session, session_id, ended_at, now)
        if session.ended_at == ended_at:
            metrics.CHARGES_POSTED.labels("final").inc()
        log.info(
            "Settled session %s of %s/%s: %s s, %s credits",
            session.id,
            session.username,
            session.server_name,
            session.billed_seconds,
            format_credits(session.cost_micro or 0),
        )
        self.write_json(session_view(session, now))


class GrantsHandler(APIHandler):
    """Admins fund accounts: top-ups, refunds, adjustments, trial credit, course allowances."""

    #: None: the body names the kind; "adjustment" for the older adjustments path
    fixed_kind: str | None = None

    @web.authenticated
    async def post(self, username: str) -> None:
        self.require_admin()
        body = self.body()
        kind = self.fixed_kind or text_field(body, "kind")
        if kind not in ledger.FUNDING_KINDS:
            raise web.HTTPError(
                400, f"Field 'kind' must be one of {', '.join(ledger.FUNDING_KINDS)}, not {kind!r}"
            )
        if "amount" not in body:
            raise web.HTTPError(400, "Missing field 'amount': a decimal string like \"25.00\"")
        try:
            amount = parse_credits(body["amount"], "amount")
        except ValueError as e:
            raise web.HTTPError(400, f"Field {e}") from None
        reason = text_field(body, "reason")
        key = text_field(body, "idempotency_key")
        course = optional_text(body, "course") or ""
        tx, created = await self.blocking(
            functools.partial(
                self.store.grant,
                username,
                kind,
                amount,
                reason,
                key,
                self.now(),
                created_by=self.caller,
                course=course,
            )
        )
        if created:
            log.info(
                "%s of %s credits to %s by %s",
                kind.capitalize(),
                format_credits(amount),
                username,
                self.caller,
            )
        self.write_json(transaction_view(tx), 201 if created else 200)


class AdjustmentsHandler(GrantsHandler):
    fixed_kind = "adjustment"


class TransactionsHandler(APIHandler):
    @web.authenticated
    async def get(self, username: str) -> None:
        self.require_reader_of(username)
        txs = await self.blocking(self.store.transactions, username)
        self.write_json({"transactions": [transaction_view(tx) for tx in txs]})


class AccountsHandler(APIHandler):
    @web.authenticated
    async def get(self) -> None:
        if not (self.is_admin or self.is_hub):
            raise web.HTTPError(403, "Only billing admins may list every account")
        now = self.now()
        states = await self.blocking(self.store.accounts, now)
        self.write_json({"accounts": [self.account_json(s, now) for s in states]})


class HoldHandler(APIHandler):
    @web.authenticated
    async def delete(self, hold_id: str) -> None:
        self.require_hub()
        hold = await self.blocking(self.store.release_hold, hold_id, self.now())
        self.write_json(hold_view(hold))


class HoldsHandler(APIHandler):
    @web.authenticated
    async def get(self, username: str) -> None:
        self.require_reader_of(username)
        holds = await self.blocking(self.store.holds, username, self.now())
        self.write_json({"holds": [hold_view(h) for h in holds]})


class PriceBooksHandler(APIHandler):
    @web.authenticated
    async def get(self) -> None:
        books = await self.blocking(self.store.price_books)
        self.write_json({"price_books": [price_book_view(b) for b in books]})

    @web.authenticated
    async def post(self) -> None:
        """Publish a new version; running sessions keep the price they started with."""
        self.require_admin()
        body = self.body()
        prices = body.get("prices")
        if not isinstance(prices, dict) or not prices:
            raise web.HTTPError(
                400,
                "Field 'prices' must be an object of SKU to credits per hour, "
                'e.g. {"A100-80GB": "8.00", "cpu": "0.10"}',
            )
        current = (await self.blocking(self.store.price_book_at))[1]
        try:
            book = make_price_book(
                prices,
                body.get("spot_discount_percent", current.spot_discount_percent),
                body.get("shared_percent", current.shared_percent),
            )
        except ValueError as e:
            raise web.HTTPError(400, str(e).replace("billing.", "")) from None
        record, created = await self.blocking(
            self.store.publish_price_book, book, self.caller, "admin", self.now()
        )
        if created:
            log.info("Price book version %s published by %s", record.version, self.caller)
        self.write_json(price_book_view(record), 201 if created else 200)


class UsageHandler(APIHandler):
    """Sessions in a time range: admins see everyone (or ?username=), users themselves.
    ``api/usage.csv`` answers the same as CSV."""

    def initialize(self, csv: bool = False, **kwargs: Any) -> None:
        super().initialize(**kwargs)
        self.csv = csv

    @web.authenticated
    async def get(self) -> None:
        username = self.get_argument("username", None)
        if not (self.is_admin or self.is_hub):
            username = username or self.caller
            self.require_reader_of(username)
        since = time_argument(self, "since")
        until = time_argument(self, "until")
        if since and until and until <= since:
            raise web.HTTPError(400, "until must be after since")
        sessions = await self.blocking(
            functools.partial(self.store.sessions, username, since=since, until=until)
        )
        now = self.now()
        if self.csv:
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header("Content-Disposition", 'attachment; filename="gputap-usage.csv"')
            self.finish(usage_csv(sessions, now))
            return
        self.write_json(
            {
                "sessions": [session_view(s, now) for s in sessions],
                "gpu_hours_by_day": daily_gpu_hours(sessions, now, since, until),
            }
        )


class MetricsHandler(BaseHandler):
    """Prometheus text format; for the hub, billing admins and holders of BILLING_METRICS."""

    def get_login_url(self) -> str:
        raise web.HTTPError(403, "Not authenticated: send 'Authorization: token <token>'")

    @web.authenticated
    def get(self) -> None:
        if not (self.is_hub or self.is_admin or BILLING_METRICS in self.scopes):
            raise web.HTTPError(403, f"Reading metrics needs the scope {BILLING_METRICS}")
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(metrics.REGISTRY))


class LedgerCheckHandler(APIHandler):
    @web.authenticated
    async def get(self) -> None:
        self.require_admin()
        problems = await self.blocking(self.store.check_ledger)
        self.write_json({"ok": not problems, "problems": [str(p) for p in problems]})


class PageHandler(BaseHandler):
    """The user's billing page; browsers log in through the hub (OAuth)."""

    @web.authenticated
    async def get(self) -> None:
        if self.current_user.get("kind", "user") != "user":
            raise web.HTTPError(403, "The billing page is for users")
        now = self.now()
        state, _ = await self.blocking(self.store.open_account, self.caller, now)
        since = datetime(now.year, now.month, now.day, tzinfo=now.tzinfo) - timedelta(
            days=CHART_DAYS - 1
        )
        recent = await self.blocking(
            functools.partial(self.store.sessions, self.caller, since=since)
        )
        ended = await self.blocking(self.store.sessions, self.caller, "ended")
        self.render(
            "billing.html",
            account=self.account_json(state, now),
            ended=[session_view(s, now) for s in ended],
            chart=daily_gpu_hours(recent, now, since, None),
            api_url=self.request.path.rstrip("/") + "/api/me",
            # the page's fetches are cookie-authenticated: HubOAuth checks this token
            xsrf=xsrf.decode() if isinstance(xsrf := self.xsrf_token, bytes) else xsrf,
            when=page_time,
            duration=page_duration,
            rate=lambda s: format_credits(s["price_per_hour_micro"] * s["count"]),
        )


class AdminPageHandler(BaseHandler):
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
            xsrf=xsrf.decode() if isinstance(xsrf := self.xsrf_token, bytes) else xsrf,
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


def make_handlers(prefix: str, kwargs: dict[str, Any]) -> list[tuple]:
    """Routes under the service prefix (which ends in "/")."""
    api = [
        (r"api/openapi\.json", OpenAPIHandler, {"prefix": prefix}),
        (r"api/prices", PricesHandler),
        (r"api/accounts/([^/]+)", AccountHandler),
        (r"api/accounts", AccountsHandler),
        (r"api/accounts/([^/]+)/adjustments", AdjustmentsHandler),
        (r"api/accounts/([^/]+)/grants", GrantsHandler),
        (r"api/accounts/([^/]+)/transactions", TransactionsHandler),
        (r"api/accounts/([^/]+)/holds", HoldsHandler),
        (r"api/holds/([^/]+)", HoldHandler),
        (r"api/price-books", PriceBooksHandler),
        (r"api/usage", UsageHandler),
        (r"api/usage\.csv", UsageHandler, {"csv": True}),
        (r"api/ledger/check", LedgerCheckHandler),
        (r"api/me", MeHandler),
        (r"api/admission", AdmissionHandler),
        (r"api/sessions", SessionsHandler),
        (r"api/sessions/([^/]+)/stop", SessionStopHandler),
        (r"admin", AdminPageHandler),
        (r"metrics", MetricsHandler),
        (r"", PageHandler),
    ]
    routes: list[tuple] = [
        (prefix + "health", HealthHandler),
        (prefix + "oauth_callback", HubOAuthCallbackHandler),
    ]
    from .course_handlers import COURSE_ROUTES  # they build on APIHandler, defined here

    api[-3:-3] = COURSE_ROUTES
    for path, handler, *extra in api:
        routes.append((prefix + path, handler, {**kwargs, **(extra[0] if extra else {})}))
    if prefix != "/":
        routes.append((prefix.rstrip("/"), web.RedirectHandler, {"url": prefix}))
    return routes
