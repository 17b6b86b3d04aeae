"""Watch one machine's GPUs for faults and report each finding once (issue 18).

:class:`LocalHealthWatcher` reads NVML (or, on a machine without GPUs, the simulated inventory
file) and hands each :class:`~spawner.core.health.Fault` to ``report`` on the event loop; what
is done about it (the book, isolation, recovery) is the fault desk's (spawner/lifecycle/faults.py).

With NVML (docs/design-gpu-faults.md):

- XID and double-bit ECC events, waited for on a thread of their own (a 1 s wait must never
  hold a slot of the loop's default executor), a daemon: a hub whose loop ends without
  stopping the watcher (SIGTERM) still exits. An XID event naming a GPU and compute instance
  is about that MIG device, as the NVIDIA device plugin matches them; otherwise about the
  whole GPU. Application XIDs (the user's program failed) and ``ignore_xids`` are logged only.
- Every ``poll_seconds``, in the default executor: the volatile uncorrected ECC count rising
  above the first reading, row remapping failed, a GPU lost (``NVML_ERROR_GPU_IS_LOST``). A
  row remap pending is no fault: the GPU needs a reset, so it is handed to ``drain`` once.

A fault about a whole GPU names every device it takes out of the pool: the GPU itself when
MIG is off, else its MIG devices.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import yaml

from gputap_common import clock

from ..core.catalog import Catalog
from ..core.health import Fault, is_critical_xid, xid_detail
from . import nvml
from .inventory import SimulatedGpu, file_gpus

log = logging.getLogger(__name__)

#: how long one event wait blocks; also how long :meth:`LocalHealthWatcher.stop` may wait
EVENT_WAIT_MS = 1000

LOST = "GPU is lost: NVML cannot reach it"
REMAP_FAILED = "row remapping failed"
REMAP_PENDING = "row remap pending: needs a GPU reset"
DOUBLE_BIT = "double-bit ECC error"
FILE_FAULTS = "{xid: N[, mig_slot: K]}, {ecc: N}, {remap_failed: true} or {lost: true}"


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def ecc_detail(count: int, first: int) -> str:
    """What an admin reads for a volatile uncorrected ECC count that rose."""
    errors = f"{count} uncorrected ECC error{'' if count == 1 else 's'}"
    return f"{errors} ({first} when the watch began)" if first else errors


@dataclass
class WatchedGpu:
    """What the watcher knows of one GPU from its last reading."""

    uuid: str
    mig: bool = False
    instances: list[nvml.MigInstance] = field(default_factory=list)


def whole_gpu(gpu: WatchedGpu, exclude: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The devices a fault of the whole GPU takes out: itself when MIG is off, else its MIG
    devices not kept out of gputap."""
    if gpu.mig and gpu.instances:
        return tuple(m.uuid for m in gpu.instances if m.uuid not in exclude)
    return (gpu.uuid,)


def event_devices(
    gpu: WatchedGpu, gpu_instance: int, compute_instance: int, exclude: frozenset[str] = frozenset()
) -> tuple[str, ...]:
    """The devices an XID event is about: the MIG device with those instance ids, or the
    whole GPU when the event names no instance (or one the watcher does not know: it cannot
    tell which, so none of the GPU's is trusted)."""
    if nvml.NO_INSTANCE not in (gpu_instance, compute_instance):
        named = [
            m.uuid
            for m in gpu.instances
            if (m.gpu_instance, m.compute_instance) == (gpu_instance, compute_instance)
        ]
        if named:
            return tuple(u for u in named if u not in exclude)
    return whole_gpu(gpu, exclude)


class LocalHealthWatcher:
    """Finds GPU faults on this machine and reports each once (see the module's doc).

    ``report(fault)`` and ``drain(gpu_uuid, note)`` are called on the event loop.
    ``mode``, ``inventory_file``, ``catalog`` and ``exclude`` are the inventory's
    (:func:`spawner.local.inventory.load_local_devices`): ``auto`` watches NVML when it can
    be used and counts a GPU, else the simulated file."""

    def __init__(
        self,
        *,
        report: Callable[[Fault], Any],
        mode: str,
        inventory_file: str | Path,
        catalog: Catalog,
        exclude: Iterable[str] = (),
        node: str = "localhost",
        poll_seconds: float = 2.0,
        ignore_xids: Iterable[int] = (),
        drain: Callable[[str, str], Any] | None = None,
    ):
        if mode not in ("auto", "nvml", "file"):
            raise ValueError(f"spawner.inventory must be auto, nvml or file, not {mode!r}")
        if poll_seconds <= 0:
            raise ValueError(f"faults.poll_seconds must be above 0, not {poll_seconds}")
        self.report = report
        self.drain = drain
        self.mode = mode
        self.inventory_file = Path(inventory_file)
        self.catalog = catalog
        self.exclude = frozenset(str(e) for e in exclude)
        self.node = node
        self.poll_seconds = poll_seconds
        self.ignore_xids = frozenset(ignore_xids)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = threading.Event()
        #: resolved once the event thread has closed its NVML event set
        self._events_done: asyncio.Future[None] | None = None
        # shared by the event thread and the poll's executor thread
        self._lock = threading.Lock()
        self._gpus: dict[str, WatchedGpu] = {}
        self._seen: set[tuple[Any, ...]] = set()
        self._ecc_first: dict[str, int] = {}
        self._ecc_high: dict[str, int] = {}
        self._errors: dict[str, str] = {}
        self._file_seen: tuple[int, int, int] | None = None

    # -- running ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start watching; call from a coroutine on the loop that ``report`` wants."""
        if self._task is not None:
            raise RuntimeError("the GPU health watcher is already started")
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._run(), name="gpu-health")

    async def stop(self) -> None:
        """Stop watching; returns once the event wait in progress has ended (≤ 1 s)."""
        self._stopping.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._events_done is not None:
            await asyncio.gather(self._events_done, return_exceptions=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        source = await loop.run_in_executor(None, self._source)
        if source is None:
            return
        check = self._check_gpus if source == "nvml" else self._check_file
        await loop.run_in_executor(None, self._guarded, check)
        if source == "nvml":
            with self._lock:
                gpus = list(self._gpus)
            self._events_done = loop.create_future()
            threading.Thread(
                target=self._watch_events_then,
                args=(loop, self._events_done),
                name="gputap-gpu-events",
                daemon=True,
            ).start()
            log.info(
                "GPU health: watching %d GPU(s) through NVML (%s), counters every %gs",
                len(gpus),
                ", ".join(gpus) or "none",
                self.poll_seconds,
            )
        else:
            log.info(
                "GPU health: watching the faults in %s every %gs",
                self.inventory_file,
                self.poll_seconds,
            )
        while not self._stopping.is_set():
            await asyncio.sleep(self.poll_seconds)
            await loop.run_in_executor(None, self._guarded, check)

    def _guarded(self, check: Callable[[], None]) -> None:
        try:
            check()
        except Exception:
            log.exception("GPU health check failed; trying again in %gs", self.poll_seconds)

    def _source(self) -> str | None:
        """``nvml`` or ``file``, as the inventory chose; None when nothing can be watched."""
        if self.mode == "file":
            return "file"
        try:
            with nvml.session():
                count = pynvml.nvmlDeviceGetCount()
        except nvml.Unavailable as e:
            if self.mode == "nvml":
                log.error("GPU health not watched: %s", e)
                return None
            return "file"
        if count:
            return "nvml"
        if self.mode == "nvml":
            log.error("GPU health not watched: NVML found no GPU")
            return None
        return "file"

    # -- an admin's return ----------------------------------------------------------------------

    async def still_broken(self, device: str) -> str | None:
        """Why ``device`` (a GPU's or MIG device's UUID) may not be returned yet: its GPU is
        still lost or its row remapping still failed (NVML), or the simulated inventory still
        declares its fault; None otherwise."""
        loop = asyncio.get_running_loop()
        if self.mode == "file" or not self._gpus:
            return await loop.run_in_executor(None, self._declared, device)
        return await loop.run_in_executor(None, self._still_failing, device)

    def _gpu_of(self, device: str) -> WatchedGpu | None:
        with self._lock:
            gpus = list(self._gpus.values())
        return next((g for g in gpus if device == g.uuid or device in whole_gpu(g)), None)

    def _still_failing(self, device: str) -> str | None:
        gpu = self._gpu_of(device)
        if gpu is None:
            return None
        try:
            with nvml.session():
                counters = nvml.health_counters(pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid))
        except pynvml.NVMLError_GpuIsLost:
            return f"{gpu.uuid} is still lost: NVML cannot reach it; reset or reseat it first"
        except (nvml.Unavailable, *nvml.DEVICE_ERRORS) as e:
            return f"{gpu.uuid} cannot be checked ({e}); try again once NVML answers"
        if counters[1]:
            return f"{gpu.uuid}: row remapping still shows failed; reset the GPU first"
        return None

    def _declared(self, device: str) -> str | None:
        try:
            gpus = file_gpus(self.inventory_file, self.catalog)
        except (OSError, ValueError, yaml.YAMLError):
            return None
        for gpu in gpus:
            if gpu.fault is not None and device in {gpu.uuid, *(d.uuid for d in gpu.devices)}:
                return (
                    f"{self.inventory_file} still declares a fault on GPU {gpu.index}; remove "
                    "it there first"
                )
        return None

    def forget(self, device: str) -> None:
        """``device`` was returned to service: its GPU's findings may be reported again."""
        gpu = self._gpu_of(device)
        uuids = {device, *((gpu.uuid, *whole_gpu(gpu)) if gpu else ())}
        with self._lock:
            self._seen = {
                key for key in self._seen
                if not (set(map(str, key)) & uuids) and key[0] != "file"
            }  # fmt: skip
            for uuid in uuids:
                self._ecc_first.pop(uuid, None)
                self._ecc_high.pop(uuid, None)
            self._file_seen = None  # read the file again: its entries count as new

    # -- what is found goes to the loop ---------------------------------------------------------

    def _post(self, call: Callable[..., Any], *args: Any) -> None:
        def deliver() -> None:
            try:
                call(*args)
            except Exception:
                log.exception("GPU health: %s failed", getattr(call, "__name__", call))

        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(deliver)
        except RuntimeError:  # the loop is closed: the hub is going down
            pass

    def _finding(
        self,
        key: tuple[Any, ...] | None,
        kind: str,
        detail: str,
        gpu: str,
        devices: tuple[str, ...],
        source: str = "nvml",
    ) -> None:
        """Report a fault, once per ``key`` (None: the caller has decided it is new)."""
        with self._lock:
            if key in self._seen:
                return
            if key is not None:
                self._seen.add(key)
        if not devices:
            log.info("GPU %s: %s, on devices kept out of gputap: not reported", gpu, detail)
            return
        fault = Fault(
            kind=kind,
            detail=detail,
            source=source,
            node=self.node,
            devices=devices,
            detected_at=clock.utcnow(),
            gpu=gpu,
        )
        log.warning("GPU fault on %s (%s): %s", gpu, ", ".join(devices), detail)
        self._post(self.report, fault)

    def _warn_once(self, where: str, message: str) -> None:
        with self._lock:
            if self._errors.get(where) == message:
                return
            self._errors[where] = message
        log.warning("GPU health: %s: %s", where, message)

    # -- NVML ---------------------------------------------------------------------------------

    def _watch_events_then(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future) -> None:
        """The event thread: watch, then resolve ``done`` on the loop (if it still runs)."""
        try:
            self._watch_events()
        finally:
            try:
                loop.call_soon_threadsafe(_resolve, done)
            except RuntimeError:  # the loop is closed: nobody waits for it
                pass

    def _watch_events(self) -> None:
        """On the event thread until :meth:`stop`: wait for events, 1 s at a time."""
        try:
            watch = nvml.EventWatch(self.exclude)
        except (nvml.Unavailable, *nvml.DEVICE_ERRORS) as e:
            log.warning("GPU health: no XID or ECC events (%s); counters are still read", e)
            return
        for gpu, why in watch.skipped.items():
            log.warning("GPU %s: no XID or ECC events (%s); its counters are still read", gpu, why)
        try:
            while not self._stopping.is_set():
                try:
                    event = watch.wait(EVENT_WAIT_MS)
                except nvml.DEVICE_ERRORS as e:
                    self._warn_once("event wait", str(e))
                    self._stopping.wait(EVENT_WAIT_MS / 1000)
                    continue
                if event is not None:
                    self._on_event(event)
        finally:
            watch.close()

    def _on_event(self, event: nvml.Event) -> None:
        with self._lock:
            gpu = self._gpus.get(event.gpu) or WatchedGpu(event.gpu)
        if event.event_type & pynvml.nvmlEventTypeDoubleBitEccError:
            devices = whole_gpu(gpu, self.exclude)
            self._finding(("dbe", gpu.uuid), "ecc", DOUBLE_BIT, gpu.uuid, devices)
            return
        if not event.event_type & pynvml.nvmlEventTypeXidCriticalError:
            return
        if not is_critical_xid(event.xid, self.ignore_xids):
            log.info("GPU %s: %s, not a GPU fault: ignored", gpu.uuid, xid_detail(event.xid))
            return
        devices = event_devices(gpu, event.gpu_instance, event.compute_instance, self.exclude)
        key = ("xid", gpu.uuid, event.xid, devices)
        self._finding(key, "xid", xid_detail(event.xid), gpu.uuid, devices)

    def _check_gpus(self) -> None:
        """In the default executor: the GPUs' layout, then each one's counters."""
        try:
            with nvml.session():
                for index in range(pynvml.nvmlDeviceGetCount()):
                    self._read_layout(index)
                with self._lock:
                    gpus = list(self._gpus.values())
                for gpu in gpus:
                    self._read_counters(gpu)
        except nvml.Unavailable as e:
            self._warn_once("NVML", str(e))

    def _read_layout(self, index: int) -> None:
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpu_uuid = nvml.text(pynvml.nvmlDeviceGetUUID(handle))
            if {str(index), gpu_uuid} & self.exclude:
                return
            modes = nvml.mig_modes(handle)
            mig = bool(modes and modes[0])
            instances = nvml.mig_instances(handle) if mig else []
        except nvml.DEVICE_ERRORS:
            return  # a lost GPU is known by UUID from before; its counters say it is lost
        with self._lock:
            self._gpus[gpu_uuid] = WatchedGpu(gpu_uuid, mig, instances)

    def _read_counters(self, gpu: WatchedGpu) -> None:
        lost_key = ("lost", gpu.uuid)
        with self._lock:
            if lost_key in self._seen:
                return
        try:
            counters = nvml.health_counters(pynvml.nvmlDeviceGetHandleByUUID(gpu.uuid))
        except pynvml.NVMLError_GpuIsLost:
            self._finding(lost_key, "lost", LOST, gpu.uuid, whole_gpu(gpu, self.exclude))
            return
        except pynvml.NVMLError_NotFound:
            return  # gone from the machine: the inventory's refresh handles that
        except nvml.DEVICE_ERRORS as e:
            self._warn_once(gpu.uuid, f"counters not read: {e}")
            return
        ecc, remap_failed, remap_pending = counters
        devices = whole_gpu(gpu, self.exclude)
        if ecc is not None:
            with self._lock:
                first = self._ecc_first.setdefault(gpu.uuid, ecc)
                high = self._ecc_high.get(gpu.uuid, first)
                # a volatile count starts again at a driver reload: rises count from there
                self._ecc_high[gpu.uuid] = ecc
            if ecc > high:
                detail = ecc_detail(ecc, first)
                self._finding(None, "ecc", detail, gpu.uuid, devices)
        if remap_failed:
            self._finding(("remap", gpu.uuid), "remap", REMAP_FAILED, gpu.uuid, devices)
        elif remap_pending and self.drain is not None:
            with self._lock:
                if ("pending", gpu.uuid) in self._seen:
                    return
                self._seen.add(("pending", gpu.uuid))
            log.warning("GPU %s: %s; drained", gpu.uuid, REMAP_PENDING)
            self._post(self.drain, gpu.uuid, REMAP_PENDING)

    # -- the simulated inventory ----------------------------------------------------------------

    def _check_file(self) -> None:
        """In the default executor: the file's new ``fault`` entries, when it changed."""
        try:
            stat = os.stat(self.inventory_file)
        except OSError as e:
            self._warn_once(str(self.inventory_file), f"not read: {e}")
            return
        seen = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        if seen == self._file_seen:
            return
        self._file_seen = seen
        try:
            gpus = file_gpus(self.inventory_file, self.catalog)
        except (OSError, ValueError, yaml.YAMLError) as e:
            self._warn_once(str(self.inventory_file), f"not read: {e}")
            return
        for gpu in gpus:
            if gpu.fault is not None:
                self._file_fault(gpu)

    def _file_fault(self, gpu: SimulatedGpu) -> None:
        fault = gpu.fault
        where = f"{self.inventory_file}: GPU {gpu.index}"
        try:
            key = ("file", gpu.index, json.dumps(fault, sort_keys=True))
        except (TypeError, ValueError):
            key = ("file", gpu.index, repr(fault))
        with self._lock:
            if key in self._seen:
                return
        finding = self._file_finding(gpu, fault, where)
        if finding is None:
            with self._lock:
                self._seen.add(key)  # said once; a changed entry is read again
            return
        kind, detail, devices = finding
        self._finding(key, kind, detail, gpu.uuid, devices, source="simulated")

    def _file_finding(
        self, gpu: SimulatedGpu, fault: Any, where: str
    ) -> tuple[str, str, tuple[str, ...]] | None:
        """(kind, detail, devices) of a ``fault`` entry; None, said in the log, when it is
        malformed or an XID that is no GPU fault."""
        kinds = {"xid", "ecc", "remap_failed", "lost"}
        whole = tuple(d.uuid for d in gpu.devices)
        if (
            not isinstance(fault, dict)
            or len(kinds & fault.keys()) != 1
            or fault.keys() - kinds - {"mig_slot"}
            or ("mig_slot" in fault and "xid" not in fault)
        ):
            log.warning("%s: fault must be %s, not %r; ignored", where, FILE_FAULTS, fault)
            return None
        if "xid" in fault:
            xid, slot = fault["xid"], fault.get("mig_slot")
            if not isinstance(xid, int) or isinstance(xid, bool) or xid < 0:
                log.warning("%s: fault xid must be a number, not %r; ignored", where, xid)
                return None
            if not is_critical_xid(xid, self.ignore_xids):
                log.info("%s: %s, not a GPU fault: ignored", where, xid_detail(xid))
                return None
            if slot is None:
                return "xid", xid_detail(xid), whole
            mig = [d for d in gpu.devices if d.profile is not None]
            if not mig:
                log.warning("%s: mig_slot %r, but the card has no mig list; ignored", where, slot)
                return None
            if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < len(mig):
                log.warning(
                    "%s: mig_slot must be 0 to %d (its place in the card's mig list), not %r; "
                    "ignored",
                    where,
                    len(mig) - 1,
                    slot,
                )
                return None
            return "xid", xid_detail(xid), (mig[slot].uuid,)
        if "ecc" in fault:
            count = fault["ecc"]
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                log.warning("%s: fault ecc must be a count of 1 or more, not %r", where, count)
                return None
            return "ecc", ecc_detail(count, 0), whole
        if fault.get("remap_failed") is True:
            return "remap", REMAP_FAILED, whole
        if fault.get("lost") is True:
            return "lost", LOST, whole
        log.warning("%s: fault %r declares nothing; ignored", where, fault)
        return None
