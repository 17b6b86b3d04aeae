"""REST API and the user's billing page. Thin: parse, authorize, call the store, render."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated, UserNotAllowed
from tornado import web

from . import clock
from .money import format_credits, parse_credits
from .store import NotFound, Store
from .views import account_view, entry_view, session_view

log = logging.getLogger("billing")

HUB_SCOPE = "custom:gputap-billing:hub"
ADMIN_SCOPE = "custom:gputap-billing:admin"

T = TypeVar("T")


class BaseHandler(HubOAuthenticated, web.RequestHandler):
    """Hub-authenticated handler; the caller is resolved before the verb runs."""

    def initialize(self, store: Store, executor, currency: str) -> None:
        self.store = store
        self.executor = executor
        self.currency = currency

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
                "it needs the scope access:services!service=billing",
            ) from None

    # who is asking

    @property
    def scopes(self) -> set[str]:
        return set(self.current_user.get("scopes") or [])

    @property
    def is_hub(self) -> bool:
        return HUB_SCOPE in self.scopes

    @property
    def is_admin(self) -> bool:
        return ADMIN_SCOPE in self.scopes

    def require_hub(self) -> None:
        if not self.is_hub:
            raise web.HTTPError(403, f"Only the hub may do this; it needs the scope {HUB_SCOPE}")

    def require_admin(self) -> None:
        if not self.is_admin:
            raise web.HTTPError(403, f"Only billing admins may do this (scope {ADMIN_SCOPE})")

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


class APIHandler(BaseHandler):
    """JSON in, JSON out; errors are ``{"status", "message"}``; no login redirects."""

    def get_login_url(self) -> str:
        raise web.HTTPError(
            403, "Not authenticated: send 'Authorization: token <hub API token>' or log in"
        )

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.set_header("Cache-Control", "no-store")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
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
        except ValueError:
            raise web.HTTPError(400, "Request body must be JSON") from None
        if not isinstance(data, dict):
            raise web.HTTPError(400, "Request body must be a JSON object")
        return data


def _field(body: dict[str, Any], key: str, kind: type, what: str) -> Any:
    if key not in body:
        raise web.HTTPError(400, f"Missing field {key!r}: {what}")
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise web.HTTPError(400, f"Field {key!r} must be {what}, not {value!r}")
    return value


def text_field(body: dict[str, Any], key: str, *, empty_ok: bool = False) -> str:
    value = _field(body, key, str, "a string")
    if not empty_ok and not value.strip():
        raise web.HTTPError(400, f"Field {key!r} must not be empty")
    return value


def count_field(body: dict[str, Any]) -> int:
    value = _field(body, "count", int, "an integer >= 1")
    if value < 1:
        raise web.HTTPError(400, f"Field 'count' must be an integer >= 1, not {value}")
    return value


def price_class_field(body: dict[str, Any]) -> str:
    value = body.get("price_class", "on-demand")
    if value not in ("on-demand", "spot"):
        raise web.HTTPError(
            400, f"Field 'price_class' must be 'on-demand' or 'spot', not {value!r}"
        )
    return value


def time_field(body: dict[str, Any], key: str) -> datetime:
    text = _field(body, key, str, "an ISO 8601 time with timezone")
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise web.HTTPError(
            400, f"Field {key!r} must be an ISO 8601 time like 2025-01-01T12:00:00Z, not {text!r}"
        ) from None
    if value.tzinfo is None:
        raise web.HTTPError(400, f"Field {key!r} needs a timezone, e.g. {text}Z")
    return value


class HealthHandler(web.RequestHandler):
    def get(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps({"ok": True}))


class PricesHandler(APIHandler):
    @web.authenticated
    def get(self) -> None:
        book = self.store.price_book
        asked = self.get_arguments("sku")
        price_class = self.get_argument("price_class", "on-demand")
        if price_class not in ("on-demand", "spot"):
            raise web.HTTPError(
                400, f"price_class must be 'on-demand' or 'spot', not {price_class!r}"
            )
        if asked:
            prices, unpriced = book.lookup(asked, price_class)
        else:
            prices, unpriced = book.lookup(book.configured(), price_class)
        result: dict[str, Any] = {
            "currency": self.currency,
            "min_billable_seconds": self.store.min_billable_seconds,
            "spot_discount_percent": book.spot_discount_percent,
            "price_class": price_class,
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
        state = await self.blocking(self.store.account, username)
        self.write_json(account_view(state, self.now(), self.currency))

    @web.authenticated
    async def put(self, username: str) -> None:
        self.require_hub()
        now = self.now()
        state, created = await self.blocking(self.store.open_account, username, now)
        if created:
            log.info("Opened billing account %s with trial credit", username)
        self.write_json(account_view(state, now, self.currency), 201 if created else 200)


class MeHandler(APIHandler):
    @web.authenticated
    async def get(self) -> None:
        if self.current_user.get("kind", "user") != "user":
            raise web.HTTPError(
                400, "api/me is for users; services read GET api/accounts/{username}"
            )
        now = self.now()
        state, _ = await self.blocking(self.store.open_account, self.current_user["name"], now)
        self.write_json(account_view(state, now, self.currency))


class AdmissionHandler(APIHandler):
    @web.authenticated
    async def post(self) -> None:
        self.require_hub()
        body = self.body()
        username = text_field(body, "username")
        sku = text_field(body, "sku")
        count = count_field(body)
        price_class = price_class_field(body)
        admission = await self.blocking(
            self.store.admit, username, sku, count, self.now(), price_class
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
        now = self.now()
        session, created = await self.blocking(
            self.store.start_session,
            session_id,
            username,
            server_name,
            sku,
            count,
            started_at,
            now,
            price_class,
        )
        if created:
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
        log.info(
            "Settled session %s of %s/%s: %s s, %s credits",
            session.id,
            session.username,
            session.server_name,
            session.billed_seconds,
            format_credits(session.cost_micro or 0),
        )
        self.write_json(session_view(session, now))


class AdjustmentsHandler(APIHandler):
    @web.authenticated
    async def post(self, username: str) -> None:
        self.require_admin()
        body = self.body()
        if "amount" not in body:
            raise web.HTTPError(400, "Missing field 'amount': a decimal string like \"-9.99\"")
        try:
            amount = parse_credits(body["amount"], "amount")
        except ValueError as e:
            raise web.HTTPError(400, f"Field {e}") from None
        reason = text_field(body, "reason")
        key = text_field(body, "idempotency_key")
        memo = f"{reason} (by {self.current_user['name']})"
        entry, created = await self.blocking(
            self.store.adjust, username, amount, memo, key, self.now()
        )
        if created:
            log.info(
                "Adjusted %s by %s credits (by %s)",
                username,
                format_credits(amount),
                self.current_user["name"],
            )
        self.write_json(entry_view(entry), 201 if created else 200)


class PageHandler(BaseHandler):
    """The user's billing page; browsers log in through the hub (OAuth)."""

    @web.authenticated
    async def get(self) -> None:
        if self.current_user.get("kind", "user") != "user":
            raise web.HTTPError(403, "The billing page is for users")
        now = self.now()
        username = self.current_user["name"]
        state, _ = await self.blocking(self.store.open_account, username, now)
        ended = await self.blocking(self.store.sessions, username, "ended")
        self.render(
            "billing.html",
            account=account_view(state, now, self.currency),
            ended=[session_view(s, now) for s in ended],
            api_url=self.request.path.rstrip("/") + "/api/me",
            # the page's fetches are cookie-authenticated: HubOAuth checks this token
            xsrf=xsrf.decode() if isinstance(xsrf := self.xsrf_token, bytes) else xsrf,
            when=page_time,
            duration=page_duration,
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
        (r"api/prices", PricesHandler),
        (r"api/accounts/([^/]+)", AccountHandler),
        (r"api/accounts/([^/]+)/adjustments", AdjustmentsHandler),
        (r"api/me", MeHandler),
        (r"api/admission", AdmissionHandler),
        (r"api/sessions", SessionsHandler),
        (r"api/sessions/([^/]+)/stop", SessionStopHandler),
        (r"", PageHandler),
    ]
    routes: list[tuple] = [
        (prefix + "health", HealthHandler),
        (prefix + "oauth_callback", HubOAuthCallbackHandler),
        *[(prefix + path, handler, kwargs) for path, handler in api],
    ]
    if prefix != "/":
        routes.append((prefix.rstrip("/"), web.RedirectHandler, {"url": prefix}))
    return routes
