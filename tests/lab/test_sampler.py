"""The sampler, the readers' choice of devices and the hub client's URLs, without a server."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import psutil
import pytest

from gputap_lab import gpu, sampler
from gputap_lab.cpu import ProcessTreeCPU, tree_cpu_seconds
from gputap_lab.gpu import DeviceSample, GPUUnavailable, NvmlReader, visible_devices
from gputap_lab.hub import HubClient, HubNotConfigured, gputap_api_url, server_path
from gputap_lab.sampler import ACTIVITY_KEY, BusyRule, Sampler, history_point
from tests.lab.fake_gpu import BusyGPU, BusyMIG, IdleGPU, IdleMIG, NoNVML
from tests.waiting import wait_for

GIB = 1024**3
log = logging.getLogger("test")


def device(
    utilization: int | None,
    processes: int | None = 0,
    memory: int | None = GIB,
    footprint: tuple | None = None,
) -> DeviceSample:
    return DeviceSample(
        uuid="GPU-1",
        name="NVIDIA H200",
        kind="gpu" if utilization is not None else "mig",
        memory_used_bytes=memory,
        memory_total_bytes=4 * GIB,
        utilization_percent=utilization,
        compute_processes=processes,
        footprint=footprint,
    )


T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "devices,busy",
    [
        ([], False),
        ([device(9)], False),
        ([device(10)], True),
        ([device(0), device(55)], True),
        ([device(None, 0)], False),
        ([device(None, 2)], True),
        ([device(None, None)], False),
    ],
)
def test_busy_at_the_first_sample(devices, busy):
    assert BusyRule(10, steady_idle_seconds=600)(devices, T0) is busy


def test_a_listed_context_that_holds_the_same_memory_goes_idle():
    rule = BusyRule(10, steady_idle_seconds=600)
    held = device(None, 1, 3 * GIB, ((4010, 3 * GIB),))
    assert rule([held], T0) is True
    assert rule([held], T0 + timedelta(seconds=599)) is True
    assert rule([held], T0 + timedelta(seconds=600)) is False
    assert rule([held], T0 + timedelta(hours=5)) is False
    # it allocates more: working again, for another steady time
    grown = device(None, 1, 4 * GIB, ((4010, 4 * GIB),))
    assert rule([grown], T0 + timedelta(hours=5, seconds=1)) is True
    assert rule([grown], T0 + timedelta(hours=5, seconds=601)) is False
    # another process comes with the same total: the set changed
    two = device(None, 2, 4 * GIB, ((4010, 2 * GIB), (4011, 2 * GIB)))
    assert rule([two], T0 + timedelta(hours=6)) is True
    assert rule([device(None, 0, 4 * GIB, ())], T0 + timedelta(hours=6, seconds=1)) is False


def test_unlisted_processes_judged_by_memory_above_the_idle_floor():
    """NO_PERMISSION for the process list (a user's server on MIG): memory alone."""
    rule = BusyRule(10, steady_idle_seconds=60)
    driver = 12 * 1024**2
    assert rule([device(None, None, driver)], T0) is False
    assert rule([device(None, None, driver + GIB)], T0 + timedelta(seconds=1)) is True
    assert rule([device(None, None, driver + GIB)], T0 + timedelta(seconds=60)) is True
    assert rule([device(None, None, driver + GIB)], T0 + timedelta(seconds=61)) is False
    assert rule([device(None, None, driver + 2 * GIB)], T0 + timedelta(seconds=70)) is True
    # the context ends: memory back to the driver's own is idle at once
    assert rule([device(None, None, driver)], T0 + timedelta(seconds=71)) is False
    assert rule([device(None, None, None)], T0 + timedelta(seconds=72)) is False


def test_a_steady_slice_whose_processes_keep_using_the_cpu_stays_busy():
    """A100/A30 slices count no activity of their own: a training loop holding the same
    memory for hours is still busy while the server's processes work on the CPU, which
    feeding a GPU takes; the same hold with the processes asleep is idle as before."""
    rule = BusyRule(10, steady_idle_seconds=60, busy_cpu_percent=20)
    held = device(None, 1, 3 * GIB, ((4010, 3 * GIB),))
    assert rule([held], T0, cpu_percent=0.0) is True  # listed at start
    later = T0 + timedelta(hours=2)
    assert rule([held], later, cpu_percent=95.0) is True
    assert rule([held], later + timedelta(seconds=1), cpu_percent=19.0) is False
    assert rule([held], later + timedelta(seconds=2), cpu_percent=None) is False  # not known
    # nothing held: the CPU alone is no GPU work (the server's own activity counts that)
    assert rule([device(None, 0, GIB, ())], later + timedelta(seconds=3), cpu_percent=95.0) is False
    # a whole GPU: its utilisation decides, whatever the CPU does
    assert rule([device(0, 1, 3 * GIB)], later, cpu_percent=95.0) is False


def test_the_cpu_of_the_servers_process_tree_live_and_ended():
    # a "server" whose child uses half a CPU-second, sleeps, ends and is waited for
    spin = "import time\nwhile time.process_time() < 0.5: pass\ntime.sleep(1)"
    server_code = (
        "import subprocess, sys, time\n"
        f"subprocess.run([sys.executable, '-c', {spin!r}])\n"
        "time.sleep(60)"
    )
    server = subprocess.Popen([sys.executable, "-c", server_code])
    try:
        # clock ticks: half a CPU-second may read 0.49
        counted = wait_for(lambda: (tree_cpu_seconds(server.pid) or 0) >= 0.4, timeout=60)
        assert counted  # while the child lives
        wait_for(lambda: not psutil.Process(server.pid).children(), timeout=30)
        assert tree_cpu_seconds(server.pid) >= 0.4  # and once it ended and was waited for
    finally:
        server.kill()
        server.wait()
    me = os.getpid()
    tree = ProcessTreeCPU(me)
    assert tree.percent() is None  # one reading: nothing to compare yet
    subprocess.run([sys.executable, "-c", "import time; time.sleep(1)"], check=True)
    assert 0 <= tree.percent() < 30  # a sleeping child: its start-up only


def test_utilisation_decides_where_there_is_one():
    rule = BusyRule(10, steady_idle_seconds=60)
    held = device(0, 1, 3 * GIB, ((4010, 3 * GIB),))
    assert rule([held], T0) is False  # a GPM slice or GPU at 0 %: its context is not work
    assert rule([device(12, 1, 3 * GIB)], T0 + timedelta(hours=3)) is True


def test_history_point_adds_devices_up():
    at = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    point = history_point(at, [device(20, 1), device(41, 2)], True)
    assert point == {
        "at": "2026-11-30T10:00:00+00:00",
        "utilization_percent": 30,
        "memory_used_bytes": 2 * GIB,
        "memory_total_bytes": 8 * GIB,
        "compute_processes": 3,
        "busy": True,
    }
    assert history_point(at, [device(None, 0)], False)["utilization_percent"] is None
    unknown = history_point(at, [device(None, None, None)], False)
    assert unknown["memory_used_bytes"] is None and unknown["compute_processes"] is None


def make_sampler(reader, settings, **kwargs) -> Sampler:
    return Sampler(
        reader,
        simulated=kwargs.pop("simulated", False),
        interval_seconds=1,
        history_seconds=kwargs.pop("history_seconds", 3),
        busy_utilization_percent=10,
        settings=settings,
        log=log,
    )


async def test_busy_marks_activity_idle_does_not(monkeypatch):
    times = iter(datetime(2026, 11, 30, 10, 0, s, tzinfo=UTC) for s in range(60))
    monkeypatch.setattr(sampler, "utcnow", lambda: next(times))
    settings: dict = {}
    idle = make_sampler(IdleGPU(["GPU-1"]), settings)
    await idle.sample_once()
    assert ACTIVITY_KEY not in settings
    assert idle.to_json()["busy"] is False

    busy = make_sampler(BusyGPU(["GPU-1"]), settings)
    await busy.sample_once()
    first = settings[ACTIVITY_KEY]
    await busy.sample_once()
    assert settings[ACTIVITY_KEY] > first
    assert settings[ACTIVITY_KEY].tzinfo is UTC


async def test_mig_activity_by_processes():
    settings: dict = {}
    await make_sampler(IdleMIG(["MIG-1"]), settings).sample_once()
    assert ACTIVITY_KEY not in settings
    await make_sampler(BusyMIG(["MIG-1"]), settings).sample_once()
    assert ACTIVITY_KEY in settings


async def test_history_is_bounded():
    s = make_sampler(IdleGPU(["GPU-1"]), {}, history_seconds=3)
    for _ in range(10):
        await s.sample_once()
    assert len(s.to_json()["history"]) == 3


async def test_unavailable_reader_shows_why_and_no_numbers():
    settings: dict = {}
    s = make_sampler(NoNVML(["GPU-1"]), settings)
    await s.sample_once()
    answer = s.to_json()
    assert answer["available"] is False
    assert answer["devices"] == [] and answer["history"] == []
    assert answer["message"].startswith("NVML is not available")
    assert ACTIVITY_KEY not in settings


def test_simulated_and_cpu_only_have_no_reader():
    assert make_sampler(None, {}, simulated=True).to_json()["message"] == (
        "simulated card: no live numbers"
    )
    assert make_sampler(None, {}).to_json()["message"] == "CPU-only server: no GPU"


async def test_sampler_start_and_stop_close_the_reader():
    reader = IdleGPU(["GPU-1"])
    closed = []
    reader.close = lambda: closed.append(True)
    s = make_sampler(reader, {})
    s.start()
    await s.stop()
    assert closed == [True]


@pytest.mark.parametrize(
    "env,devices",
    [
        ({"CUDA_VISIBLE_DEVICES": "MIG-a,MIG-b"}, ["MIG-a", "MIG-b"]),
        ({"CUDA_VISIBLE_DEVICES": " GPU-a "}, ["GPU-a"]),
        ({"CUDA_VISIBLE_DEVICES": ""}, []),
        ({"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "GPU-x"}, []),
        ({"NVIDIA_VISIBLE_DEVICES": "MIG-k8s"}, ["MIG-k8s"]),
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, []),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, None),
        ({}, None),
    ],
)
def test_visible_devices(env, devices):
    assert visible_devices(env) == devices


def test_nvml_reader_without_the_library(monkeypatch):
    """Where nvmlInit fails (no library, no driver), read says why; no numbers, no retry."""
    calls = []

    def init():
        calls.append("init")
        raise gpu.pynvml.NVMLError(gpu.pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(gpu.pynvml, "nvmlInit", init)
    reader = NvmlReader(["GPU-1"])
    for _ in range(2):
        with pytest.raises(GPUUnavailable, match="NVML is not available"):
            reader.read()
    assert calls == ["init"]
    reader.close()


def test_nvml_reader_without_any_process_list_call(monkeypatch):
    """A driver with neither nvmlDeviceGetComputeRunningProcesses_v3 nor _v2: processes are
    unknown, the rest of the sample is read, and the missing calls are not tried again."""
    missing = gpu.pynvml.NVMLError(gpu.pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
    calls: list[str] = []

    def lacking(name):
        def call(*args):
            calls.append(name)
            raise missing

        return call

    nvml = gpu.pynvml
    monkeypatch.setattr(nvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(nvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(nvml, "nvmlDeviceGetHandleByUUID", lambda uuid: "handle")
    monkeypatch.setattr(nvml, "nvmlDeviceGetName", lambda h: "Tesla V100-SXM2-16GB")
    monkeypatch.setattr(
        nvml, "nvmlDeviceGetMemoryInfo", lambda h: SimpleNamespace(used=GIB, total=16 * GIB)
    )
    monkeypatch.setattr(nvml, "nvmlDeviceGetComputeRunningProcesses_v3", lacking("v3"))
    monkeypatch.setattr(nvml, "nvmlDeviceGetComputeRunningProcesses_v2", lacking("v2"))
    monkeypatch.setattr(nvml, "nvmlDeviceGetSamples", lacking("samples"))
    monkeypatch.setattr(nvml, "nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=30))
    reader = NvmlReader(["GPU-1"])
    for _ in range(2):
        [sample] = reader.read()
        assert (sample.compute_processes, sample.utilization_percent) == (None, 30)
        assert (sample.memory_used_bytes, sample.error) == (GIB, None)
    assert calls == ["v3", "v2", "samples"]
    reader.close()


async def test_an_unexpected_failure_is_logged_once(caplog):
    class Broken(IdleGPU):
        def read(self):
            raise RuntimeError("pynvml changed its mind")

    s = Sampler(
        Broken(["GPU-1"]),
        simulated=False,
        interval_seconds=0.01,
        history_seconds=1,
        busy_utilization_percent=10,
        settings={},
        log=log,
    )
    with caplog.at_level(logging.ERROR, logger="test"):
        s.start()
        await asyncio.sleep(0.2)
        await s.stop()
    assert [r.message for r in caplog.records] == ["gputap: sampling the GPU failed"]
    assert (
        s.to_json()["message"] == "reading the GPU failed (RuntimeError: pynvml changed its mind)"
    )


def test_nvml_is_not_initialised_at_import(monkeypatch):
    calls = []
    monkeypatch.setattr(gpu.pynvml, "nvmlInit", lambda: calls.append("init"))
    NvmlReader(["GPU-1"])
    assert calls == []


@pytest.mark.parametrize(
    "api,expected",
    [
        ("http://127.0.0.1:8081/hub/api", "http://127.0.0.1:8081/hub/gputap/api/"),
        ("http://hub:8081/prefix/hub/api/", "http://hub:8081/prefix/hub/gputap/api/"),
    ],
)
def test_gputap_api_url(api, expected):
    assert gputap_api_url(api) == expected


def test_server_path():
    assert server_path("alice", "") == "users/alice/server"
    assert server_path("a b", "gpu/1") == "users/a%20b/servers/gpu%2F1"


def test_hub_client_from_env():
    missing = HubClient.from_env({"JUPYTERHUB_API_URL": "http://h/hub/api"})
    assert isinstance(missing, HubNotConfigured)
    assert missing.status == 503
    assert "JUPYTERHUB_API_TOKEN, JUPYTERHUB_USER not set" in missing.message
    client = HubClient.from_env(
        {
            "JUPYTERHUB_API_URL": "http://h/hub/api",
            "JUPYTERHUB_API_TOKEN": "secret",
            "JUPYTERHUB_USER": "alice",
            "JUPYTERHUB_SERVER_NAME": "big",
        }
    )
    assert isinstance(client, HubClient)
    assert client.base == "http://h/hub/gputap/api/"
    assert client.who == "alice/big"


def test_mig_steady_idle_minutes_must_be_positive():
    from traitlets import TraitError

    from gputap_lab.app import GPUTapLab

    assert GPUTapLab().mig_steady_idle_minutes == 10
    with pytest.raises(TraitError, match="mig_steady_idle_minutes must be above 0, not 0.0"):
        GPUTapLab(mig_steady_idle_minutes=0)
