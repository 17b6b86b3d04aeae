"""What counts as GPU activity, read through tests/nvml's fake libnvidia-ml in a real server:
utilisation over the whole interval between samples, a MIG slice's own activity where the
GPU counts it (GPM, Hopper and later), and elsewhere a context that does nothing going idle."""

from __future__ import annotations

import time

from tests.lab.conftest import activity_moves, wait_for_samples
from tests.lab.test_nvml_faults import by_uuid, wait_until
from tests.lab.test_nvml_reader import H200, MACHINE, SLICE_1G, nvml_env
from tests.nvml.conftest import fake_nvml_dir, write_machine  # noqa: F401

H200_MIG = "GPU-9d5e0000-aaaa-bbbb-cccc-0000000000a1"
H200_IDLE_SLICE = "MIG-9d5e0000-aaaa-bbbb-cccc-0000000000a2"
H200_BUSY_SLICE = "MIG-9d5e0000-aaaa-bbbb-cccc-0000000000a3"
HOPPER_MIG = f"""
    NVIDIA H200|{H200_MIG}|143771|on;
    @0|NVIDIA H200 MIG 1g.18gb|{H200_IDLE_SLICE}|16384;
    @1|NVIDIA H200 MIG 1g.18gb|{H200_BUSY_SLICE}|16384
"""


def test_bursts_between_samples_count(lab_server, fake_nvml_dir):  # noqa: F811
    """100 % for 0.2 s of every 3 s: a mean of 6.7 %, which one instant every 3 s misses
    (it sees 0 % or 100 %). Each sample reports the mean since the one before."""
    env = nvml_env(fake_nvml_dir, H200, f"{H200}|100/200/3000|20000|1")
    server = lab_server(None, env=env, sample_interval_seconds=3, busy_utilization_percent=4)
    answer = wait_for_samples(server, 4)
    utilizations = [p["utilization_percent"] for p in answer["history"]]
    assert all(3 <= u <= 13 for u in utilizations), utilizations
    assert all(p["busy"] for p in answer["history"]), answer["history"]
    assert answer["devices"][0]["activity_source"] == "utilization"


def test_hopper_slice_activity_from_gpm(lab_server, fake_nvml_dir):  # noqa: F811
    """Both slices hold a context; only one works. GPM tells them apart."""
    use = f"{H200_IDLE_SLICE}|0|3000|1; {H200_BUSY_SLICE}|60|3000|1"
    env = nvml_env(fake_nvml_dir, f"{H200_IDLE_SLICE},{H200_BUSY_SLICE}", use)
    env["FAKE_NVML_DEVICES"] = HOPPER_MIG
    server = lab_server(None, env=env)
    answer = wait_until(server, lambda a: len(a["history"]) >= 3)
    devices = by_uuid(answer)
    assert devices[H200_IDLE_SLICE]["utilization_percent"] == 0
    assert devices[H200_BUSY_SLICE]["utilization_percent"] == 60
    assert answer["busy"] is True
    assert [d["activity_source"] for d in answer["devices"]] == ["gpm", "gpm"]


def test_hopper_slice_holding_an_idle_context_is_idle(lab_server, fake_nvml_dir):  # noqa: F811
    env = nvml_env(fake_nvml_dir, H200_IDLE_SLICE, f"{H200_IDLE_SLICE}|0|3000|1")
    env["FAKE_NVML_DEVICES"] = HOPPER_MIG
    server = lab_server(None, env=env)
    wait_for_samples(server, 3)
    assert server.get("gputap/gpu").json()["busy"] is False
    assert not activity_moves(server)


def test_a100_slice_with_a_context_that_does_nothing_goes_idle(lab_server, fake_nvml_dir):  # noqa: F811
    """No per-instance counters on an A100: busy while the listed context is new, idle once
    it has held the same memory for mig_steady_idle_minutes (here 1.2 s)."""
    env = nvml_env(fake_nvml_dir, SLICE_1G, f"{SLICE_1G}|0|3000|1")
    server = lab_server(None, env=env, mig_steady_idle_minutes=0.02)
    answer = wait_for_samples(server, 1)
    assert answer["busy"] is True
    answer = wait_until(server, lambda a: not a["busy"], seconds=5)
    assert answer["devices"][0]["compute_processes"] == 1
    assert not activity_moves(server)
    assert answer["devices"][0]["activity_source"] == "memory"


def test_unprivileged_a100_slice_judged_by_memory(lab_server, fake_nvml_dir, tmp_path):  # noqa: F811
    """A user's server gets NO_PERMISSION for MIG process lists: a context coming (its memory
    grows) is activity, the same memory held unchanged for the steady time is not."""
    machine = tmp_path / "machine"
    write_machine(machine, DEVICES=MACHINE, PRIVILEGED="0")
    env = nvml_env(fake_nvml_dir, SLICE_1G, FAKE_NVML_FILE=str(machine))
    server = lab_server(None, env=env, mig_steady_idle_minutes=0.02)
    answer = wait_for_samples(server, 3)
    assert answer["devices"][0]["compute_processes"] is None
    assert answer["busy"] is False
    write_machine(machine, DEVICES=MACHINE, USE=f"{SLICE_1G}|0|3000|1", PRIVILEGED="0")
    wait_until(server, lambda a: a["busy"], seconds=5)
    started = time.monotonic()
    wait_until(server, lambda a: not a["busy"], seconds=5)
    assert time.monotonic() - started < 3
    assert not activity_moves(server)
