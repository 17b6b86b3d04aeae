"""The hub's side of the billing API (prices, accounts, admission, sessions), over HTTP.

The spawner never imports billing code: it asks the billing service, and when billing cannot be
reached it refuses new spawns (fail closed) with a message that says so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from datetime import datetime
from typing import Any
from urllib.parse import quote, urlencode

from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.simple_httpclient import HTTPTimeoutError

from ..core.record import ServerRecord

log = logging.getLogger(__name__)

PRICE_CACHE_SECONDS = 10
#: billing's SKU and price class of data disks (per GB-hour, count = GB)
DISK_SKU = "disk"
STORAGE_CLASS = "storage"
_price_cache: dict[tuple[str, str, tuple[str, ...]], tuple[float, tuple[dict[str, int], int]]] = {}
#: calls to billing in flight at once, per hub: a class arriving together (40 spawns, each
#: admission, session start and form) fits without queueing
MAX_BILLING_CALLS = 100
_clients: dict[asyncio.AbstractEventLoop, AsyncHTTPClient] = {}


def billing_http() -> AsyncHTTPClient:
    """The HTTP client of billing calls, one per event loop and never tornado's shared one.

    The shared client also carries the readiness probes of starting servers; behind 40 of
    them (10 at a time, each up to its timeout) billing's calls waited in its queue until
    they timed out, and spawns were refused as if billing were down."""
    loop = asyncio.get_running_loop()
    http = _clients.get(loop)
    if http is None:
        for old in [other for other in _clients if other.is_closed()]:
            del _clients[old]
        http = _clients[loop] = AsyncHTTPClient(force_instance=True, max_clients=MAX_BILLING_CALLS)
    return http


class BillingUnavailable(RuntimeError):
    """Billing did not answer, or answered with a server error."""

    #: what a user is told billing did (unavailable_error)
    what = "Billing is unreachable"


class BillingTimeout(BillingUnavailable):
    """Billing took the call but did not answer within the client's timeout."""

    what = "Billing did not answer in time"


class BillingRefused(Exception):
    """Billing said no (4xx); ``message`` is written for the user."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _message(body: bytes | None) -> str | None:
    """The message of billing's JSON error body (``{"status", "message"}``), if it is one."""
    try:
        error = json.loads(body or b"")
    except ValueError:
        return None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) and message else None


class BillingClient:
    """Calls the billing service with the hub's billing token."""

    def __init__(self, url: str, token: str, timeout: float = 10):
        self.url = url.rstrip("/") + "/"
        self.token = token
        self.timeout = timeout

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = HTTPRequest(
            self.url + path,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body),
            request_timeout=self.timeout,
            connect_timeout=self.timeout,
            allow_nonstandard_methods=True,
        )
        try:
            response = await billing_http().fetch(request)
        except HTTPTimeoutError:
            raise BillingTimeout(
                f"no answer to {method} {path} within {self.timeout:g} s"
            ) from None
        except HTTPClientError as e:
            message = _message(e.response.body if e.response is not None else None)
            if e.code < 500 and message is not None:
                raise BillingRefused(e.code, message) from None
            # a 5xx, or an answer that is not billing's (whatever took its port): billing is
            # not there to ask
            raise BillingUnavailable(f"billing answered {e.code} to {method} {path}") from None
        except OSError as e:
            raise BillingUnavailable(f"billing unreachable: {e.strerror or e}") from None
        try:
            return json.loads(response.body) if response.body else None
        except ValueError:
            raise BillingUnavailable(f"billing answered {method} {path} with no JSON") from None

    async def price_book(
        self, skus: list[str], price_class: str = "on-demand"
    ) -> tuple[dict[str, int], int]:
        """Prices of each SKU that has one in ``price_class``, and the spot discount (percent).

        Kept for PRICE_CACHE_SECONDS: the hub only ranks options with them, and billing fixes
        the price of a session itself when it starts."""
        key = (self.url, price_class, tuple(skus))
        cached = _price_cache.get(key)
        if cached and time.monotonic() - cached[0] < PRICE_CACHE_SECONDS:
            return cached[1]
        answer = await self.price_list(skus, price_class)
        prices = {sku: p["per_hour_micro"] for sku, p in answer["prices"].items()}
        result = prices, answer.get("spot_discount_percent", 0)
        _price_cache[key] = (time.monotonic(), result)
        return result

    async def price_list(self, skus: list[str], price_class: str = "on-demand") -> dict[str, Any]:
        """Billing's price answer as it is, for showing: ``currency`` and, per SKU that has a
        price, ``per_hour_micro`` and ``per_hour`` (exact credits). Not cached."""
        query = urlencode([("price_class", price_class)] + [("sku", s) for s in skus])
        return await self._call("GET", f"api/prices?{query}")

    async def open_account(self, username: str, groups: list[str] | None = None) -> dict[str, Any]:
        """Open the account (trial credit once); ``groups`` enrol the user in bound courses."""
        body = {"groups": groups} if groups else {}
        return await self._call("PUT", f"api/accounts/{quote(username, safe='')}", body)

    async def account(self, username: str) -> dict[str, Any]:
        return await self._call("GET", f"api/accounts/{quote(username, safe='')}")

    async def move_account(self, old: str, new: str) -> dict[str, Any]:
        """Move ``old``'s account with all its history to the username ``new`` (``new``'s
        untouched trial account is discarded); BillingRefused (409) says what stands in the
        way."""
        return await self._call("POST", f"api/accounts/{quote(old, safe='')}/move", {"to": new})

    async def admit(self, username: str, record: ServerRecord) -> dict[str, Any]:
        """Admit the start of ``record``, placing a hold on the minimum billable period's
        cost (``hold_id`` in the answer: the record's session id, so asking again answers
        with the same hold). Raises BillingRefused with billing's explanation when credit
        (or the course), less the holds of other spawns in progress, does not cover it."""
        body = {
            "username": username,
            "sku": record.offering,
            "count": record.count,
            "price_class": record.price_class,
            "idempotency_key": record.session_id,
        }
        if record.course:  # the course pays, if its rules allow this spawn
            body["course"] = record.course
        return await self._call("POST", "api/admission", body)

    async def courses(self, username: str) -> dict[str, Any]:
        """The user's courses with the hours left this week per option they pay for."""
        return await self._call("GET", f"api/accounts/{quote(username, safe='')}/courses")

    async def release_hold(self, hold_id: str) -> dict[str, Any]:
        """Give the credit of a hold back (a start that failed); releasing twice is fine."""
        return await self._call("DELETE", f"api/holds/{quote(hold_id, safe='')}")

    async def start_session(
        self, username: str, server_name: str, record: ServerRecord
    ) -> dict[str, Any]:
        """Open the session of ``record`` from its ``started_at``; its admission's hold (if
        it still has one) becomes the session; its course (if any) pays."""
        body = {
            "id": record.session_id,
            "username": username,
            "server_name": server_name,
            "sku": record.offering,
            "count": record.count,
            "price_class": record.price_class,
            "started_at": record.started_at.isoformat(),
        }
        if record.hold_id:
            body["hold_id"] = record.hold_id
        if record.course:
            body["course"] = record.course
        if record.environment:
            body["environment"] = record.environment
        if record.worker:  # one worker of the server's group, billed on its own
            body["worker"] = record.worker
        return await self._call("POST", "api/sessions", body)

    async def start_storage_session(
        self, session_id: str, username: str, disk: str, size_gb: int, started_at: datetime
    ) -> dict[str, Any]:
        """Start metering a data disk: sku ``disk`` per GB-hour, ``count`` its size."""
        body = {
            "id": session_id,
            "username": username,
            "server_name": f"disk:{disk}",
            "sku": DISK_SKU,
            "count": size_gb,
            "price_class": STORAGE_CLASS,
            "started_at": started_at.isoformat(),
        }
        return await self._call("POST", "api/sessions", body)

    async def stop_session(self, session_id: str, ended_at: datetime) -> dict[str, Any]:
        path = f"api/sessions/{quote(session_id, safe='')}/stop"
        return await self._call("POST", path, {"ended_at": ended_at.isoformat()})


def unavailable_error(e: Exception) -> web.HTTPError:
    """What a user is told when a start cannot ask billing (nothing was charged)."""
    what = e.what if isinstance(e, BillingUnavailable) else BillingUnavailable.what
    return web.HTTPError(
        503,
        f"{what}, so no server can start now (nothing is charged). "
        f"Try again in a minute; if it persists, tell an operator. ({e})",
    )
