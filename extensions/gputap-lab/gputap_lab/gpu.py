"""Reading this server's GPUs: the sample types and NvmlReader.

A reader is built with the devices the server was given (``CUDA_VISIBLE_DEVICES``: GPU or
MIG UUIDs) and answers :meth:`GPUReader.read` with one :class:`DeviceSample` per device, or
raises :class:`GPUUnavailable` when no numbers can be had. ``read`` blocks (NVML is a C
library): the sampler calls it in an executor, never on the event loop.
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import pynvml


class GPUUnavailable(Exception):
    """No live numbers can be read (no NVML library, no driver, a device NVML does not know).

    The message says why, for the user; the panel shows it instead of numbers.
    """


@dataclass(frozen=True)
class DeviceSample:
    """One device at one moment. MIG slices have no utilisation (NVML gives none for them):
    their ``utilization_percent`` is None and their compute processes tell whether they work."""

    uuid: str
    name: str
    kind: str  # "gpu" or "mig"
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_percent: int | None
    compute_processes: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class GPUReader(Protocol):
    """What the sampler needs of a reader (``GPUTapLab.gpu_reader_class``)."""

    def __init__(self, devices: list[str]) -> None: ...

    def read(self) -> list[DeviceSample]:
        """One sample per device; blocks; raises GPUUnavailable when numbers cannot be had."""
        ...

    def close(self) -> None:
        """Let go of the library; called once when the server stops."""
        ...


def visible_devices(env: dict[str, str] | os._Environ[str] = os.environ) -> list[str] | None:
    """The devices this server may use, from ``CUDA_VISIBLE_DEVICES``.

    An empty value is a CPU-only server (``[]``). Unset, the NVIDIA device plugin's
    ``NVIDIA_VISIBLE_DEVICES`` is used when it lists UUIDs (a Kubernetes pod), and otherwise
    ``None``: whatever NVML shows, as in a container that sees only its own GPUs.
    """
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        return [part.strip() for part in value.split(",") if part.strip()]
    plugin = [part.strip() for part in env.get("NVIDIA_VISIBLE_DEVICES", "").split(",")]
    if plugin and all(part.startswith(("GPU-", "MIG-")) for part in plugin):
        return plugin
    if plugin in (["void"], ["none"]):
        return []
    return None


def _text(value: str | bytes) -> str:
    # nvidia-ml-py answers str; older pynvml answered bytes
    return value.decode() if isinstance(value, bytes) else value


class NvmlReader:
    """Reads devices through NVML (``pynvml`` of nvidia-ml-py).

    NVML is initialised on the first :meth:`read`, i.e. in the sampler's executor thread,
    never at import: importing the extension on a machine without a driver costs nothing.
    If initialising fails (no library, no driver, version mismatch), every read raises
    :class:`GPUUnavailable` with the reason; it is not retried, since a driver does not
    appear in a running server.
    """

    def __init__(self, devices: list[str] | None) -> None:
        self.devices = devices
        self._lock = threading.Lock()
        self._handles: list[tuple[str, Any, bool]] | None = None
        self._failure: str | None = None

    def _open(self) -> list[tuple[str, Any, bool]]:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            self._failure = f"NVML is not available ({e}): no live GPU numbers"
            raise GPUUnavailable(self._failure) from e
        try:
            return self._find_handles()
        except pynvml.NVMLError as e:
            pynvml.nvmlShutdown()
            self._failure = (
                f"NVML does not find this server's GPU {self.devices} ({e}): no live GPU numbers"
            )
            raise GPUUnavailable(self._failure) from e

    def _find_handles(self) -> list[tuple[str, Any, bool]]:
        handles = []
        if self.devices is None:
            names = [
                _text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
                for i in range(pynvml.nvmlDeviceGetCount())
            ]
        else:
            names = self.devices
        for name in names:
            if name.isdigit():
                handle = pynvml.nvmlDeviceGetHandleByIndex(int(name))
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
            else:
                handle = pynvml.nvmlDeviceGetHandleByUUID(name)
                uuid = name
            handles.append((uuid, handle, uuid.startswith("MIG-")))
        return handles

    def read(self) -> list[DeviceSample]:
        with self._lock:
            if self._failure is not None:
                raise GPUUnavailable(self._failure)
            if self._handles is None:
                self._handles = self._open()
            try:
                return [self._sample(*entry) for entry in self._handles]
            except pynvml.NVMLError as e:
                # a lost GPU or a reset: say so this time, try again next time
                raise GPUUnavailable(f"NVML could not read the GPU ({e})") from e

    def _sample(self, uuid: str, handle: Any, mig: bool) -> DeviceSample:
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        try:
            processes: int | None = len(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
        except pynvml.NVMLError:
            processes = None
        utilization = None if mig else self._utilization(handle)
        return DeviceSample(
            uuid=uuid,
            name=_text(pynvml.nvmlDeviceGetName(handle)),
            kind="mig" if mig else "gpu",
            memory_used_bytes=int(memory.used),
            memory_total_bytes=int(memory.total),
            utilization_percent=utilization,
            compute_processes=processes,
        )

    @staticmethod
    def _utilization(handle: Any) -> int | None:
        try:
            return int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except pynvml.NVMLError_NotSupported:
            # a whole GPU in MIG mode has no utilisation either
            return None

    def close(self) -> None:
        with self._lock:
            if self._handles is not None:
                self._handles = None
                pynvml.nvmlShutdown()
