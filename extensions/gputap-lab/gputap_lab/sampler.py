"""Samples the GPU every few seconds, keeps a bounded history, marks GPU activity.

While the GPU is busy the sampler sets ``gputap_gpu_last_activity`` in the web app's
settings: jupyter_server's ``last_activity()`` counts every setting whose key ends in
``_last_activity``, and jupyterhub-singleuser reports that to the hub, so the idle culler
leaves a server alone while its GPU works even when nobody touches the notebook.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from .gpu import DeviceSample, GPUReader, GPUUnavailable

ACTIVITY_KEY = "gputap_gpu_last_activity"

SIMULATED_MESSAGE = "simulated card: no live numbers"
NO_GPU_MESSAGE = "CPU-only server: no GPU"


def utcnow() -> datetime:
    """Now, timezone-aware UTC (tests move it)."""
    return datetime.now(UTC)


def is_busy(devices: list[DeviceSample], busy_utilization_percent: int) -> bool:
    """Busy: a device at or above the threshold, or one with no utilisation (a MIG slice)
    that runs a compute process."""
    for device in devices:
        if device.utilization_percent is not None:
            if device.utilization_percent >= busy_utilization_percent:
                return True
        elif device.compute_processes:
            return True
    return False


def history_point(at: datetime, devices: list[DeviceSample], busy: bool) -> dict[str, Any]:
    """One point of the history plot: all the server's devices together."""
    utilizations = [d.utilization_percent for d in devices if d.utilization_percent is not None]
    processes = [d.compute_processes for d in devices if d.compute_processes is not None]
    return {
        "at": at.isoformat(),
        "utilization_percent": round(sum(utilizations) / len(utilizations))
        if utilizations
        else None,
        "memory_used_bytes": sum(d.memory_used_bytes for d in devices),
        "memory_total_bytes": sum(d.memory_total_bytes for d in devices),
        "compute_processes": sum(processes) if processes else None,
        "busy": busy,
    }


class Sampler:
    """Reads ``reader`` every ``interval_seconds`` in its own thread and keeps the last
    ``history_seconds`` of points. ``reader`` is None when there is nothing to read: a
    simulated card (``simulated``) or a CPU-only server."""

    def __init__(
        self,
        reader: GPUReader | None,
        *,
        simulated: bool,
        interval_seconds: float,
        history_seconds: float,
        busy_utilization_percent: int,
        settings: dict[str, Any],
        log: logging.Logger,
    ) -> None:
        self.reader = reader
        self.simulated = simulated
        self.interval_seconds = interval_seconds
        self.history_seconds = history_seconds
        self.busy_utilization_percent = busy_utilization_percent
        self.settings = settings
        self.log = log
        self.history: deque[dict[str, Any]] = deque(
            maxlen=max(1, math.ceil(history_seconds / interval_seconds))
        )
        self.devices: list[DeviceSample] = []
        self.busy = False
        self.sampled_at: datetime | None = None
        if simulated:
            self.message: str | None = SIMULATED_MESSAGE
        elif reader is None:
            self.message = NO_GPU_MESSAGE
        else:
            self.message = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="gputap-gpu")
        self._task: asyncio.Task[None] | None = None

    @property
    def available(self) -> bool:
        """Whether live numbers are being read."""
        return self.reader is not None and self.message is None

    async def sample_once(self) -> None:
        """Take one sample; mark activity when the GPU is busy."""
        if self.reader is None:
            return
        loop = asyncio.get_running_loop()
        try:
            devices = await loop.run_in_executor(self._executor, self.reader.read)
        except GPUUnavailable as e:
            if self.message != str(e):
                self.log.warning("gputap: no GPU numbers: %s", e)
            self.message = str(e)
            self.devices = []
            self.busy = False
            return
        if self.message is not None:
            self.log.info("gputap: reading the GPU again")
        self.message = None
        now = utcnow()
        busy = is_busy(devices, self.busy_utilization_percent)
        if busy != self.busy:
            self.log.info("gputap: GPU %s", "busy" if busy else "idle")
        self.devices, self.busy, self.sampled_at = devices, busy, now
        self.history.append(history_point(now, devices, busy))
        if busy:
            self.settings[ACTIVITY_KEY] = now

    async def _run(self) -> None:
        while True:
            try:
                await self.sample_once()
            except Exception:
                # one broken sample must not end sampling (and GPU-aware idling) for good
                self.log.exception("gputap: sampling the GPU failed")
            await asyncio.sleep(self.interval_seconds)

    def start(self) -> None:
        """Start sampling on the running loop (no-op without a reader)."""
        if self.reader is not None and self._task is None:
            self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Stop sampling and close the reader."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        if self.reader is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self.reader.close)
        self._executor.shutdown(wait=False)

    def to_json(self) -> dict[str, Any]:
        """The ``GET gputap/gpu`` answer."""
        return {
            "simulated": self.simulated,
            "available": self.available,
            "busy": self.busy,
            "message": self.message,
            "sampled_at": self.sampled_at.isoformat() if self.sampled_at else None,
            "interval_seconds": self.interval_seconds,
            "history_seconds": self.history_seconds,
            "busy_utilization_percent": self.busy_utilization_percent,
            "devices": [d.to_json() for d in self.devices] if self.available else [],
            "history": list(self.history) if self.available else [],
        }
