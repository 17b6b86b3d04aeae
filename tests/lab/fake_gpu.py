"""GPU readers for the tests, standing in for NvmlReader (``GPUTapLab.gpu_reader_class``).

Each is built, as NvmlReader is, with the server's visible devices and answers ``read()``
with one sample per device; the server extension cannot tell them from the real one.
"""

from __future__ import annotations

import os
from pathlib import Path

from gputap_lab.gpu import DeviceSample, GPUUnavailable

GIB = 1024**3


class FakeReader:
    """Samples every visible device the same way; subclasses say how busy."""

    utilization_percent: int | None = 0
    compute_processes: int | None = 0
    memory_used_bytes = 2 * GIB

    def __init__(self, devices: list[str] | None) -> None:
        self.devices = devices or ["GPU-fake-0"]
        self.reads = 0

    def sample(self, uuid: str) -> DeviceSample:
        return DeviceSample(
            uuid=uuid,
            name="NVIDIA A100-SXM4-80GB",
            kind="gpu",
            memory_used_bytes=self.memory_used_bytes,
            memory_total_bytes=80 * GIB,
            utilization_percent=self.utilization_percent,
            compute_processes=self.compute_processes,
            activity_source="utilization",
        )

    def read(self) -> list[DeviceSample]:
        self.reads += 1
        return [self.sample(uuid) for uuid in self.devices]

    def close(self) -> None:
        pass


class BusyGPU(FakeReader):
    """A whole GPU at 87 %."""

    utilization_percent = 87
    compute_processes = 1
    memory_used_bytes = 30 * GIB


class IdleGPU(FakeReader):
    """A whole GPU at 3 %: below the default 10 % it is idle, though memory is held."""

    utilization_percent = 3
    memory_used_bytes = 12 * GIB


class MIGSlice(FakeReader):
    """A MIG 1g.10gb slice: no utilisation, as NVML gives none for slices."""

    utilization_percent = None

    def sample(self, uuid: str) -> DeviceSample:
        return DeviceSample(
            uuid=uuid,
            name="NVIDIA A100-SXM4-80GB MIG 1g.10gb",
            kind="mig",
            memory_used_bytes=self.memory_used_bytes,
            memory_total_bytes=10 * GIB - 256 * 1024**2,
            utilization_percent=None,
            compute_processes=self.compute_processes,
            activity_source="memory",
        )


class BusyMIG(MIGSlice):
    """A slice with a compute process on it: busy."""

    compute_processes = 1
    memory_used_bytes = 6 * GIB


class IdleMIG(MIGSlice):
    """A slice with memory held but no compute process: idle."""

    compute_processes = 0
    memory_used_bytes = 1 * GIB


class NoNVML(FakeReader):
    """A machine without the NVIDIA library, answering as NvmlReader does there."""

    def read(self) -> list[DeviceSample]:
        self.reads += 1
        raise GPUUnavailable(
            "NVML is not available (NVML Shared Library Not Found): no live GPU numbers"
        )


class SwitchedByHomeFile(FakeReader):
    """Busy while ``$HOME/.fake-gpu-busy`` exists, idle otherwise: one setting for every
    server of a test hub, each server's GPU as busy as its user's file says."""

    def sample(self, uuid: str) -> DeviceSample:
        busy = (Path(os.environ.get("HOME", "/nonexistent")) / ".fake-gpu-busy").exists()
        self.utilization_percent = 91 if busy else 0
        self.compute_processes = 1 if busy else 0
        return super().sample(uuid)
