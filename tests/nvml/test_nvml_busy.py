"""A real GPU that runs a process no server holds (one that outlived its server, or was never
gputap's) is not handed to the next user: the hub asks NVML before each start. The hub here
reads its GPUs through the fake libnvidia-ml.so.1 (tests/nvml/README.md)."""

import pytest

from tests.platform import Platform

BUSY = "GPU-11111111-2222-4333-8444-555555555555"
IDLE = "GPU-66666666-7777-4888-8999-aaaaaaaaaaaa"
H200 = {"kind": "card", "card": "H200-141GB"}


@pytest.fixture(scope="module")
def platform(tmp_path_factory, fake_nvml_dir):
    p = Platform(
        tmp_path_factory.mktemp("nvml-busy"),
        extra={"spawner": {"inventory": "nvml"}},
        env={
            "LD_LIBRARY_PATH": str(fake_nvml_dir),
            # GPU 0 runs one compute process (pid 4000, using 1 GiB) that no server holds
            "FAKE_NVML_DEVICES": f"NVIDIA H200|{BUSY}|143771|off; NVIDIA H200|{IDLE}|143771|off",
            "FAKE_NVML_USE": f"{BUSY}|40|1024|1",
        },
    )
    p.start()
    yield p
    p.shutdown()


def test_a_gpu_still_running_a_process_is_not_handed_out(platform):
    for name in ("gil", "hal"):
        platform.create_user(name)
    r = platform.spawn("gil", H200)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("gil")
    assert platform.server_env("gil")["CUDA_VISIBLE_DEVICES"] == IDLE

    r = platform.spawn("hal", H200)  # the other H200 still runs pid 4000
    assert r.status_code == 409, r.text
    assert "No H200-141GB free now (0 of 2 free)" in r.json()["message"], r.text
    assert f"device {BUSY} is free but runs processes 4000" in platform.log_tail(400)
    platform.stop_server("gil")
