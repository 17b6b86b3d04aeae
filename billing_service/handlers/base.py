"""What every billing handler shares: who is calling (resolved through the hub), running store
work on the database thread, and JSON in and out with errors as ``{"status", "message"}``."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

from jupyterhub.services.auth import HubOAuthenticated, UserNotAllowed
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gputap_common import clock
from gputap_common.scopes import BILLING_ACCESS, BILLING_ADMIN, BILLING_HUB

from .. import metrics
from ..config import BillingConfig
from ..domain.errors import Conflict, NotFound
from ..domain.records import AccountState
from ..store import Store
from .fields import MAX_BODY_BYTES, MAX_PATH_LENGTH, check_text, read_body
from .views import account_view

T = TypeVar("T")


class BaseHandler(HubOAuthenticated, web.RequestHandler):
    """Hub-authenticated handler; the caller is resolved before the verb runs."""

    def initialize(self, store: Store, executor: Executor, config: BillingConfig) -> None:
        self.store = store
        self.executor = executor
        self.config = config
        self.currency = config.currency

    def account_json(self, state: AccountState, now: datetime) -> dict[str, Any]:
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
        if len(self.request.body or b"") > MAX_BODY_BYTES:
            raise web.HTTPError(413, f"Request body too large: at most {MAX_BODY_BYTES} bytes")
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

    @property
    def sees_everyone(self) -> bool:
        """The hub and billing admins read every account."""
        return self.is_hub or self.is_admin

    @property
    def caller_is_user(self) -> bool:
        """A user (with a token or the page's cookie), not a service."""
        return self.current_user.get("kind", "user") == "user"

    @property
    def caller(self) -> str:
        return self.current_user["name"]

    def require_hub(self) -> None:
        if not self.is_hub:
            raise web.HTTPError(403, f"Only the hub may do this; it needs the scope {BILLING_HUB}")

    def require_admin(self) -> None:
        if not self.is_admin:
            raise web.HTTPError(403, f"Only billing admins may do this (scope {BILLING_ADMIN})")

    def require_user(self, what: str) -> None:
        """403 unless a user (not a service) is calling: ``what`` is for users."""
        if not self.caller_is_user:
            raise web.HTTPError(403, f"{what} is for users")

    def require_reader_of(self, username: str) -> None:
        """The hub, billing admins, and the user themselves may read a user's billing."""
        if self.sees_everyone:
            return
        if self.caller_is_user and self.caller == username:
            return
        raise web.HTTPError(403, f"You may read only your own billing, not {username!r}'s")

    async def require_hub_user(self, username: str) -> None:
        """404 unless the hub knows ``username`` (they logged in, or an admin added them):
        billing opens no account for a name nobody has (docs/security.md). Asked of the hub's
        REST API with billing's own token (it holds ``read:users``)."""
        url = f"{self.hub_auth.api_url}/users/{quote(username, safe='')}"
        request = HTTPRequest(
            url,
            headers={"Authorization": f"token {self.hub_auth.api_token}"},
            request_timeout=10,
        )
        try:
            await AsyncHTTPClient().fetch(request)
        except HTTPClientError as e:
            if e.code == 404:
                raise web.HTTPError(
                    404,
                    f"The hub has no user {username!r}: they must log in once (or a hub admin "
                    "adds them) before they can be enrolled",
                ) from None
            raise web.HTTPError(
                503, f"The hub did not say whether {username!r} exists ({e.code}); try again"
            ) from None
        except OSError as e:
            raise web.HTTPError(503, f"The hub did not answer ({e}); try again") from None

    # doing it

    async def blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run store work on the single database thread; domain errors become 400/404/409."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))
        except NotFound as e:
            raise web.HTTPError(404, str(e)) from None
        except Conflict as e:
            raise web.HTTPError(409, str(e)) from None
        except ValueError as e:
            raise web.HTTPError(400, str(e)) from None

    def now(self) -> datetime:
        return clock.utcnow()

    @property
    def xsrf_text(self) -> str:
        """The XSRF token as text, for a page's fetches (HubOAuth checks it on cookie calls)."""
        token = self.xsrf_token
        return token.decode() if isinstance(token, bytes) else token

    def write_csv(self, filename: str, text: str) -> None:
        """Answer ``text`` as a CSV download named ``filename``."""
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        self.set_header("Content-Disposition", f'attachment; filename="{filename}"')
        self.finish(text)


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

    async def write_records(
        self,
        key: str,
        view: Callable[[Any], Any],
        read: Callable[..., Iterable[Any]],
        *args: Any,
        **kwargs: Any,
    ) -> None:
        """Answer ``{key: [view(record), ...]}`` for the records ``read(*args, **kwargs)``
        answers on the database thread (:meth:`blocking`)."""
        records = await self.blocking(read, *args, **kwargs)
        self.write_json({key: [view(record) for record in records]})

    def write_saved(self, data: Any, created: bool) -> None:
        """``data`` with 201 when the request created it, 200 when it was there (a replay)."""
        self.write_json(data, 201 if created else 200)

    def body(self, allowed: Iterable[str]) -> dict[str, Any]:
        """The request's JSON object, with no keys but ``allowed`` (:func:`fields.read_body`)."""
        return read_body(self.request.body, allowed)
