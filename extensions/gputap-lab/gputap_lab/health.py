"""This server's own GPUs checked for faults at each sample, each finding told to the hub once.

Three faults are looked for (docs/design-gpu-faults.md, "What gputap watches"), on the
devices the server was given:

- **lost**: NVML answers ``NVML_ERROR_GPU_IS_LOST`` to any call on the device;
- **ecc**: the GPU's volatile uncorrected ECC count rose above its first reading here
  (``nvmlDeviceGetTotalEccErrors``; errors from before this server started are not its);
- **remap**: the GPU's row remapping failed (``nvmlDeviceGetRemappedRows``: failureOccurred).

A card or driver that does not have a counter (``NOT_SUPPORTED``, or a function the
library lacks) is simply not checked for it. A fault never clears by itself: a device that
was found faulty stays so for the life of the server. Each finding (device and kind) is
posted once to the hub's ``POST {server}/gpu-fault`` with the server's own token; a post
that fails for want of an answer is tried again after the next check. ``GET
gputap/gpu-health`` answers the last check (:meth:`HealthMonitor.to_json`).

:class:`NvmlHealthCheck` blocks (NVML is a C library): the sampler runs it in its own
executor, after each read, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import pynvml

from .gpu import GPUUnavailable
from .hub import HubClient, HubError

KINDS = ("lost", "ecc", "remap")

# A counter this card or driver does not have: not checked, and not asked again.
_ABSENT_CODES = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
_MISSING = (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLLibraryMismatchError)


@dataclass(frozen=True)
class Finding:
    """One fault of one of the server's devices: what the hub is told."""

    device: str
    kind: str  # one of KINDS
    detail: str

    def to_json(self) -> dict[str, str]:
        """The body of ``POST {server}/gpu-fault``."""
        return {"device": self.device, "kind": self.kind, "detail": self.detail}


@dataclass(frozen=True)
class Reading:
    """One device's health facts at one check; a fact that is not known is None.

    ``lost`` says why NVML holds the GPU lost; ``error`` why the device could not be
    checked this time (the next check tries again).
    """

    uuid: str
    lost: str | None = None
    ecc_uncorrected: int | None = None
    remap_failed: bool | None = None
    error: str | None = None


class HealthState:
    """What the checks found so far, from their readings (pure: no NVML, no I/O)."""

    def __init__(self) -> None:
        self.readings: list[Reading] = []
        self.checked_at: datetime | None = None
        #: each device's findings, first first; a finding is never taken back
        self.found: dict[str, list[Finding]] = {}
        self._first_ecc: dict[str, int] = {}

    def update(self, readings: list[Reading], at: datetime) -> list[Finding]:
        """Take one check's readings; answer the findings not made before."""
        self.readings, self.checked_at = readings, at
        new = []
        for reading in readings:
            found = self.found.setdefault(reading.uuid, [])
            kinds = {f.kind for f in found}
            for finding in self._findings(reading):
                if finding.kind not in kinds:
                    found.append(finding)
                    kinds.add(finding.kind)
                    new.append(finding)
        return new

    def _findings(self, reading: Reading) -> list[Finding]:
        uuid = reading.uuid
        findings = []
        if reading.lost is not None:
            findings.append(Finding(uuid, "lost", f"NVML answers: {reading.lost}"))
        count = reading.ecc_uncorrected
        if count is not None:
            first = self._first_ecc.setdefault(uuid, count)
            if count < first:
                # the volatile count starts again at a driver reload: compare with the new one
                self._first_ecc[uuid] = count
            elif count > first:
                findings.append(
                    Finding(
                        uuid,
                        "ecc",
                        f"{count - first} uncorrected ECC error(s) since this server started "
                        f"(volatile count {first} -> {count})",
                    )
                )
        if reading.remap_failed:
            findings.append(
                Finding(
                    uuid, "remap", "row remapping failed: a bad memory row could not be remapped"
                )
            )
        return findings

    def device_view(self, reading: Reading) -> dict[str, Any]:
        found = self.found.get(reading.uuid)
        if found:
            first = found[0]
            return {
                "uuid": reading.uuid,
                "healthy": False,
                "kind": first.kind,
                "detail": first.detail,
            }
        view: dict[str, Any] = {"uuid": reading.uuid, "healthy": True}
        if reading.error is not None:
            view["detail"] = f"not checked this time: {reading.error}"
        return view


class HealthCheck(Protocol):
    """What the monitor needs of a check (``GPUTapLab.gpu_health_class``)."""

    def __init__(self, devices: list[str] | None) -> None: ...

    def check(self) -> list[Reading]:
        """One reading per device; blocks; raises GPUUnavailable when NVML cannot be used."""
        ...

    def close(self) -> None: ...


def _reason(error: Exception) -> str:
    return str(error) or type(error).__name__


def _lost(error: Exception) -> bool:
    return getattr(error, "value", None) == pynvml.NVML_ERROR_GPU_IS_LOST


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _DeviceLost(Exception):
    """NVML answered GPU_IS_LOST: the reading says so and nothing else is asked."""


class NvmlHealthCheck:
    """Checks the devices through NVML (``pynvml``); ``devices`` as the reader gets them
    (UUIDs or indices; None for every device NVML shows).

    NVML is initialised on the first check, in the sampler's executor (it counts its
    initialisations, so the reader's own does not interfere). Handles are asked for again
    at every check: a lost GPU answers GPU_IS_LOST there, and MIG handles do not outlive a
    reconfiguration. ECC and remapping are the GPU's: a MIG device is checked on its GPU.
    """

    def __init__(self, devices: list[str] | None) -> None:
        self.devices = devices
        self._lock = threading.Lock()
        self._initialised = False
        self._failure: str | None = None
        #: (device, counter) pairs this card or driver does not have
        self._absent: set[tuple[str, str]] = set()

    def check(self) -> list[Reading]:
        with self._lock:
            if self._failure is not None:
                raise GPUUnavailable(self._failure)
            if not self._initialised:
                try:
                    pynvml.nvmlInit()
                except (pynvml.NVMLError, *_MISSING) as e:
                    self._failure = f"NVML is not available ({_reason(e)}): no GPU health check"
                    raise GPUUnavailable(self._failure) from e
                self._initialised = True
            names = self.devices
            if names is None:
                try:
                    names = [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
                except pynvml.NVMLError as e:
                    raise GPUUnavailable(f"NVML cannot count the GPUs ({_reason(e)})") from e
            return [self._read(name) for name in names]

    def _read(self, name: str) -> Reading:
        uuid = name
        try:
            if name.isdigit():
                handle = self._call(pynvml.nvmlDeviceGetHandleByIndex, int(name))
                uuid = _text(self._call(pynvml.nvmlDeviceGetUUID, handle))
            else:
                handle = self._call(pynvml.nvmlDeviceGetHandleByUUID, name)
            # any call answers GPU_IS_LOST on a lost GPU, where finding the handle may not;
            # this one's other failures are the sampler's to tell
            self._counter(uuid, "memory", pynvml.nvmlDeviceGetMemoryInfo, handle)
            gpu = handle
            if uuid.startswith("MIG-"):
                gpu = self._call(pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle, handle)
            ecc = self._counter(
                uuid,
                "ecc",
                pynvml.nvmlDeviceGetTotalEccErrors,
                gpu,
                pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                pynvml.NVML_VOLATILE_ECC,
            )
            remap = self._counter(uuid, "remap", pynvml.nvmlDeviceGetRemappedRows, gpu)
        except _DeviceLost as e:
            return Reading(uuid, lost=str(e))
        except (pynvml.NVMLError, *_MISSING) as e:
            return Reading(uuid, error=_reason(e))
        return Reading(
            uuid,
            ecc_uncorrected=int(ecc) if ecc is not None else None,
            remap_failed=bool(remap[3]) if remap is not None else None,
        )

    @staticmethod
    def _call(read: Callable[..., Any], *args: Any) -> Any:
        try:
            return read(*args)
        except pynvml.NVMLError as e:
            if _lost(e):
                raise _DeviceLost(_reason(e)) from e
            raise

    def _counter(self, uuid: str, what: str, read: Callable[..., Any], *args: Any) -> Any:
        """A counter's value; None when this card or driver does not have it (then never
        asked again) or it failed this time for another reason than a lost GPU."""
        if (uuid, what) in self._absent:
            return None
        try:
            return self._call(read, *args)
        except _MISSING:
            self._absent.add((uuid, what))
        except pynvml.NVMLError as e:
            if getattr(e, "value", None) in _ABSENT_CODES:
                self._absent.add((uuid, what))
        return None

    def close(self) -> None:
        with self._lock:
            if self._initialised:
                self._initialised = False
                pynvml.nvmlShutdown()


class HealthMonitor:
    """Runs ``check`` (a HealthCheck) when asked, keeps what it found, and posts each new
    finding to the hub (``hub``; a HubError when the server runs outside a hub: findings
    are then only logged)."""

    def __init__(
        self,
        check: HealthCheck,
        hub: HubClient | HubError,
        *,
        log: logging.Logger,
        clock: Callable[[], datetime],
    ) -> None:
        self.check = check
        self.hub = hub
        self.log = log
        self.clock = clock
        self.state = HealthState()
        self.message: str | None = None
        self.unreported: list[Finding] = []
        self._failure: str | None = None  # the last failure to check or report, logged once
        self._report_task: asyncio.Task[None] | None = None

    async def run(self, executor: Executor) -> None:
        """One check (in ``executor``), then the hub is told what is new or still untold."""
        try:
            readings = await asyncio.get_running_loop().run_in_executor(executor, self.check.check)
        except GPUUnavailable as e:
            if self.message != str(e):
                self.log.info("gputap: %s", e)
            self.message = str(e)
        except Exception as e:
            # a broken check must not end sampling, nor fill the log: logged once
            message = f"checking the GPU's health failed ({type(e).__name__}: {e})"
            if self.message != message:
                self.log.exception("gputap: %s", message)
            self.message = message
        else:
            self.message = None
            for finding in self.state.update(readings, self.clock()):
                self.log.warning(
                    "gputap: GPU fault on %s: %s: %s", finding.device, finding.kind, finding.detail
                )
                self.unreported.append(finding)
        if self.unreported and (self._report_task is None or self._report_task.done()):
            # a slow hub must not hold up the next sample
            self._report_task = asyncio.create_task(self.report())

    async def report(self) -> None:
        """Post the untold findings, in order; stop at the first that gets no answer (the
        next check tries again). A refusal (4xx) is logged and not tried again."""
        if isinstance(self.hub, HubError):
            for finding in self.unreported:
                self.log.warning(
                    "gputap: GPU fault on %s not reported: %s", finding.device, self.hub.message
                )
            self.unreported.clear()
            return
        while self.unreported:
            finding = self.unreported[0]
            try:
                await self.hub.gpu_fault(finding.to_json())
            except HubError as e:
                if 400 <= e.status < 500 and e.status not in (408, 429):
                    self.log.warning(
                        "gputap %s: the hub refused the GPU fault report on %s (%s): %s",
                        self.hub.who,
                        finding.device,
                        finding.kind,
                        e.message,
                    )
                    self.unreported.pop(0)
                    continue
                failure = f"{e.status}: {e.message}"
                if failure != self._failure:
                    self.log.warning(
                        "gputap %s: GPU fault on %s not reported yet (%s); trying again",
                        self.hub.who,
                        finding.device,
                        failure,
                    )
                self._failure = failure
                return
            self._failure = None
            self.unreported.pop(0)
            self.log.info(
                "gputap %s: GPU fault on %s (%s) reported to the hub",
                self.hub.who,
                finding.device,
                finding.kind,
            )

    async def stop(self, executor: Executor) -> None:
        """Stop reporting and let go of NVML."""
        if self._report_task is not None and not self._report_task.done():
            self._report_task.cancel()
            try:
                await self._report_task
            except asyncio.CancelledError:
                pass
        await asyncio.get_running_loop().run_in_executor(executor, self.check.close)

    def to_json(self) -> dict[str, Any]:
        """The ``GET gputap/gpu-health`` answer."""
        at = self.state.checked_at
        return {
            "checked_at": at.isoformat() if at else None,
            "message": self.message,
            "devices": [self.state.device_view(r) for r in self.state.readings],
        }
