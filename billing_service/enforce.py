"""Enforcement: stop servers through the hub before credit runs out.

:func:`sessions_to_stop` is the pure decision; :class:`Enforcer` runs it periodically and
asks the hub to stop servers. The hub's spawner then settles the session itself
(``POST api/sessions/{id}/stop``); files are never touched.

Data disks (storage sessions) are never stopped: their cost counts in how fast the money
drains, so servers beside them stop sooner, but a disk stays, and with disks alone the
balance may go below zero (new servers are then refused at admission).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime, timedelta
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gputap_common import clock

from . import metrics
from .money import cost_micro
from .store import AccountState, SessionRecord

log = logging.getLogger("billing.enforce")

# A stop takes the hub a while; asking again sooner would only hammer it.
DEFAULT_REPEAT_AFTER = timedelta(seconds=30)


def sessions_to_stop(
    accounts: Iterable[AccountState], now: datetime, interval_seconds: float
) -> list[SessionRecord]:
    """Open server sessions whose money would not last until the next check.

    Sessions are judged by what pays for them (``AccountState.funding_groups``): a course's
    sessions its allowance alone pays run out with that allowance; the others with the
    account's credit. A group's servers are stopped when what it has <= what it costs in one
    interval, data disks' cost included; its disks are never stopped.
    """
    stop: list[SessionRecord] = []
    for account in accounts:
        for _, available, sessions in account.funding_groups(now):
            rate = sum(s.rate_per_hour_micro for s in sessions)
            if available <= cost_micro(rate, 1, math.ceil(interval_seconds)):
                stop.extend(s for s in sessions if not s.is_storage)
    return stop


def server_url(api_url: str, username: str, server_name: str) -> str:
    """The hub REST URL that stops ``username``'s server (the default one has name "")."""
    user = quote(username, safe="")
    if not server_name:
        return f"{api_url.rstrip('/')}/users/{user}/server"
    return f"{api_url.rstrip('/')}/users/{user}/servers/{quote(server_name, safe='')}"


class Enforcer:
    """Periodic enforcement against the hub's REST API."""

    def __init__(
        self,
        load_accounts: Callable[[datetime], Awaitable[list[AccountState]]],
        *,
        api_url: str,
        api_token: str,
        interval_seconds: float,
        repeat_after: timedelta = DEFAULT_REPEAT_AFTER,
        http_client: AsyncHTTPClient | None = None,
    ) -> None:
        self.load_accounts = load_accounts
        self.api_url = api_url
        self._api_token = api_token
        self.interval_seconds = interval_seconds
        self.repeat_after = repeat_after
        self.http_client = http_client or AsyncHTTPClient()
        self._requested: dict[str, datetime] = {}

    async def stop_server(self, session: SessionRecord) -> bool:
        """Ask the hub to stop the session's server; False when the hub refused."""
        target = f"{session.username}/{session.server_name}"
        request = HTTPRequest(
            server_url(self.api_url, session.username, session.server_name),
            method="DELETE",
            headers={"Authorization": f"token {self._api_token}"},
        )
        try:
            response = await self.http_client.fetch(request)
        except HTTPClientError as e:
            # 400/404: not running (any more) or no such user; the spawner settles the rest.
            log.warning("Enforcement: hub refused to stop %s: HTTP %s", target, e.code)
            return False
        except OSError as e:
            log.error("Enforcement: cannot reach the hub to stop %s: %s", target, e)
            return False
        log.info(
            "Enforcement: stopping %s (session %s), credit exhausted; hub answered %s",
            target,
            session.id,
            response.code,
        )
        return True

    async def check(self, now: datetime | None = None) -> list[SessionRecord]:
        """One enforcement pass; returns the sessions whose stop was requested now."""
        now = now or clock.utcnow()
        self._requested = {
            sid: at for sid, at in self._requested.items() if now - at < self.repeat_after
        }
        started = time.perf_counter()
        accounts = await self.load_accounts(now)
        requested = []
        for session in sessions_to_stop(accounts, now, self.interval_seconds):
            if session.id not in self._requested:
                self._requested[session.id] = now
                requested.append(session)
        # the hub is asked for every stop at once: one slow answer does not delay the rest
        await asyncio.gather(*(self.stop_server(session) for session in requested))
        metrics.ENFORCEMENT_STOPS.inc(len(requested))
        metrics.CYCLE_SECONDS.labels("enforce").observe(time.perf_counter() - started)
        return requested

    async def run(self) -> None:
        """Check forever, every ``interval_seconds``; one failing pass does not end it."""
        while True:
            try:
                await self.check()
            except Exception:
                metrics.ERRORS.labels("enforce").inc()
                log.exception("Enforcement pass failed; trying again next interval")
            await asyncio.sleep(self.interval_seconds)
