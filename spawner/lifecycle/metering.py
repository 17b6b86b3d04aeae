"""Billing's side of a server's life, as the hub sees it: admission and its hold, the billing
session's start, and its settlement when the server ends.

Every call names the session by the record's id, so a retry, a replay or billing's own pod
meter never opens or closes a second one. Closing a session or releasing a hold while billing
is unreachable is retried in the background (billing's stop, with the same end time, and its
release are idempotent).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from tornado import web

from gputap_common import clock

from ..core.record import ServerRecord
from .billing_client import BillingClient, BillingRefused, BillingUnavailable, unavailable_error

#: how long the hub keeps trying to close a session or release a hold while billing is down
RETRY_SECONDS = 3600
# background retries of closes and releases (asyncio keeps only weak references to tasks)
_retries: set[asyncio.Task] = set()


class Metering:
    """Billing calls for one server (``who``: ``user`` or ``user/server``)."""

    def __init__(
        self, billing: BillingClient, user: str, server: str, who: str, log: logging.Logger
    ):
        self.billing = billing
        self.user = user
        self.server = server
        self.who = who
        self.log = log

    async def admit(self, record: ServerRecord) -> None:
        """Ask billing whether the user's credit (or the course) covers the minimum billable
        period. Billing holds that much until the session opens; the hold's id goes on the
        record, to be released if the start fails. 402/400 with billing's reason when not."""
        # the session id names the hold: if the answer is lost, the hold can still be released
        try:
            answer = await self.billing.admit(self.user, record)
        except BillingRefused as e:
            raise web.HTTPError(402 if e.status == 402 else 400, e.message) from None
        except BillingUnavailable as e:
            # billing may have placed the hold before failing to answer
            record.hold_id = record.session_id
            raise unavailable_error(e) from None
        record.hold_id = answer["hold_id"]

    async def open(self, record: ServerRecord, started_at: datetime) -> None:
        """Start metering ``record`` at ``started_at``.

        ``started_at`` goes on the record first: if the call fails or is cancelled after
        billing stored the session, :meth:`settle` closes it at zero seconds."""
        record.started_at = started_at
        await self.billing.start_session(self.user, self.server, record)
        record.hold_id = None  # the hold is the session now: nothing left to release

    async def settle(self, record: ServerRecord, ended_at: datetime) -> dict[str, Any] | None:
        """Close the record's session at ``ended_at`` (never before it started: clocks of
        nodes and hub may differ). A record whose session never opened gives back the hold
        its admission placed instead."""
        result = None
        if record.started_at is not None:
            result = await self.close(record.session_id, max(ended_at, record.started_at))
        await self.release_hold(record)
        return result

    async def abandon(self, record: ServerRecord) -> None:
        """A start that failed or was cancelled: a session that may have opened is closed at
        zero seconds, and the hold is released, so the user's credit is free again at once."""
        await self.settle(record, record.started_at or clock.utcnow())

    async def release_hold(self, record: ServerRecord) -> None:
        """Release the hold of a record whose session never opened. When billing cannot be
        reached it is retried in the background, so the credit is free again as soon as
        billing is back (at the latest the hold expires by itself, ``billing.hold_seconds``)."""
        hold_id, record.hold_id = record.hold_id, None
        if not hold_id:
            return
        released = await self._now_or_later(
            f"releasing billing hold {hold_id}",
            lambda: self.billing.release_hold(hold_id),
            lambda e: self._release_refused(hold_id, e),
        )
        if released is not None:
            self.log.info("%s: start abandoned, billing hold %s released", self.who, hold_id)

    def _release_refused(self, hold_id: str, e: BillingRefused) -> None:
        if e.status != 404:  # 404: the admission whose answer was lost placed none
            self.log.warning("%s: billing refused to release hold %s: %s", self.who, hold_id, e)

    async def close(self, session_id: str, ended_at: datetime) -> dict[str, Any] | None:
        """Settle a session at ``ended_at``; if billing is down, keep retrying in the
        background with the same end time (the stop is idempotent, so no double charge)."""
        return await self._now_or_later(
            f"closing billing session {session_id}",
            lambda: self.billing.stop_session(session_id, ended_at),
            lambda e: self._refused(session_id, e),
        )

    async def _now_or_later(
        self,
        what: str,
        call: Callable[[], Awaitable[dict[str, Any]]],
        refused: Callable[[BillingRefused], None],
    ) -> dict[str, Any] | None:
        """Billing's answer to ``call``; None when billing refused it (``refused`` says so)
        or is down, in which case it is retried in the background until billing answers."""
        try:
            return await call()
        except BillingRefused as e:
            refused(e)
        except BillingUnavailable as e:
            self.log.warning("%s: %s later: %s", self.who, what, e)
            self._retry(what, call, refused)
        return None

    def _refused(self, session_id: str, e: BillingRefused) -> None:
        if e.status != 404:  # 404: the start never reached billing, nothing to close
            self.log.error("%s: billing refused to close %s: %s", self.who, session_id, e)

    def _retry(
        self,
        what: str,
        call: Callable[[], Awaitable[Any]],
        refused: Callable[[BillingRefused], None],
    ) -> None:
        """Repeat an idempotent billing ``call`` in the background until billing answers
        (backing off to once a minute), for at most RETRY_SECONDS; ``what`` it does
        is logged with the outcome."""
        task = asyncio.ensure_future(self._repeat(what, call, refused))
        _retries.add(task)
        task.add_done_callback(_retries.discard)

    async def _repeat(
        self,
        what: str,
        call: Callable[[], Awaitable[Any]],
        refused: Callable[[BillingRefused], None],
    ) -> None:
        delay, waited = 1.0, 0.0
        while waited < RETRY_SECONDS:
            await asyncio.sleep(delay)
            waited += delay
            try:
                await call()
                self.log.info("%s: %s: done", self.who, what)
                return
            except BillingUnavailable:
                delay = min(delay * 2, 60)
            except BillingRefused as e:
                refused(e)
                return
        self.log.error("%s: %s: gave up after %d s", self.who, what, RETRY_SECONDS)
