"""One start pipeline for everything that runs on a GPU: a server, a worker, and the ways to
start that come next (a pooled server, a server restarted after a fault).

A :class:`Start` walks one holder ("user/server", or "user/server#wK") through the same steps
on every backend: **place** (now, or first come first served in the queue), **take** the
devices (synchronously after the decision: no other start decides in between), **admit** with
billing (a hold on the minimum billable period), **launch**, and **open** billing's session
once it runs, noting on the record how long the start took to answer (its time to ready). It
has one failure path, :meth:`Start.give_back`: what was launched is stopped, the devices go
back, the queue's head is woken, and the hold or session is released or closed at zero
seconds, whatever step failed and whether or not it was cancelled.

The backend's part is a :class:`~.machine.Machine` (devices by holder) and the ``launch`` and
``stop`` callables of the thing started; billing's is a :class:`~.metering.Metering`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TypeVar

from ..core.catalog import Catalog
from ..core.placement import FreeView, Placement, Refusal, Request
from ..core.record import ServerRecord
from ..core.time_to_ready import TimeToReady
from . import placing
from .billing_client import BillingRefused, BillingUnavailable, unavailable_error
from .machine import Machine
from .metering import Metering

T = TypeVar("T")


class Start:
    """One holder's start, from its placement to its open billing session."""

    def __init__(
        self,
        machine: Machine,
        metering: Metering,
        catalog: Catalog,
        holder: str,
        log: logging.Logger | logging.LoggerAdapter,
        began: float | None = None,
    ):
        """``began``: when the start was asked for (``time.monotonic()``; default now)."""
        self.machine = machine
        self.metering = metering
        self.catalog = catalog
        self.holder = holder
        self.log = log
        #: what was placed and taken (None until :meth:`take`, and again once given back)
        self.record: ServerRecord | None = None
        self.admitted = False
        self.began = time.monotonic() if began is None else began
        #: seconds :meth:`place` waited in the queue
        self.queued_seconds = 0.0

    # -- placing ----------------------------------------------------------------------------

    async def place(
        self,
        request: Request,
        *,
        free_view: Callable[[], FreeView],
        prices: dict[str, int],
        may_wait: bool,
        wait_seconds: int,
        note: Callable[[str], None],
    ) -> Placement:
        """Place now, or (``may_wait``) wait in the queue; 409 saying why not
        (:func:`~.placing.place_or_wait`). Returns without yielding after the decision."""
        entered = time.monotonic()
        try:
            return await placing.place_or_wait(
                request,
                holder=self.holder,
                may_wait=may_wait,
                catalog=self.catalog,
                free_view=free_view,
                prices=prices,
                wait_seconds=wait_seconds,
                note=note,
                wake=self.wake,
            )
        finally:
            self.queued_seconds += time.monotonic() - entered

    def decide(
        self, request: Request, view: FreeView, prices: dict[str, int]
    ) -> Placement | Refusal:
        """Where ``request`` goes now, never ahead of whoever waits in line."""
        return placing.decide_in_turn(request, self.holder, view, self.catalog, prices)

    def take(self, placement: Placement, record: ServerRecord) -> ServerRecord:
        """Take what ``placement`` chose, noted on ``record`` (call right after deciding)."""
        self.machine.take(placement, record, self.holder)
        self.record = record
        return record

    # -- billing and launching ----------------------------------------------------------------

    async def admit(self) -> None:
        """Billing's admission: a hold on the minimum billable period (402 or 400 when the
        credit does not cover it, 503 when billing cannot be asked)."""
        await self.metering.admit(self._taken())
        self.admitted = True

    async def open(self, started_at: datetime) -> None:
        """Billing's session, from ``started_at`` (503 when billing cannot be asked)."""
        try:
            await self.metering.open(self._taken(), started_at)
        except (BillingUnavailable, BillingRefused) as e:
            raise unavailable_error(e) from None

    async def run(
        self,
        launch: Callable[[], Awaitable[T]],
        started_at: Callable[[T], Awaitable[datetime]],
        stop: Callable[[], Awaitable[object]],
    ) -> T:
        """Admit (unless done), ``launch`` (which cleans up after itself when it fails), and
        open billing at ``started_at(launched)``; the record notes the time to ready once
        ``launch`` returns (the server answers). Any failure, a cancellation included,
        stops what was launched and gives everything back before it is raised."""
        launched = False
        try:
            if not self.admitted:
                await self.admit()
            result = await launch()
            launched = True
            self._taken().time_to_ready = TimeToReady(
                time.monotonic() - self.began, self.queued_seconds
            )
            await self.open(await started_at(result))
        except BaseException:
            if launched:
                with contextlib.suppress(Exception):
                    await stop()
            await self.give_back()
            raise
        return result

    # -- the failure path ----------------------------------------------------------------------

    async def give_back(self) -> None:
        """The devices back, the queue woken, billing's hold released (or a session that may
        have opened closed at zero seconds)."""
        record = self._release()
        if record is not None:
            await self.metering.abandon(record)

    def give_back_soon(self, spawn: Callable[[Awaitable[None]], object]) -> None:
        """:meth:`give_back` from code that cannot wait: the devices go back now, billing's
        release runs in the background (``spawn`` keeps the task)."""
        record = self._release()
        if record is not None:
            spawn(self.metering.abandon(record))

    def wake(self) -> None:
        """Wake the queue's head if what it waits for fits now."""
        placing.queues.poke(self.machine.queue_view())

    def _release(self) -> ServerRecord | None:
        record, self.record = self.record, None
        if record is None:
            return None
        self.machine.release(record, self.holder)
        self.log.info("%s: start failed, released %s", self.holder, ",".join(record.devices) or "-")
        self.wake()
        return record

    def _taken(self) -> ServerRecord:
        if self.record is None:
            raise RuntimeError(f"{self.holder}: nothing was taken to start")
        return self.record
