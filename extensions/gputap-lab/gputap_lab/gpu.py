"""Reading this server's GPUs: the sample types and NvmlReader.

A reader is built with the devices the server was given (``CUDA_VISIBLE_DEVICES``: GPU or
MIG UUIDs) and answers :meth:`GPUReader.read` with one :class:`DeviceSample` per device, or
raises :class:`GPUUnavailable` when no numbers can be had. ``read`` blocks (NVML is a C
library): the sampler calls it in an executor, never on the event loop.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import pynvml


class GPUUnavailable(Exception):
    """No live numbers can be read (no NVML library, no driver, a device NVML does not know).

    The message says why, for the user; the panel shows it instead of numbers.
    """


@dataclass(frozen=True)
class DeviceSample:
    """One device at one moment; a value NVML could not give is None, and ``error`` says
    which and why.

    ``utilization_percent`` is the mean engine activity since the previous sample: a whole
    GPU's utilisation, or a MIG slice's own activity where the GPU counts it per instance
    (``activity_source`` "gpm", Hopper and later). Elsewhere a slice has none ("memory"):
    whether it works is then told by its processes and memory (see sampler.BusyRule).
    """

    uuid: str
    name: str | None
    kind: str  # "gpu" or "mig"
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    utilization_percent: int | None
    compute_processes: int | None
    activity_source: str | None = None  # "utilization", "gpm" or "memory"
    error: str | None = None
    # what the slice holds: (pid, used bytes) of each compute process, for BusyRule
    footprint: tuple[tuple[int, int], ...] | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        answer = asdict(self)
        del answer["footprint"]
        return answer


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


# Answers that are the device's steady state, not a failure: the handle stays good.
_STEADY = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION)
# A symbol this driver lacks: pynvml raises the first for versioned calls, the second for
# unversioned ones that map to a versioned symbol (nvmlDeviceGetComputeRunningProcesses → _v3).
_MISSING = (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLLibraryMismatchError)


def _reason(error: Exception) -> str:
    return str(error) or type(error).__name__


def _code(error: Exception) -> int | None:
    return getattr(error, "value", None)


def _sample_value(value_type: int, value: Any) -> float:
    attribute = {
        pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
    }.get(value_type, "uiVal")
    return float(getattr(value, attribute))


class _Calls:
    """The NVML calls of one device's sample: a failed one leaves its value None and says
    why; one that is not the device's steady answer makes the handle be asked again."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.stale = False

    def get(self, what: str, read: Callable[..., Any], *args: Any) -> Any:
        try:
            return read(*args)
        except pynvml.NVMLError as e:
            self.failed(what, e)
            return None

    def failed(self, what: str, error: pynvml.NVMLError) -> None:
        if _code(error) not in _STEADY:
            self.stale = True
        if _code(error) != pynvml.NVML_ERROR_NOT_SUPPORTED:
            self.errors.append(f"{what}: {_reason(error)}")


@dataclass
class _Device:
    """What the reader keeps of one device between reads. The handle (and the MIG parent's)
    is dropped after an error other than a steady one and asked for again, by UUID, on the
    next read: NVML's handles are invalid after a reset or a MIG reconfiguration."""

    asked: str  # as CUDA_VISIBLE_DEVICES gives it: a UUID or an index
    uuid: str
    kind: str
    handle: Any = None
    name: str | None = None
    parent: Any = None  # a MIG slice's GPU, for GPM
    gpu_instance: int | None = None
    samples: bool = True  # whether nvmlDeviceGetSamples answers for it
    last_seen_us: int = 0  # the newest utilisation sample taken
    gpm: list[Any] | None = None  # [previous, current] GPM samples of a slice
    gpm_ready: bool = False  # previous holds a sample

    def drop_handle(self) -> None:
        self.handle = self.parent = self.gpu_instance = None
        self.gpm_ready = False


class NvmlReader:
    """Reads devices through NVML (``pynvml`` of nvidia-ml-py).

    NVML is initialised on the first :meth:`read`, i.e. in the sampler's executor thread,
    never at import: importing the extension on a machine without a driver costs nothing.
    If initialising fails (no library, no driver, version mismatch), every read raises
    :class:`GPUUnavailable` with the reason; it is not retried, since a driver does not
    appear in a running server. Everything after that is per device and per value: a device
    or a call that fails leaves that value unknown (``error`` says why), the other devices
    are still read, and the device's handle is asked for again on the next read.
    """

    def __init__(self, devices: list[str] | None) -> None:
        self.devices = devices
        self._lock = threading.Lock()
        self._initialised = False
        self._failure: str | None = None
        self._known: dict[str, _Device] = {}
        # the process-list call this driver has (_v3, else _v2), None when it has neither
        self._processes: Callable[[Any], list[Any]] | None = (
            pynvml.nvmlDeviceGetComputeRunningProcesses_v3
        )
        self._gpm = True  # whether this driver has GPM at all

    def read(self) -> list[DeviceSample]:
        with self._lock:
            if self._failure is not None:
                raise GPUUnavailable(self._failure)
            if not self._initialised:
                try:
                    pynvml.nvmlInit()
                except (pynvml.NVMLError, *_MISSING) as e:
                    self._failure = f"NVML is not available ({_reason(e)}): no live GPU numbers"
                    raise GPUUnavailable(self._failure) from e
                self._initialised = True
            devices, failures = self._wanted()
            if failures and len(failures) == max(1, len(devices)):
                # nothing to show; asked again next time (a reset GPU comes back)
                raise GPUUnavailable(
                    f"NVML does not find this server's GPU {self.devices or 'any GPU'} "
                    f"({failures[0]}): no live GPU numbers"
                )
            return [self._sample(device) for device in devices]

    def _wanted(self) -> tuple[list[_Device], list[str]]:
        """The devices to read, with handles where NVML gives them; and why it gave none."""
        names = self.devices
        if names is None:
            try:
                names = [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
            except pynvml.NVMLError as e:
                return [], [_reason(e)]
        failures = []
        devices = []
        for name in names:
            device = self._known.get(name)
            if device is None:
                kind = "mig" if name.startswith("MIG-") else "gpu"
                device = self._known[name] = _Device(asked=name, uuid=name, kind=kind)
            if device.handle is None:
                try:
                    self._open(device)
                except (pynvml.NVMLError, *_MISSING) as e:
                    device.drop_handle()
                    failures.append(_reason(e))
            devices.append(device)
        return devices, failures

    def _open(self, device: _Device) -> None:
        if device.asked.isdigit():
            device.handle = pynvml.nvmlDeviceGetHandleByIndex(int(device.asked))
            device.uuid = _text(pynvml.nvmlDeviceGetUUID(device.handle))
            device.kind = "mig" if device.uuid.startswith("MIG-") else "gpu"
        else:
            device.handle = pynvml.nvmlDeviceGetHandleByUUID(device.asked)
        device.name = _text(pynvml.nvmlDeviceGetName(device.handle))
        if device.kind == "mig" and self._gpm:
            self._open_gpm(device)

    def _open_gpm(self, device: _Device) -> None:
        """Find the slice's GPU and GPU instance, and whether that GPU counts activity per
        instance (GPM: Hopper and later); without, the slice has no utilisation."""
        try:
            parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(device.handle)
            gpu_instance = pynvml.nvmlDeviceGetGpuInstanceId(device.handle)
            supported = pynvml.nvmlGpmQueryDeviceSupport(parent).isSupportedDevice
            if supported and device.gpm is None:
                device.gpm = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
        except _MISSING:
            self._gpm = False
            return
        except pynvml.NVMLError:
            # no per-instance activity this time: the slice is judged by processes and
            # memory, and GPM is tried again when the handle is next opened
            return
        if supported:
            device.parent, device.gpu_instance = parent, gpu_instance

    def _sample(self, device: _Device) -> DeviceSample:
        if device.handle is None:
            return DeviceSample(
                uuid=device.uuid,
                name=device.name,
                kind=device.kind,
                memory_used_bytes=None,
                memory_total_bytes=None,
                utilization_percent=None,
                compute_processes=None,
                error="not found by NVML",
            )
        calls = _Calls()
        memory = calls.get("memory", pynvml.nvmlDeviceGetMemoryInfo, device.handle)
        listed = self._process_list(device, calls)
        utilization = None
        if device.kind == "gpu":
            utilization = calls.get("utilisation", self._utilization, device)
        elif device.parent is not None:
            utilization = calls.get("activity", self._gpm_activity, device)
        if calls.stale:
            device.drop_handle()
        if utilization is None:
            source = "memory"
        else:
            source = "utilization" if device.kind == "gpu" else "gpm"
        return DeviceSample(
            uuid=device.uuid,
            name=device.name,
            kind=device.kind,
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            utilization_percent=round(utilization) if utilization is not None else None,
            compute_processes=len(listed) if listed is not None else None,
            activity_source=source,
            error="; ".join(calls.errors) or None,
            footprint=tuple(sorted((int(p.pid), int(p.usedGpuMemory or 0)) for p in listed))
            if listed is not None
            else None,
        )

    def _process_list(self, device: _Device, calls: _Calls) -> list[Any] | None:
        """The compute processes, through the newest call the driver has; None when it has
        none or answers none (a user's server on MIG gets NO_PERMISSION: not an error)."""
        while self._processes is not None:
            read = self._processes
            try:
                return read(device.handle)
            except _MISSING:
                older = pynvml.nvmlDeviceGetComputeRunningProcesses_v2
                self._processes = older if read is not older else None
            except pynvml.NVMLError as e:
                if _code(e) != pynvml.NVML_ERROR_NO_PERMISSION:
                    calls.failed("processes", e)
                return None
        return None

    def _utilization(self, device: _Device) -> float | None:
        """The mean utilisation since the last read: NVML's samples (one each 1/6 s on
        most GPUs) newer than the last one seen, else its latest instantaneous figure."""
        if device.samples:
            try:
                value_type, samples = pynvml.nvmlDeviceGetSamples(
                    device.handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, device.last_seen_us
                )
            except _MISSING:
                device.samples = False
            except pynvml.NVMLError as e:
                if _code(e) == pynvml.NVML_ERROR_NOT_SUPPORTED:
                    device.samples = False
                elif _code(e) != pynvml.NVML_ERROR_NOT_FOUND:  # NOT_FOUND: none newer
                    raise
            else:
                newer = [s for s in samples if s.timeStamp > device.last_seen_us]
                if newer:
                    device.last_seen_us = max(s.timeStamp for s in newer)
                    values = [_sample_value(value_type, s.sampleValue) for s in newer]
                    return sum(values) / len(values)
        return float(pynvml.nvmlDeviceGetUtilizationRates(device.handle).gpu)

    def _gpm_activity(self, device: _Device) -> float | None:
        """The slice's own engine activity between this read and the last, from the GPU's
        per-instance counters; None on the first read (GPM needs two samples)."""
        assert device.gpm is not None
        previous, current = device.gpm
        pynvml.nvmlGpmMigSampleGet(device.parent, device.gpu_instance, current)
        ready, device.gpm_ready = device.gpm_ready, True
        device.gpm = [current, previous]
        if not ready:
            return None
        request = pynvml.c_nvmlGpmMetricsGet_t()
        request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = 2
        request.sample1, request.sample2 = previous, current
        request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
        request.metrics[1].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
        pynvml.nvmlGpmMetricsGet(request)
        for metric in request.metrics[:2]:
            if metric.nvmlReturn == pynvml.NVML_SUCCESS:
                return min(100.0, max(0.0, float(metric.value)))
        raise pynvml.NVMLError(request.metrics[0].nvmlReturn)

    def close(self) -> None:
        with self._lock:
            for device in self._known.values():
                for sample in device.gpm or []:
                    try:
                        pynvml.nvmlGpmSampleFree(sample)
                    except pynvml.NVMLError:
                        pass
                device.gpm = None
            self._known.clear()
            if self._initialised:
                self._initialised = False
                pynvml.nvmlShutdown()
