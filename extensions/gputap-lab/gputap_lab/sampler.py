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
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .cpu import ProcessTreeCPU
from .gpu import DeviceSample, GPUReader, GPUUnavailable
from .health import HealthMonitor

ACTIVITY_KEY = "gputap_gpu_last_activity"

SIMULATED_MESSAGE = "simulated card: no live numbers"
NO_GPU_MESSAGE = "CPU-only server: no GPU"


def utcnow() -> datetime:
    """Now, timezone-aware UTC (tests move it)."""
    return datetime.now(UTC)


@dataclass
class _Held:
    """What a device without utilisation held when it last changed."""

    footprint: tuple[tuple[int, int], ...] | None
    memory: int | None
    floor: int | None  # the least memory it was seen with: the driver's own
    changed_at: datetime | None


class BusyRule:
    """Whether the server's GPU works, sample by sample.

    A device with a utilisation (a whole GPU, or a MIG slice whose GPU counts activity per
    instance) is busy at or above ``busy_utilization_percent``. A device without one (a MIG
    slice on an A100 or A30) is busy while something holds it and that changed within the
    last ``steady_idle_seconds``: its compute processes (ids and memory), when NVML lists
    them, else its used memory above the least seen. A context that holds the same memory
    unchanged that long does no work that NVML can see: it is idle, so it cannot keep a
    slice busy forever, unless the server's processes use at least ``busy_cpu_percent`` of
    a CPU meanwhile (``cpu_percent``, from cpu.py): a loop feeding the slice does.
    """

    def __init__(
        self,
        busy_utilization_percent: int,
        steady_idle_seconds: float,
        busy_cpu_percent: float = 20.0,
    ) -> None:
        self.busy_utilization_percent = busy_utilization_percent
        self.steady_idle = timedelta(seconds=steady_idle_seconds)
        self.busy_cpu_percent = busy_cpu_percent
        self._held: dict[str, _Held] = {}

    def __call__(
        self, devices: list[DeviceSample], now: datetime, cpu_percent: float | None = None
    ) -> bool:
        working = cpu_percent is not None and cpu_percent >= self.busy_cpu_percent
        busy = False
        for device in devices:
            # every device is looked at: each one's memory of changes must stay current
            busy = self._busy(device, now, working) or busy
        return busy

    def _busy(self, device: DeviceSample, now: datetime, working: bool = False) -> bool:
        if device.utilization_percent is not None:
            return device.utilization_percent >= self.busy_utilization_percent
        memory = device.memory_used_bytes
        held = self._held.get(device.uuid)
        if held is None:
            held = self._held[device.uuid] = _Held(device.footprint, memory, memory, None)
            if device.compute_processes:
                held.changed_at = now  # listed at start: busy until it proves steady
        elif device.footprint != held.footprint or memory != held.memory:
            held.footprint, held.memory, held.changed_at = device.footprint, memory, now
        if memory is not None:
            held.floor = memory if held.floor is None else min(held.floor, memory)
        if device.compute_processes is not None:
            holds = device.compute_processes > 0
        else:
            holds = memory is not None and held.floor is not None and memory > held.floor
        if not holds:
            return False
        recent = held.changed_at is not None and now - held.changed_at < self.steady_idle
        return recent or working


def history_point(at: datetime, devices: list[DeviceSample], busy: bool) -> dict[str, Any]:
    """One point of the history plot: all the server's devices together."""
    utilizations = [d.utilization_percent for d in devices if d.utilization_percent is not None]
    processes = [d.compute_processes for d in devices if d.compute_processes is not None]
    used = [d.memory_used_bytes for d in devices if d.memory_used_bytes is not None]
    total = [d.memory_total_bytes for d in devices if d.memory_total_bytes is not None]
    return {
        "at": at.isoformat(),
        "utilization_percent": round(sum(utilizations) / len(utilizations))
        if utilizations
        else None,
        "memory_used_bytes": sum(used) if used else None,
        "memory_total_bytes": sum(total) if total else None,
        "compute_processes": sum(processes) if processes else None,
        "busy": busy,
    }


class Sampler:
    """Reads ``reader`` every ``interval_seconds`` in its own thread and keeps the last
    ``history_seconds`` of points. ``reader`` is None when there is nothing to read: a
    simulated card (``simulated``) or a CPU-only server. ``health``, when given, checks the
    devices for faults after each read, in the same thread (health.py)."""

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
        steady_idle_seconds: float = 600.0,
        busy_cpu_percent: float = 20.0,
        health: HealthMonitor | None = None,
    ) -> None:
        self.reader = reader
        self.health = health
        self.simulated = simulated
        self.interval_seconds = interval_seconds
        self.history_seconds = history_seconds
        self.busy_utilization_percent = busy_utilization_percent
        self.rule = BusyRule(busy_utilization_percent, steady_idle_seconds, busy_cpu_percent)
        #: the CPU of this server's processes, for slices without counters of their own
        self.cpu = ProcessTreeCPU(os.getpid())
        self.cpu_percent: float | None = None
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
        self._errors: dict[str, str | None] = {}  # each device's last error, logged once
        self._failure: str | None = None  # the last unexpected failure, logged once
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="gputap-gpu")
        self._task: asyncio.Task[None] | None = None

    @property
    def available(self) -> bool:
        """Whether live numbers are being read."""
        return self.reader is not None and self.message is None

    async def sample_once(self) -> None:
        """Take one sample; mark activity when the GPU is busy; check the GPU's health
        (also when no numbers could be read: a lost GPU is one reason)."""
        if self.reader is None:
            return
        try:
            await self._read()
        finally:
            if self.health is not None:
                await self.health.run(self._executor)

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            devices = await loop.run_in_executor(self._executor, self.reader.read)
            # /proc is walked only for a device without counters of its own (A100/A30 MIG)
            if any(d.utilization_percent is None for d in devices):
                self.cpu_percent = await loop.run_in_executor(self._executor, self.cpu.percent)
            else:
                self.cpu_percent = None
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
        self._log_device_errors(devices)
        busy = self.rule(devices, now, self.cpu_percent)
        if busy != self.busy:
            self.log.info("gputap: GPU %s", "busy" if busy else "idle")
        self.devices, self.busy, self.sampled_at = devices, busy, now
        self.history.append(history_point(now, devices, busy))
        if busy:
            self.settings[ACTIVITY_KEY] = now

    def _log_device_errors(self, devices: list[DeviceSample]) -> None:
        """One line when a device starts failing, changes why, or reads again."""
        for device in devices:
            before = self._errors.get(device.uuid)
            if device.error != before:
                if device.error:
                    self.log.warning("gputap: GPU %s: %s", device.uuid, device.error)
                else:
                    self.log.info("gputap: GPU %s reads again", device.uuid)
                self._errors[device.uuid] = device.error

    async def _run(self) -> None:
        while True:
            try:
                await self.sample_once()
                self._failure = None
            except Exception as e:
                # one broken sample must not end sampling (and GPU-aware idling) for good,
                # nor fill the log: the same failure is logged once
                failure = f"{type(e).__name__}: {e}"
                if failure != self._failure:
                    self.log.exception("gputap: sampling the GPU failed")
                self._failure = failure
                self.message = f"reading the GPU failed ({failure})"
                self.devices, self.busy = [], False
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
        if self.health is not None:
            await self.health.stop(self._executor)
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
            "cpu_percent": None if self.cpu_percent is None else round(self.cpu_percent, 1),
            "devices": [d.to_json() for d in self.devices] if self.available else [],
            "history": list(self.history) if self.available else [],
        }
