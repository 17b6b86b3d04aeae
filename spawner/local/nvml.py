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

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pynvml

#: what a call for one device may raise; the device is then left out, never the whole machine
DEVICE_ERRORS = (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError)


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
