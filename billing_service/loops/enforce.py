"""Enforcement: stop workers and servers through the hub before credit runs out.

The stop goes through gputap's stop endpoint beside the hub's REST API
(``POST {hub}/gputap/api/users/{u}/server[s/{name}]/stop``, which answers as JupyterHub's
``DELETE`` does), so the user is told that credit ran out (docs/lab.md); a scale-out worker's
through its own (``.../workers/{wK}/stop``), asked before any server's of the same pass.

:func:`~billing_service.domain.enforcement.sessions_to_stop` is the pure decision;
:class:`Enforcer` runs it periodically and asks the hub to stop servers. The hub's spawner then
settles the session itself (``POST api/sessions/{id}/stop``); files are never touched, and
data disks are never stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from gputap_common import clock
from gputap_common.names import worker_label

from .. import metrics
from ..domain.enforcement import sessions_to_stop
from ..domain.records import AccountState, SessionRecord
from .hub_api import HubAPI, stop_url, worker_stop_url
from .repeat import Loop

log = logging.getLogger("billing.enforce")

# A stop takes the hub a while; asking again sooner would only hammer it.
DEFAULT_REPEAT_AFTER = timedelta(seconds=30)


class Enforcer(Loop):
    """Periodic enforcement against the hub's REST API."""

    logger = log
    failed = "Enforcement pass failed; trying again next interval"
    errors = "enforce"

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
        self.hub = HubAPI(api_url, api_token, http_client)
        self.interval_seconds = interval_seconds
        self.repeat_after = repeat_after
        self._requested: dict[str, datetime] = {}

    async def stop_server(self, session: SessionRecord) -> bool:
        """Ask the hub to stop the session's server, or its worker for a worker's session;
        False when the hub refused."""
        if session.is_worker:
            target = worker_label(session.username, session.server_name, session.worker)
            url = worker_stop_url(
                self.hub.api_url, session.username, session.server_name, session.worker
            )
            # worker names are reused once a worker ended: the hub stops wK only while it
            # still runs this session (409 otherwise)
            body: dict[str, str] | None = {"session_id": session.id}
        else:
            target = f"{session.username}/{session.server_name}"
            url = stop_url(self.hub.api_url, session.username, session.server_name)
            body = None
        try:
            response = await self.hub.fetch(url, "POST", body)
        except HTTPClientError as e:
            # 400/404: not running (any more) or no such user; 409: the worker's name runs
            # another session now. The spawner settles the rest.
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
        # the hub is asked for every stop at once (one slow answer does not delay the rest),
        # the workers' first: a server stopped with its workers is asked after them
        for workers in (True, False):
            await asyncio.gather(
                *(self.stop_server(s) for s in requested if s.is_worker == workers)
            )
        metrics.ENFORCEMENT_STOPS.inc(len(requested))
        metrics.CYCLE_SECONDS.labels("enforce").observe(time.perf_counter() - started)
        return requested
