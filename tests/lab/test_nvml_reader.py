"""The real NvmlReader in a real server, reading NVML through tests/nvml's fake libnvidia-ml.

pynvml's own ctypes calls reach the fake (``LD_LIBRARY_PATH``) as they would reach the
driver's library: handles by UUID, utilisation, memory, compute processes, and NVML's
errors for MIG slices and missing drivers.
"""

from __future__ import annotations

import time

from tests.lab.conftest import activity_moves, wait_for_samples
from tests.nvml.conftest import fake_nvml_dir  # noqa: F401  (builds the fake library)

MIB = 1024**2
# memory the driver itself holds on every device, idle or not (tests/nvml/fake_nvml.c)
H200_DRIVER_MIB = 512
MIG_DRIVER_MIB = 12
MACHINE = """
    NVIDIA H200|GPU-9d5e0000-aaaa-bbbb-cccc-000000000001|143771|off;
    NVIDIA A100-SXM4-80GB|GPU-4a1c0000-aaaa-bbbb-cccc-000000000002|81920|on;
    @0|NVIDIA A100-SXM4-80GB MIG 3g.40gb|MIG-77b00000-aaaa-bbbb-cccc-000000000003|40192;
    @3|NVIDIA A100-SXM4-80GB MIG 1g.10gb|MIG-0c2e0000-aaaa-bbbb-cccc-000000000004|9984
"""
H200 = "GPU-9d5e0000-aaaa-bbbb-cccc-000000000001"
SLICE_3G = "MIG-77b00000-aaaa-bbbb-cccc-000000000003"
SLICE_1G = "MIG-0c2e0000-aaaa-bbbb-cccc-000000000004"


def nvml_env(fake_dir, visible: str, use: str = "", **extra: str) -> dict[str, str]:
    return {
        "LD_LIBRARY_PATH": str(fake_dir),
        "FAKE_NVML_DEVICES": MACHINE,
        "FAKE_NVML_USE": use,
        "CUDA_VISIBLE_DEVICES": visible,
        "GPUTAP_SIMULATED": "0",
        **extra,
    }


def test_whole_gpu(lab_server, fake_nvml_dir):  # noqa: F811
    env = nvml_env(fake_nvml_dir, H200, f"{H200}|55|20000|2; {SLICE_1G}|0|3000|1")
    server = lab_server(None, env=env)
    answer = wait_for_samples(server, 2)
    assert answer["available"] is True, answer
    assert answer["devices"] == [
        {
            "uuid": H200,
            "name": "NVIDIA H200",
            "kind": "gpu",
            "memory_used_bytes": (20000 + H200_DRIVER_MIB) * MIB,
            "memory_total_bytes": 143771 * MIB,
            "utilization_percent": 55,
            "compute_processes": 2,
            "activity_source": "utilization",
            "error": None,
        }
    ]
    assert answer["busy"] is True
    assert activity_moves(server)


def test_mig_slices(lab_server, fake_nvml_dir):  # noqa: F811
    # the 1g.10gb slice runs a process; NVML gives no utilisation for slices
    env = nvml_env(
        fake_nvml_dir, f"{SLICE_3G},{SLICE_1G}", f"{SLICE_3G}|90|100|0; {SLICE_1G}|0|3000|1"
    )
    server = lab_server(None, env=env)
    answer = wait_for_samples(server, 2)
    assert [(d["uuid"], d["kind"], d["utilization_percent"]) for d in answer["devices"]] == [
        (SLICE_3G, "mig", None),
        (SLICE_1G, "mig", None),
    ]
    assert [d["compute_processes"] for d in answer["devices"]] == [0, 1]
    assert answer["devices"][1]["memory_used_bytes"] == (3000 + MIG_DRIVER_MIB) * MIB
    assert answer["devices"][1]["memory_total_bytes"] == 9984 * MIB
    assert answer["busy"] is True
    assert answer["history"][-1]["utilization_percent"] is None


def test_idle_mig_slice_holding_memory(lab_server, fake_nvml_dir):  # noqa: F811
    env = nvml_env(fake_nvml_dir, SLICE_1G, f"{SLICE_1G}|0|3000|0")
    server = lab_server(None, env=env)
    answer = wait_for_samples(server, 2)
    assert answer["busy"] is False
    assert not activity_moves(server)


def test_device_nvml_does_not_know(lab_server, fake_nvml_dir):  # noqa: F811
    server = lab_server(None, env=nvml_env(fake_nvml_dir, "MIG-not-on-this-machine"))
    time.sleep(0.6)
    answer = server.get("gputap/gpu").json()
    assert answer["available"] is False
    assert answer["devices"] == []
    assert "NVML does not find this server's GPU ['MIG-not-on-this-machine']" in answer["message"]


def test_driver_not_loaded(lab_server, fake_nvml_dir):  # noqa: F811
    env = nvml_env(fake_nvml_dir, H200, FAKE_NVML_FAIL="driver")
    server = lab_server(None, env=env)
    time.sleep(0.6)
    answer = server.get("gputap/gpu").json()
    assert answer["available"] is False
    assert answer["devices"] == [] and answer["history"] == []
    assert answer["message"].startswith("NVML is not available (Driver Not Loaded)")
