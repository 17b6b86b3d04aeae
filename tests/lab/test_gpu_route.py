"""GET gputap/gpu on a real Jupyter server, and GPU-aware idleness as the hub sees it.

jupyterhub-singleuser reports ``last_activity`` from ``/api/status`` to the hub; the idle
culler stops servers whose last activity is old. A busy GPU must keep moving it, an idle
one (and the panel's own polling) must not.
"""

from __future__ import annotations

import time

import pytest

from tests.lab.conftest import activity_moves, wait_for_samples

GIB = 1024**3


def test_busy_gpu_sample_history_and_activity(lab_server):
    server = lab_server("BusyGPU", history_seconds=1)
    answer = wait_for_samples(server, 3)

    assert answer["simulated"] is False
    assert answer["available"] is True
    assert answer["busy"] is True
    assert answer["message"] is None
    assert answer["devices"] == [
        {
            "uuid": "GPU-4a1c0000-aaaa-bbbb-cccc-000000000001",
            "name": "NVIDIA A100-SXM4-80GB",
            "kind": "gpu",
            "memory_used_bytes": 30 * GIB,
            "memory_total_bytes": 80 * GIB,
            "utilization_percent": 87,
            "compute_processes": 1,
            "activity_source": "utilization",
            "error": None,
        }
    ]
    point = answer["history"][-1]
    assert set(point) == {
        "at",
        "utilization_percent",
        "memory_used_bytes",
        "memory_total_bytes",
        "compute_processes",
        "busy",
    }
    assert point["utilization_percent"] == 87
    assert point["memory_used_bytes"] == 30 * GIB
    assert point["busy"] is True

    # history_seconds=1 at 0.2 s: the last 5 samples, never more
    time.sleep(1.5)
    history = server.get("gputap/gpu").json()["history"]
    assert len(history) == 5
    assert [p["at"] for p in history] == sorted(p["at"] for p in history)

    assert activity_moves(server), "a busy GPU must count as server activity"


def test_idle_gpu_is_not_activity(lab_server):
    server = lab_server("IdleGPU")
    answer = wait_for_samples(server, 2)
    assert answer["busy"] is False
    assert answer["devices"][0]["utilization_percent"] == 3
    assert answer["history"][-1]["busy"] is False
    # nor is the panel polling gputap/gpu: an open panel must not keep a server alive
    assert not activity_moves(server)


def test_threshold_is_configurable(lab_server):
    server = lab_server("IdleGPU", busy_utilization_percent=2)
    assert wait_for_samples(server, 2)["busy"] is True
    assert activity_moves(server)


def test_mig_slice_busy_by_its_processes(lab_server):
    server = lab_server(
        "BusyMIG", env={"CUDA_VISIBLE_DEVICES": "MIG-0c2e0000-aaaa-bbbb-cccc-000000000003"}
    )
    answer = wait_for_samples(server, 2)
    (device,) = answer["devices"]
    assert device["uuid"] == "MIG-0c2e0000-aaaa-bbbb-cccc-000000000003"
    assert device["kind"] == "mig"
    assert device["utilization_percent"] is None
    assert device["compute_processes"] == 1
    assert device["memory_used_bytes"] == 6 * GIB
    assert answer["history"][-1]["utilization_percent"] is None
    assert answer["busy"] is True
    assert activity_moves(server)


def test_idle_mig_slice(lab_server):
    server = lab_server(
        "IdleMIG", env={"CUDA_VISIBLE_DEVICES": "MIG-0c2e0000-aaaa-bbbb-cccc-000000000003"}
    )
    answer = wait_for_samples(server, 2)
    assert answer["busy"] is False
    assert answer["devices"][0]["compute_processes"] == 0
    assert not activity_moves(server)


def test_simulated_card_shows_no_numbers(lab_server):
    # the reader would say busy: a simulated card must still show nothing and mark nothing
    server = lab_server("BusyGPU", env={"GPUTAP_SIMULATED": "1"})
    time.sleep(0.6)
    answer = server.get("gputap/gpu").json()
    assert answer["simulated"] is True
    assert answer["available"] is False
    assert answer["busy"] is False
    assert answer["devices"] == []
    assert answer["history"] == []
    assert answer["message"] == "simulated card: no live numbers"
    assert not activity_moves(server)


def test_cpu_only_server_has_no_gpu(lab_server):
    server = lab_server("BusyGPU", env={"CUDA_VISIBLE_DEVICES": ""})
    time.sleep(0.4)
    answer = server.get("gputap/gpu").json()
    assert answer["available"] is False
    assert answer["devices"] == []
    assert answer["message"] == "CPU-only server: no GPU"
    assert not activity_moves(server)


def test_without_nvml_no_fake_numbers(lab_server):
    server = lab_server("NoNVML")
    time.sleep(0.6)
    answer = server.get("gputap/gpu").json()
    assert answer["available"] is False
    assert answer["simulated"] is False
    assert answer["devices"] == [] and answer["history"] == []
    assert "NVML is not available" in answer["message"]


def test_real_nvml_reader_on_a_machine_without_nvml(lab_server):
    """The default reader here, where no NVIDIA library exists: unavailable, with why."""
    pytest.importorskip("pynvml")
    server = lab_server(None)
    time.sleep(0.6)
    answer = server.get("gputap/gpu").json()
    if answer["available"]:
        pytest.skip("this machine has a working NVML")
    assert answer["devices"] == []
    assert "NVML" in answer["message"]


def test_gpu_route_needs_login(lab_server):
    server = lab_server("IdleGPU")
    assert server.get("gputap/gpu", auth=False).status_code == 403
    assert server.get("gputap/gpu", headers={"Authorization": "token wrong"}).status_code == 403
    # a browser without a session is refused too, not shown numbers
    browser = server.get("gputap/gpu", auth=False, headers={"Accept": "text/html"})
    assert browser.status_code in (302, 403)
    assert "utilization_percent" not in browser.text
