"""Billing's side of a server's life, as the hub sees it: admission and its hold, the billing
session's start, and its settlement when the server ends.

Every call names the session by the record's id, so a retry, a replay or billing's own pod
meter never opens or closes a second one. Closing a session while billing is unreachable is
retried in the background with the same end time (billing's stop is idempotent).
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any

from tornado import web

from gputap_common import clock

from ..core.record import ServerRecord
from .billing_client import BillingClient, BillingRefused, BillingUnavailable, unavailable_error

#: how long the hub keeps trying to close a billing session while billing is unreachable
CLOSE_RETRY_SECONDS = 3600
# background retries of closes (asyncio keeps only weak references to tasks)
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
        """Release the hold of a record whose session never opened. Best effort: when billing
        cannot be reached the hold expires by itself (``billing.hold_seconds``)."""
        hold_id, record.hold_id = record.hold_id, None
        if not hold_id:
            return
        try:
            await self.billing.release_hold(hold_id)
        except BillingRefused as e:
            if e.status != 404:  # 404: the admission whose answer was lost placed none
                self.log.warning("%s: billing refused to release hold %s: %s", self.who, hold_id, e)
        except BillingUnavailable as e:
            self.log.warning(
                "%s: hold %s not released, it expires by itself: %s", self.who, hold_id, e
            )
        else:
            self.log.info("%s: start abandoned, billing hold %s released", self.who, hold_id)

    async def close(self, session_id: str, ended_at: datetime) -> dict[str, Any] | None:
        """Settle a session at ``ended_at``; if billing is down, keep retrying in the
        background with the same end time (the stop is idempotent, so no double charge)."""
        try:
            return await self.billing.stop_session(session_id, ended_at)
        except BillingRefused as e:
            self._refused(session_id, e)
        except BillingUnavailable as e:
            self.log.warning("%s: closing %s later: %s", self.who, session_id, e)
            task = asyncio.ensure_future(self._retry_close(session_id, ended_at))
            _retries.add(task)
            task.add_done_callback(_retries.discard)
        return None

    def _refused(self, session_id: str, e: BillingRefused) -> None:
        if e.status != 404:  # 404: the start never reached billing, nothing to close
            self.log.error("%s: billing refused to close %s: %s", self.who, session_id, e)

    async def _retry_close(self, session_id: str, ended_at: datetime) -> None:
        delay, waited = 1.0, 0.0
        while waited < CLOSE_RETRY_SECONDS:
            await asyncio.sleep(delay)
            waited += delay
            try:
                await self.billing.stop_session(session_id, ended_at)
                self.log.info("%s: billing session %s closed", self.who, session_id)
                return
            except BillingUnavailable:
                delay = min(delay * 2, 60)
            except BillingRefused as e:
                self._refused(session_id, e)
                return
        self.log.error("%s: gave up closing billing session %s", self.who, session_id)
