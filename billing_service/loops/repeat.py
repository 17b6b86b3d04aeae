"""The one way billing's background loops run: a pass every interval, forever, a failing pass
logged (and counted) without ending the loop."""

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
