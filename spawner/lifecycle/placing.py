"""Placement in the hub: place now, or wait first come first served for a sold-out offering.

One set of waiting lines per hub process (:data:`queues`), shared by every spawner and by
changes of GPU, so nobody jumps the line: not a spawn that asked for a spec, not a change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tornado import web

from ..core.catalog import Catalog
from ..core.choices import units, wanted_key
from ..core.placement import FreeView, Placement, Refusal, Request, RequestError, place
from ..core.queue import WaitQueues, ordinal

#: the hub's waiting lines, one per sold-out offering
queues = WaitQueues()
#: holders that join the front of their line (a server moved off a failed GPU)
front: set[str] = set()


def decide(
    request: Request, view: FreeView, catalog: Catalog, prices: dict[str, int]
) -> Placement | Refusal:
    """Placement's answer; 400 for a request no machine here could serve."""
    try:
        return place(request, view, catalog, prices)
    except RequestError as e:
        raise web.HTTPError(400, f"Invalid server options: {e}") from None


def decide_in_turn(
    request: Request, holder: str, view: FreeView, catalog: Catalog, prices: dict[str, int]
) -> Placement | Refusal:
    """Decide, never taking what others wait in line for (nobody jumps the line, spec
    requests included)."""
    wanted = wanted_key(request)
    line = queues.waiting(wanted) if wanted else 0
    if line and not queues.is_head(holder, wanted):
        label = catalog.offering(wanted).label
        return Refusal(f"No {label} free for you now: {line} waiting before you")
    answer = decide(request, view, catalog, prices)
    if isinstance(answer, Placement) and wanted is None:
        waiting = queues.waiting(answer.offering.key)
        if waiting:
            return Refusal(
                f"The {answer.offering.label} that fits is promised to {waiting} waiting in line"
            )
    return answer


async def place_or_wait(
    request: Request,
    *,
    holder: str,
    may_wait: bool,
    catalog: Catalog,
    free_view: Callable[[], FreeView],
    prices: dict[str, int],
    wait_seconds: int,
    note: Callable[[str], None],
    wake: Callable[[], None],
) -> Placement:
    """Place now, or, when ``may_wait``, wait first come first served (at most
    ``wait_seconds``); ``note`` hears the place in line ("" once out of it), ``wake`` is called on
    leaving (the next in line may fit in what is left).

    Returns without yielding to the event loop after the decision, so the caller takes the
    devices (or reserves the units) before any other spawn can decide.
    """
    wanted = wanted_key(request)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_seconds
    try:
        while True:
            answer = decide_in_turn(request, holder, free_view(), catalog, prices)
            if isinstance(answer, Placement):
                return answer
            if not may_wait or wanted is None:
                hint = " Ask to wait in the queue, or pick" if wanted else " Pick"
                raise web.HTTPError(409, f"{answer.message}{hint} a free option.")
            waiter = queues.join_if_absent(holder, wanted, units(request), holder in front)
            label = catalog.offering(wanted).label
            note(f"waiting for a free {label}: {ordinal(queues.position(holder))} in queue")
            waiter.woken.clear()
            try:
                async with asyncio.timeout(max(0, deadline - loop.time())):
                    await waiter.woken.wait()
            except TimeoutError:
                raise web.HTTPError(
                    409,
                    f"Still no {label} free after waiting {wait_seconds // 60} minutes; pick "
                    "another option or try again later.",
                ) from None
    finally:
        queues.leave(holder)
        note("")
        wake()
