"""Interval charges: running sessions are charged as they run, so balances stay fresh.

Every ``interval_seconds`` each open session is charged up to the cost of its last whole
interval (``Store.post_interval_charges``); the keys ``charge:{session}:{k}`` make a repeated or
concurrent pass (a restart, a second replica) change nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from .. import metrics
from .repeat import Loop

log = logging.getLogger("billing.charge")


class Charger(Loop):
    """Runs ``post(interval)`` every ``interval_seconds``; one failing pass does not end it."""

    logger = log
    failed = "Charge pass failed; trying again next interval"
    errors = "charge"

    def __init__(
        self,
        post: Callable[[], Awaitable[tuple[int, int]]],
        *,
        interval_seconds: float,
    ) -> None:
        self.post = post
        self.interval_seconds = interval_seconds

    async def check(self) -> int:
        """One pass; returns the number of charges posted."""
        started = time.perf_counter()
        posted, running = await self.post()
        metrics.CYCLE_SECONDS.labels("charge").observe(time.perf_counter() - started)
        metrics.CHARGES_POSTED.labels("interval").inc(posted)
        metrics.RUNNING_SESSIONS.set(running)
        if posted:
            log.info("Posted %s interval charges (%s sessions running)", posted, running)
        return posted
