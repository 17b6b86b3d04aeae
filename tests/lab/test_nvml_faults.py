"""The real NvmlReader where real machines differ from a healthy current one: an old driver,
a call that fails for one device, a GPU lost at start, a MIG reconfiguration under a running
server. Through tests/nvml's fake libnvidia-ml, in a real server (tests/lab/conftest.py)."""

from __future__ import annotations

import time

from tests.lab.conftest import wait_for_samples
from tests.lab.test_nvml_reader import (
    H200,
    H200_DRIVER_MIB,
    MACHINE,
    MIB,
    MIG_DRIVER_MIB,
    SLICE_1G,
    SLICE_3G,
    nvml_env,
)
from tests.nvml.conftest import fake_nvml_dir, fake_nvml_old_dir, write_machine  # noqa: F401

A100 = "GPU-4a1c0000-aaaa-bbbb-cccc-000000000002"
# what an R460-era driver calls the A100's 1g.10gb slice (GPU instance 7, compute instance 0)
OLD_SLICE_1G = f"MIG-{A100}/7/0"


def wait_until(server, check, seconds: float = 10) -> dict:
    """The first ``GET gputap/gpu`` answer for which ``check`` holds."""
    deadline = time.monotonic() + seconds
    answer: dict = {}
    while time.monotonic() < deadline:
        answer = server.get("gputap/gpu").json()
        if check(answer):
            return answer
        time.sleep(0.1)
    raise AssertionError(f"not in {seconds} s: {answer}\n{server.log()[-4000:]}")


def by_uuid(answer: dict) -> dict[str, dict]:
    return {d["uuid"]: d for d in answer["devices"]}


def test_old_driver_without_the_v3_process_call(lab_server, fake_nvml_old_dir):  # noqa: F811
    use = f"{H200}|55|20000|2; {SLICE_1G}|0|3000|1"
    env = nvml_env(fake_nvml_old_dir, f"{H200},{OLD_SLICE_1G}", use)
    server = lab_server(None, env=env)
    answer = wait_for_samples(server, 2)
    devices = by_uuid(answer)
    assert answer["available"] is True, answer
    assert devices[H200]["name"] == "H200"
    assert devices[H200]["compute_processes"] == 2
    assert devices[H200]["utilization_percent"] == 55
    assert devices[OLD_SLICE_1G]["name"] == "A100-SXM4-80GB MIG 1g.10gb"
    assert devices[OLD_SLICE_1G]["compute_processes"] == 1
    assert devices[OLD_SLICE_1G]["memory_used_bytes"] == (3000 + MIG_DRIVER_MIB) * MIB
    assert all(d["error"] is None for d in answer["devices"]), answer
    assert "sampling the GPU failed" not in server.log()


def test_one_failing_call_leaves_that_value_unknown(lab_server, fake_nvml_dir, tmp_path):  # noqa: F811
    machine = tmp_path / "machine"
    write_machine(
        machine,
        DEVICES=MACHINE,
        USE=f"{H200}|55|20000|2; {SLICE_3G}|0|100|0",
        FAIL_CALLS=(
            f"nvmlDeviceGetComputeRunningProcesses_v3@{H200}=NO_PERMISSION;"
            f"nvmlDeviceGetMemoryInfo@{SLICE_1G}=GPU_IS_LOST"
        ),
    )
    env = nvml_env(fake_nvml_dir, f"{H200},{SLICE_3G},{SLICE_1G}", FAKE_NVML_FILE=str(machine))
    server = lab_server(None, env=env)
    answer = wait_for_samples(server, 3)
    assert answer["available"] is True, answer
    devices = by_uuid(answer)
    assert devices[H200]["compute_processes"] is None
    assert devices[H200]["memory_used_bytes"] == (20000 + H200_DRIVER_MIB) * MIB
    assert devices[H200]["utilization_percent"] == 55
    assert devices[SLICE_3G]["memory_used_bytes"] == (100 + MIG_DRIVER_MIB) * MIB
    assert devices[SLICE_3G]["error"] is None
    lost = devices[SLICE_1G]
    assert lost["memory_used_bytes"] is None and lost["memory_total_bytes"] is None
    assert lost["error"] == "memory: GPU is lost"
    assert lost["name"] == "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    # said once, not at every sample; and a lost GPU is a fault (test_gpu_health.py), found once
    assert server.log().count("memory: GPU is lost") == 1, server.log()
    assert server.log().count(f"GPU fault on {SLICE_1G}: lost") == 1, server.log()


def test_gpu_lost_at_start_is_read_once_back(lab_server, fake_nvml_dir, tmp_path):  # noqa: F811
    machine = tmp_path / "machine"
    use = f"{H200}|40|1000|1"
    write_machine(machine, DEVICES=MACHINE, USE=use, FAIL_CALLS=f"*@{H200}=GPU_IS_LOST")
    server = lab_server(None, env=nvml_env(fake_nvml_dir, H200, FAKE_NVML_FILE=str(machine)))
    answer = wait_until(server, lambda a: a["message"] is not None)
    assert answer["available"] is False
    assert "GPU is lost" in answer["message"]
    write_machine(machine, DEVICES=MACHINE, USE=use)
    answer = wait_until(server, lambda a: a["available"])
    assert by_uuid(answer)[H200]["utilization_percent"] == 40
    assert by_uuid(answer)[H200]["compute_processes"] == 1


def test_mig_reconfiguration_under_a_running_server(lab_server, fake_nvml_dir, tmp_path):  # noqa: F811
    """The slice keeps its UUID but moves (another slice was made): the handles the server
    holds are invalid, the reader asks for them again and reads the new state."""
    machine = tmp_path / "machine"
    write_machine(machine, DEVICES=MACHINE, USE=f"{SLICE_1G}|0|3000|1")
    server = lab_server(None, env=nvml_env(fake_nvml_dir, SLICE_1G, FAKE_NVML_FILE=str(machine)))
    answer = wait_for_samples(server, 2)
    assert by_uuid(answer)[SLICE_1G]["compute_processes"] == 1
    reconfigured = MACHINE.replace("@3|", "@5|").replace(
        "@0|",
        "@3|NVIDIA A100-SXM4-80GB MIG 2g.20gb|MIG-2g000000-aaaa-bbbb-cccc-000000000009|19968; @0|",
    )
    write_machine(machine, DEVICES=reconfigured, USE=f"{SLICE_1G}|0|5000|2")
    answer = wait_until(
        server,
        lambda a: a["available"] and by_uuid(a)[SLICE_1G]["compute_processes"] == 2,
    )
    assert by_uuid(answer)[SLICE_1G]["memory_used_bytes"] == (5000 + MIG_DRIVER_MIB) * MIB
    assert by_uuid(answer)[SLICE_1G]["error"] is None
    assert "sampling the GPU failed" not in server.log()
