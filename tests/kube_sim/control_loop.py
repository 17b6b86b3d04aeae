"""What the simulated controllers (the scheduler, the kubelet, the garbage collector) share:
a subscription to the store that hands each change to ``_on_change``, and a task running
``_run``, their control loop; ``stop`` ends both.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from .api import Api
from .store import WatchEvent


async def cancel(task: asyncio.Task | None) -> None:
    """Cancel ``task`` (if any) and wait until it has ended."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class ControlLoop:
    """A controller watching the API. ``_on_change`` runs inside the store's write, so it only
    notes what changed (writing from there, watchers would see events out of order); ``_run``
    acts on it."""

    api: Api
    _task: asyncio.Task | None = None
    _unsubscribe: Callable[[], None] | None = None

    def start(self) -> None:
        self._unsubscribe = self.api.store.subscribe(self._on_change)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._unsubscribe:
            self._unsubscribe()
        await cancel(self._task)

    def _on_change(self, event: WatchEvent) -> None:
        raise NotImplementedError

    async def _run(self) -> None:
        raise NotImplementedError
