"""The one way billing's background loops run: a pass every interval, forever, a failing pass
logged (and counted) without ending the loop; :class:`Loop` is a loop of one such pass."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from .. import metrics


async def repeat(
    check: Callable[[], Awaitable[object]],
    interval_seconds: float,
    *,
    log: logging.Logger,
    failed: str,
    errors: str | None = None,
    wait_first: bool = False,
) -> None:
    """Await ``check()`` every ``interval_seconds`` (after waiting one first with
    ``wait_first``). A pass that raises is logged with ``failed`` and, with ``errors``, counted
    under that label of ``metrics.ERRORS``; the next pass runs on time."""
    if wait_first:
        await asyncio.sleep(interval_seconds)
    while True:
        try:
            await check()
        except Exception:
            if errors is not None:
                metrics.ERRORS.labels(errors).inc()
            log.exception(failed)
        await asyncio.sleep(interval_seconds)


class Loop:
    """A background loop: ``check()`` every ``interval_seconds``, through :func:`repeat`.
    A subclass defines ``async check()`` (one pass), sets ``interval_seconds`` and says how a
    failed pass is logged."""

    #: one pass (each subclass defines it)
    check: Callable[[], Awaitable[object]]

    interval_seconds: float
    #: the log a failed pass is written to, and what it says
    logger: logging.Logger
    failed: str
    #: the label of ``metrics.ERRORS`` a failed pass counts under (None: not counted)
    errors: str | None = None
    #: wait one interval before the first pass
    wait_first: bool = False

    async def run(self) -> None:
        """Check forever, every ``interval_seconds``; one failing pass does not end it."""
        await repeat(
            self.check,
            self.interval_seconds,
            log=self.logger,
            failed=self.failed,
            errors=self.errors,
            wait_first=self.wait_first,
        )
