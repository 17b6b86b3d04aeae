"""Reconciliation with the hub: close sessions whose server (or scale-out worker) the hub no
longer runs.

The spawner settles each session itself when its server stops. This catches what that
misses, such as a stop whose settle call never arrived (billing was down, then the hub
restarted and forgot to retry). :func:`~billing_service.domain.reconciliation.sessions_to_close`
is the pure decision (its module states the rule); :class:`Reconciler` runs it periodically.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from gputap_common import clock
from gputap_common.names import worker_label

from ..domain.reconciliation import WorkerSeen, sessions_to_close, workers_seen
from ..domain.records import AccountState, SessionRecord
from .hub_api import HubAPI, user_url, workers_url
from .repeat import Loop

log = logging.getLogger("billing.reconcile")


class Reconciler(Loop):
    """Periodic reconciliation against the hub's REST API."""

    logger = log
    failed = "Reconciliation pass failed; trying again next interval"
    wait_first = True

    def __init__(
        self,
        load_accounts: Callable[[datetime], Awaitable[list[AccountState]]],
        close_session: Callable[[str, datetime], Awaitable[SessionRecord]],
        *,
        api_url: str,
        api_token: str,
        interval_seconds: float,
        mark_seen: Callable[[list[str], datetime], Awaitable[None]] | None = None,
        http_client: AsyncHTTPClient | None = None,
    ) -> None:
        self.load_accounts = load_accounts
        self.close_session = close_session
        self.mark_seen = mark_seen
        self.hub = HubAPI(api_url, api_token, http_client)
        self.interval_seconds = interval_seconds
        self.seen: dict[str, datetime] = {}
        self.missing: dict[str, int] = {}

    async def servers_of(self, username: str) -> set[str]:
        """Names of the user's servers the hub has (running or starting); raises when the
        hub cannot say."""
        try:
            response = await self.hub.fetch(user_url(self.hub.api_url, username))
        except HTTPClientError as e:
            if e.code == 404:
                return set()
            raise
        return set((json.loads(response.body).get("servers") or {}).keys())

    async def workers_of(self, username: str, server_name: str) -> dict[str, WorkerSeen]:
        """The workers the hub lists for the user's server (none when the server is gone:
        404); raises when the hub cannot say."""
        url = workers_url(self.hub.api_url, username, server_name)
        try:
            response = await self.hub.fetch(url)
        except HTTPClientError as e:
            if e.code == 404:
                return {}
            raise
        return workers_seen(json.loads(response.body))

    async def check(self, now: datetime | None = None) -> list[SessionRecord]:
        """One pass; returns the sessions it closed."""
        now = now or clock.utcnow()
        accounts = await self.load_accounts(now)
        sessions = [s for account in accounts for s in account.servers]
        present: set[tuple[str, str]] = set()
        workers: dict[tuple[str, str], dict[str, WorkerSeen]] = {}
        try:
            for username in {s.username for s in sessions if not s.is_worker}:
                present |= {(username, name) for name in await self.servers_of(username)}
            for key in {(s.username, s.server_name) for s in sessions if s.is_worker}:
                workers[key] = await self.workers_of(*key)
        except (HTTPClientError, OSError, ValueError) as e:
            log.warning("Reconciliation skipped: cannot read servers from the hub: %s", e)
            return []
        to_close = sessions_to_close(sessions, present, self.seen, self.missing, now, workers)
        if self.mark_seen is not None:
            await self.mark_seen([s.id for s in sessions if self.seen.get(s.id) == now], now)
        closed = []
        for session, ended_at in to_close:
            record = await self.close_session(session.id, ended_at)
            log.info(
                "Reconciliation: closed session %s of %s at %s (%s s): the hub no longer "
                "runs that %s",
                session.id,
                worker_label(session.username, session.server_name, session.worker),
                ended_at.isoformat(),
                record.billed_seconds,
                "worker" if session.is_worker else "server",
            )
            closed.append(record)
        return closed
