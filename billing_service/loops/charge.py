"""Interval charges: running sessions are charged as they run, so balances stay fresh.

Every ``interval_seconds`` the charger runs one :func:`charge_pass`, in two steps:

1. **Course weeks roll** (``Store.roll_course_weeks``): a student whose course session runs
   into a new week has it charged up to the boundary from the old week's allowance, what is
   left of that expires, and the new week is granted, so the charges after the boundary are
   paid by the new week.
2. **Interval charges** (``Store.post_interval_charges``): each open session is charged up to
   the cost of its last whole interval; the keys ``charge:{session}:{k}`` make a repeated or
   concurrent pass (a restart, a second replica) change nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime

from .. import metrics
from ..store import Store
from .repeat import Loop

log = logging.getLogger("billing.charge")


def charge_pass(
    store: Store, now: datetime, interval_seconds: int, batch_size: int, workers: int
) -> tuple[int, int]:
    """One pass of the charger at ``now`` (blocking: run it in the database executor): the
    course weeks rolled, then the interval charges (the module docstring). Returns the
    charges posted and the sessions running."""
    store.roll_course_weeks(now)
    posted = store.post_interval_charges(now, interval_seconds, batch_size, workers)
    return posted, store.running_count()


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
        """One pass (``post``: :func:`charge_pass` in the executor); returns the number of
        charges posted."""
        started = time.perf_counter()
        posted, running = await self.post()
        metrics.CYCLE_SECONDS.labels("charge").observe(time.perf_counter() - started)
        metrics.CHARGES_POSTED.labels("interval").inc(posted)
        metrics.RUNNING_SESSIONS.set(running)
        if posted:
            log.info("Posted %s interval charges (%s sessions running)", posted, running)
        return posted
