"""The hub on a machine whose GPUs misbehave or change while it runs, read through the fake
libnvidia-ml.so.1 (tests/nvml/README.md) from a machine file the test rewrites."""

import time

import pytest

from tests.nvml.conftest import write_machine
from tests.platform import Platform

GOOD = "GPU-aaaaaaaa-1111-4222-8333-444444444444"
FAILING = "GPU-bbbbbbbb-1111-4222-8333-444444444444"
OWNERS = "GPU-cccccccc-1111-4222-8333-444444444444"  # the owner's display GPU, kept out
MACHINE = f"""
    NVIDIA H200|{GOOD}|143771|off;
    NVIDIA H200|{FAILING}|143771|off;
    NVIDIA H200|{OWNERS}|143771|off
"""
H200 = {"kind": "card", "card": "H200-141GB"}


@pytest.fixture(scope="module")
def machine(tmp_path_factory):
    path = tmp_path_factory.mktemp("nvml-machine") / "machine"
    # one GPU answers its handle but fails every later call (it fell off the bus)
    write_machine(
        path, DEVICES=MACHINE, FAIL_CALLS=f"nvmlDeviceGetMemoryInfo@{FAILING}=GPU_IS_LOST"
    )
    return path


@pytest.fixture(scope="module")
def platform(tmp_path_factory, fake_nvml_dir, machine):
    p = Platform(
        tmp_path_factory.mktemp("nvml-hub"),
        extra={
            "spawner": {
                "inventory": "nvml",
                "exclude_gpus": ["2"],
                "inventory_refresh_seconds": 0.5,
            }
        },
        env={"LD_LIBRARY_PATH": str(fake_nvml_dir), "FAKE_NVML_FILE": str(machine)},
    )
    p.start()
    yield p
    p.shutdown()


def test_a_failing_gpu_is_left_out_the_rest_serves_and_it_comes_back_when_healthy(
    platform, machine
):
    for name in ("ida", "jon", "kim"):
        platform.create_user(name)
    r = platform.spawn("ida", H200)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("ida")
    assert platform.server_env("ida")["CUDA_VISIBLE_DEVICES"] == GOOD

    r = platform.spawn("jon", {"kind": "cpu"})  # CPU-only servers never depend on a GPU
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("jon")

    r = platform.spawn("kim", H200)
    assert r.status_code == 409, r.text
    assert "No H200-141GB free now (0 of 1 free)" in r.json()["message"], r.text
    log = platform.log_tail(600)
    assert f"GPU 1 ({FAILING}): GPU is lost; left out, the other GPUs are served" in log

    # the GPU is healthy again (reset by its owner): the next start reads NVML again
    write_machine(machine, DEVICES=MACHINE)
    time.sleep(0.6)
    r = platform.spawn("kim", H200)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("kim")
    assert platform.server_env("kim")["CUDA_VISIBLE_DEVICES"] == FAILING
    assert f"new {FAILING}, gone none" in platform.log_tail(400)

    # ida's GPU falls off the bus: it is never offered again, her server stops normally
    lost = MACHINE.replace(f"{GOOD}|143771|off", f"{GOOD}|143771|lost")
    write_machine(machine, DEVICES=lost)
    time.sleep(0.6)
    platform.stop_server("kim")
    platform.stop_server("ida")
    r = platform.spawn("ida", H200)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("ida")
    assert platform.server_env("ida")["CUDA_VISIBLE_DEVICES"] == FAILING
    r = platform.spawn("kim", H200)
    assert r.status_code == 409, r.text
    assert "(0 of 1 free)" in r.json()["message"], r.text
    assert f"gone {GOOD}" in platform.log_tail(400)
    for name in ("ida", "jon"):
        platform.stop_server(name)


UNKNOWN = "GPU-dddddddd-1111-4222-8333-444444444444"
UNKNOWN_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
UNKNOWN_SKU = "RTX-PRO-6000-Blackwell-Server-Edition"


@pytest.fixture(scope="module")
def unknown_platform(tmp_path_factory, fake_nvml_dir):
    """A box with only a GPU the catalog does not know, priced by its operator."""
    p = Platform(
        tmp_path_factory.mktemp("nvml-unknown"),
        extra={"spawner": {"inventory": "auto"}, "billing": {"prices": {UNKNOWN_SKU: "9.00"}}},
        env={
            "LD_LIBRARY_PATH": str(fake_nvml_dir),
            "FAKE_NVML_DEVICES": f"{UNKNOWN_NAME}|{UNKNOWN}|97887|none",
        },
    )
    p.start()
    yield p
    p.shutdown()


def test_an_unknown_gpu_is_served_as_nvml_names_it_once_priced(unknown_platform):
    platform = unknown_platform
    platform.create_user("lea")
    # the very first thing the hub does: a spawn asking for the card by its SKU
    r = platform.spawn("lea", {"kind": "card", "card": UNKNOWN_SKU})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("lea")
    env = platform.server_env("lea")
    assert (env["CUDA_VISIBLE_DEVICES"], env["GPUTAP_SIMULATED"]) == (UNKNOWN, "0")
    log = platform.log_tail(600)
    assert f"offered as {UNKNOWN_SKU} (95.6 GB, TFLOPS unknown)" in log
    assert "simulated" not in log.lower().replace("gputap_simulated", "")
    platform.stop_server("lea")
