"""A hub restart re-attaches running servers: they keep their devices and their billing."""

import os
import time

import pytest

from tests.integration.test_spawn_and_bill import wait_through_proxy
from tests.platform import Platform


@pytest.fixture(scope="module")
def hub_only(tmp_path_factory):
    """Billing runs outside the hub here, so restarting the hub leaves billing running."""
    p = Platform(tmp_path_factory.mktemp("hub-only"), external_billing=True)
    p.start()
    yield p
    p.shutdown()


def test_running_server_survives_hub_restart_with_its_device_and_billing(platform):
    platform.create_user("dave")
    platform.create_user("erin")
    token = platform.user_token("dave")
    r = platform.spawn("dave", {"kind": "card", "card": "A100-80GB"})
    assert r.status_code in (201, 202), r.text
    up = wait_through_proxy(platform, "dave", token)
    platform.wait_ready("dave")
    device = platform.server_env("dave")["CUDA_VISIBLE_DEVICES"]
    pid = platform.server("dave")["state"]["pid"]

    platform.stop_hub()
    os.kill(pid, 0)  # the server process outlives the hub
    time.sleep(2)
    platform.start()

    assert platform.server("dave")["ready"]
    wait_through_proxy(platform, "dave", token)  # routes are back in the new proxy
    assert platform.server_env("dave")["CUDA_VISIBLE_DEVICES"] == device
    # the only whole A100-80GB is still dave's
    r = platform.spawn("erin", {"kind": "card", "card": "A100-80GB"})
    assert r.status_code == 409, r.text
    assert "No A100-80GB free now (0 of 1 free)" in r.json()["message"]

    down = time.time()
    platform.stop_server("dave")
    [session] = platform.sessions("dave")
    assert session["state"] == "ended"
    assert abs(session["billed_seconds"] - (down - up)) <= 1  # one session across the restart

    r = platform.spawn("erin", {"kind": "card", "card": "A100-80GB"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("erin")
    assert platform.server_env("erin")["CUDA_VISIBLE_DEVICES"] == device
    platform.stop_server("erin")


def test_a_restart_of_the_hub_alone_leaves_the_billing_session_running(hub_only):
    platform = hub_only
    platform.create_user("ruth")
    token = platform.user_token("ruth")
    r = platform.spawn("ruth", {"kind": "card", "card": "T4"}, server_name="train")
    assert r.status_code in (201, 202), r.text
    up = wait_through_proxy(platform, "ruth", token, server_name="train")
    platform.wait_ready("ruth", server_name="train")
    [session] = platform.sessions("ruth")
    assert (session["server_name"], session["state"]) == ("train", "running")
    billing_pid = platform.billing_proc.pid

    platform.stop_hub()
    platform.start()

    assert platform.billing_proc.pid == billing_pid  # billing itself never stopped
    assert platform.server("ruth", "train")["ready"]
    wait_through_proxy(platform, "ruth", token, server_name="train")
    # the same session goes on: nothing stopped it, nothing opened another
    [running] = platform.sessions("ruth")
    assert (running["id"], running["state"]) == (session["id"], "running")

    down = time.time()
    platform.stop_server("ruth", "train")
    [ended] = platform.sessions("ruth")
    assert (ended["id"], ended["state"]) == (session["id"], "ended")
    assert abs(ended["billed_seconds"] - (down - up)) <= 1
