"""The hub's calls into NVML (pynvml), written for every driver a workstation may run.

Everything here blocks (NVML is a C library): callers run it in an executor. What real
drivers do that these functions absorb (tests/nvml/README.md has the fake that does the same):

- NVML missing, no kernel module, or a driver upgraded without a reboot: :class:`Unavailable`;
- drivers before R510 have no ``nvmlDeviceGetComputeRunningProcesses_v3``, on which pynvml's
  unversioned call raises ``NVMLLibraryMismatchError`` (not an ``NVMLError``): ``_v2`` then;
- names with or without the ``NVIDIA `` prefix, MIG UUIDs old (``MIG-GPU-…/gi/ci``) or new;
- any call for one device may fail (a GPU that fell off the bus, no permission): callers guard
  each device on its own with :data:`DEVICE_ERRORS`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import pynvml

#: what a call for one device may raise; the device is then left out, never the whole machine
DEVICE_ERRORS = (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError)

#: the events a GPU fault shows as (the NVIDIA device plugin watches the same two)
FAULT_EVENTS = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError

#: an event's instance ids when it is about the whole GPU, not one MIG device
NO_INSTANCE = 0xFFFFFFFF


class Unavailable(RuntimeError):
    """NVML cannot be used on this machine (library, driver); the message says why."""


@contextmanager
def session() -> Iterator[None]:
    """NVML initialised for the block (reference-counted by NVML itself)."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        raise Unavailable(f"NVML unavailable: {e}") from None
    try:
        yield
    finally:
        pynvml.nvmlShutdown()


def text(value: str | bytes) -> str:
    """NVML text: nvidia-ml-py answers str, older pynvml bytes."""
    return value.decode() if isinstance(value, bytes) else value


def compute_pids(handle: Any) -> list[int]:
    """Pids of the compute processes on a device, on drivers with or without the ``_v3``
    call."""
    try:
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses_v3(handle)
    except pynvml.NVMLError_FunctionNotFound:
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)
    return sorted(p.pid for p in processes)


def driver_version() -> str:
    """The driver's version, e.g. ``570.172.08``; ``unknown`` if NVML will not say."""
    try:
        return text(pynvml.nvmlSystemGetDriverVersion())
    except pynvml.NVMLError:
        return "unknown"


def mig_modes(handle: Any) -> tuple[bool, bool] | None:
    """(current, pending) MIG mode of a GPU, True for on; None when it cannot do MIG."""
    try:
        current, pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError_NotSupported:
        return None
    on = pynvml.NVML_DEVICE_MIG_ENABLE
    return current == on, pending == on


def mig_handles(handle: Any) -> Iterator[Any]:
    """Handles of the MIG devices of a GPU whose MIG mode is on, empty slots skipped."""
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            yield pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError_NotFound:
            continue


class MigInstance(NamedTuple):
    uuid: str
    gpu_instance: int
    compute_instance: int


def mig_instances(handle: Any) -> list[MigInstance]:
    """The MIG devices of a GPU whose MIG mode is on, with their GPU and compute instance ids
    (what an event names)."""
    return [
        MigInstance(
            text(pynvml.nvmlDeviceGetUUID(mig)),
            pynvml.nvmlDeviceGetGpuInstanceId(mig),
            pynvml.nvmlDeviceGetComputeInstanceId(mig),
        )
        for mig in mig_handles(handle)
    ]


def health_counters(handle: Any) -> tuple[int | None, bool | None, bool | None]:
    """(volatile uncorrected ECC errors, row remapping failed, a row remap pending) of a GPU;
    a part the card cannot report (no ECC, before Ampere) is None. Other errors, a lost GPU's
    above all, are raised."""
    try:
        ecc = pynvml.nvmlDeviceGetTotalEccErrors(
            handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
        )
    except pynvml.NVMLError_NotSupported:
        ecc = None
    try:
        _, _, pending, failed = pynvml.nvmlDeviceGetRemappedRows(handle)
    except pynvml.NVMLError_NotSupported:
        return ecc, None, None
    return ecc, bool(failed), bool(pending)


class Event(NamedTuple):
    """One event of :class:`EventWatch`: the GPU's UUID, the NVML event type, the event's
    data (the XID of an XID event), and the GPU and compute instance ids (:data:`NO_INSTANCE`
    when the whole GPU is meant)."""

    gpu: str
    event_type: int
    xid: int
    gpu_instance: int
    compute_instance: int


class EventWatch:
    """XID and double-bit ECC events of every GPU NVML lists, from one event set. Blocking:
    keep it on one thread of its own (:meth:`wait` blocks for its timeout).

    Holds an NVML session from creation to :meth:`close`. A GPU that cannot register (lost,
    events not supported) is left out and named in :attr:`skipped`; a card without ECC
    registers XID events only."""

    def __init__(self, exclude: set[str] | frozenset[str] = frozenset()):
        """``exclude``: GPUs (UUID or index) not watched."""
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise Unavailable(f"NVML unavailable: {e}") from None
        self._open = True
        self._set = None
        #: handle address -> GPU UUID
        self._uuids: dict[int, str] = {}
        #: GPU (UUID or index) -> why it is not watched
        self.skipped: dict[str, str] = {}
        try:
            self._set = pynvml.nvmlEventSetCreate()
            for index in range(pynvml.nvmlDeviceGetCount()):
                self._register(index, exclude)
        except BaseException:
            self.close()
            raise

    def _register(self, index: int, exclude: set[str] | frozenset[str]) -> None:
        where = str(index)
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            where = gpu = text(pynvml.nvmlDeviceGetUUID(handle))
            if {str(index), gpu} & exclude:
                return
            wanted = pynvml.nvmlDeviceGetSupportedEventTypes(handle) & FAULT_EVENTS
            if not wanted:
                self.skipped[gpu] = "no XID or ECC events"
                return
            pynvml.nvmlDeviceRegisterEvents(handle, wanted, self._set)
        except DEVICE_ERRORS as e:
            self.skipped[where] = str(e)
            return
        self._uuids[_address(handle)] = gpu

    @property
    def gpus(self) -> list[str]:
        """UUIDs of the GPUs watched."""
        return list(self._uuids.values())

    def wait(self, timeout_ms: int) -> Event | None:
        """The next event, or None when none came within ``timeout_ms``."""
        try:
            data = pynvml.nvmlEventSetWait_v2(self._set, timeout_ms)
        except pynvml.NVMLError_Timeout:
            return None
        gpu = self._uuids.get(_address(data.device))
        if gpu is None:  # a handle given out since (NVML may hand out new ones)
            gpu = text(pynvml.nvmlDeviceGetUUID(data.device))
        return Event(
            gpu, data.eventType, data.eventData, data.gpuInstanceId, data.computeInstanceId
        )

    def close(self) -> None:
        """Free the event set and end the session; safe to call twice."""
        if not self._open:
            return
        self._open = False
        try:
            if self._set is not None:
                pynvml.nvmlEventSetFree(self._set)
        finally:
            pynvml.nvmlShutdown()


def _address(handle: Any) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value or 0
