"""Login → spawn → reach the server through the proxy → stop → billed exactly its running time."""

import time
from pathlib import Path

import requests

from spawner.core.catalog import Catalog
from spawner.local.inventory import file_devices
from spawner.local.spawner import DEFAULT_INVENTORY_FILE

DEVICES = file_devices(DEFAULT_INVENTORY_FILE, Catalog.load())
SLICES = {d.uuid for d in DEVICES if d.key == "A100-80GB/1g.10gb"}


def wait_through_proxy(platform, name, token, timeout=60, server_name=""):
    """When the user's server first answers through the proxy (time.time())."""
    deadline = time.monotonic() + timeout
    url = f"{platform.url}/user/{name}/{server_name + '/' if server_name else ''}api/status"
    while time.monotonic() < deadline:
        try:
            r = requests.get(url, headers={"Authorization": f"token {token}"}, timeout=2)
            if r.status_code == 200:
                return time.time()
        except requests.RequestException:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} never answered:\n{platform.log_tail()}")


def test_slice_server_runs_with_its_device_and_is_billed_per_second(platform):
    platform.create_user("alice")
    token = platform.user_token("alice")
    r = platform.spawn("alice", {"kind": "slice", "card": "A100-80GB", "profile": "1g.10gb"})
    assert r.status_code in (201, 202), r.text
    up = wait_through_proxy(platform, "alice", token)
    platform.wait_ready("alice")

    lab = requests.get(
        f"{platform.url}/user/alice/lab", headers={"Authorization": f"token {token}"}, timeout=30
    )
    assert '"news": {"disabled": true}' in lab.text  # no calls to the internet from Lab

    env = platform.server_env("alice")
    assert env["CUDA_VISIBLE_DEVICES"] in SLICES
    assert env["GPUTAP_OFFERING"] == "A100-80GB/1g.10gb"
    assert env["GPUTAP_SIMULATED"] == "1"
    home = Path(env["HOME"])
    (home / "notes.txt").write_text("keep me")

    before = platform.account("alice")  # opened with trial credit at admission
    assert before["balance_micro"] == 10_000_000
    assert [s["sku"] for s in before["running"]] == ["A100-80GB/1g.10gb"]

    time.sleep(4)
    down = time.time()  # billing ends when the stop is asked for
    platform.stop_server("alice")

    [session] = platform.sessions("alice")
    assert session["state"] == "ended"
    assert abs(session["billed_seconds"] - (down - up)) <= 1
    after = platform.account("alice")
    assert after["balance_micro"] == before["balance_micro"] - session["cost_micro"]
    assert session["cost_micro"] == (
        session["price_per_hour_micro"] * session["count"] * session["billed_seconds"] // 3600
    )
    assert (home / "notes.txt").read_text() == "keep me"  # files outlive the server
