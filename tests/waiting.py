"""Waiting for what another process, thread or task brings about: one polling loop for every
test, in a plain and an async form.

    pod = wait_for(lambda: core.read_namespaced_pod("ada", ns).spec.node_name, "ada bound")
    await wait_for_async(lambda: meter.synced, "the meter synced", timeout=15)

The predicate is asked every ``step`` seconds at first, then less often: each pause a quarter
longer than the last, up to half a second (or ``step``, when larger). A short wait stays quick;
a long one stops costing the hub, billing or the simulated cluster's API twenty requests a
second, which on a two-core machine running four tests at once slowed every other test.

Each returns the predicate's first truthy value. On timeout it fails with an AssertionError
naming what it waited for and the predicate's last value; ``what`` may be a callable, asked
only then, for words that need the moment of failure (a log tail, a list read so far).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

#: each pause this much longer than the last ...
GROWTH = 1.25
#: ... up to this many seconds (or the caller's step, when larger)
LONGEST_PAUSE = 0.5

What = str | Callable[[], str]


def wait_for(
    predicate: Callable[[], T],
    what: What = "the condition",
    timeout: float = 10.0,
    step: float = 0.05,
) -> T:
    """Ask ``predicate()`` every ``step`` seconds, then less often (the module's docstring),
    until it is truthy and return that value; it is asked once more at ``timeout`` before the
    wait fails."""
    deadline = _deadline(what, timeout)
    pauses = _pauses(step)
    while True:
        value = predicate()
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise _timed_out(what, timeout, value)
        time.sleep(min(next(pauses), left))


async def wait_for_async(
    predicate: Callable[[], Any | Awaitable[Any]],
    what: What = "the condition",
    # not asyncio.timeout: the predicate is never cancelled mid-call, and asked once more at
    # the deadline, as wait_for does
    timeout: float = 10.0,  # noqa: ASYNC109
    step: float = 0.05,
) -> Any:
    """wait_for in an event loop: sleeps with asyncio, and ``predicate`` may be a coroutine
    function (its result is awaited)."""
    deadline = _deadline(what, timeout)
    pauses = _pauses(step)
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise _timed_out(what, timeout, value)
        await asyncio.sleep(min(next(pauses), left))


def _pauses(step: float) -> Iterator[float]:
    """``step``, then each pause GROWTH times the last, up to LONGEST_PAUSE (or ``step``)."""
    longest = max(step, LONGEST_PAUSE)
    pause = step
    while True:
        yield pause
        pause = min(pause * GROWTH, longest)


def _deadline(what: What, timeout: float) -> float:
    # a timeout passed where ``what`` goes would silently wait the default instead
    if not (isinstance(what, str) or callable(what)):
        raise TypeError(f"what: words or a function giving them, not {what!r}")
    return time.monotonic() + timeout


def _timed_out(what: What, timeout: float, value: object) -> AssertionError:
    words = what() if callable(what) else what
    return AssertionError(f"not within {timeout}s (last value {value!r}): {words}")
