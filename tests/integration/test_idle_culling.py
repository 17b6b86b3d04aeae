"""GPU-aware idle culling: jupyterhub-idle-culler (a hub service) stops a server whose user
and GPU are both idle, and keeps one whose GPU is busy though nobody types (docs/lab.md)."""

import json
import re
import time

import pytest
import requests

from tests.platform import ROOT, Platform

TIMEOUT, CULL_EVERY = 12, 3


@pytest.fixture
def platform(tmp_path):
    config = tmp_path / "jupyter-config"
    config.mkdir()
    # the injected NVML reader: the real server extension, with GPU numbers from a test file
    (config / "jupyter_server_config.json").write_text(
        json.dumps(
            {
                "GPUTapLab": {
                    "gpu_reader_class": "tests.lab.fake_gpu.SwitchedByHomeFile",
                    "simulated": False,
                    "sample_interval_seconds": 1,
                }
            }
        )
    )
    p = Platform(
        tmp_path,
        extra={
            "idle": {
                "timeout_seconds": TIMEOUT,
                "cull_every_seconds": CULL_EVERY,
                "activity_interval_seconds": 2,
            },
            "spawner": {
                "start_timeout": 60,
                "environment": {"PYTHONPATH": str(ROOT), "JUPYTER_CONFIG_PATH": str(config)},
            },
        },
    )
    p.start()
    yield p
    p.shutdown()


def test_idle_server_is_stopped_and_a_gpu_busy_one_is_kept(platform):
    slice_ = {"kind": "slice", "card": "A100-80GB", "profile": "1g.10gb"}
    for name in ("trainer", "idler"):
        platform.create_user(name)
    # the trainer's GPU is busy from the start; nobody uses either server otherwise
    home = platform.root / "data" / "homes" / "trainer"
    home.mkdir(parents=True, exist_ok=True)
    (home / ".fake-gpu-busy").write_text("training")
    started = time.monotonic()
    for name in ("trainer", "idler"):
        assert platform.spawn(name, slice_).status_code in (201, 202)
    for name in ("trainer", "idler"):
        platform.wait_ready(name)

    platform.wait_stopped("idler", timeout=TIMEOUT + 4 * CULL_EVERY + 30)
    # well past the timeout and several culls later, the busy one still runs
    while time.monotonic() - started < TIMEOUT + 3 * CULL_EVERY:
        time.sleep(1)
    assert platform.server("trainer") is not None, platform.log_tail()
    sessions = {s["username"]: s for name in ("trainer", "idler") for s in platform.sessions(name)}
    assert sessions["idler"]["state"] == "ended"
    assert sessions["trainer"]["state"] == "running"
    assert "idle-culler" in platform.log_path.read_text()
    # the stop explains itself (docs/lab.md): idle, for how long, and what to do
    token = platform.user_token("idler")
    r = requests.get(
        f"{platform.url}/hub/gputap/api/users/idler/server",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    stop = r.json()["stop"]
    assert stop["kind"] == "idle", stop
    assert re.fullmatch(
        r"Your server was stopped at \d\d:\d\d UTC after \d+ (seconds|minutes?) without activity"
        r" \(no typing, running kernel or GPU work\)\.",
        stop["message"],
    ), stop["message"]
    assert "gputap idler: the hub says this server stops (idle)" in platform.log_path.read_text()

    # once the GPU is idle too, the trainer's server is stopped as well (files kept)
    (home / ".fake-gpu-busy").unlink()
    (home / "model.ckpt").write_text("weights")
    platform.wait_stopped("trainer", timeout=TIMEOUT + 4 * CULL_EVERY + 30)
    assert (home / "model.ckpt").read_text() == "weights"
    assert platform.ledger_problems() == []
