"""A hub restart re-attaches running servers: they keep their devices and their billing."""

import os
import time

from tests.integration.test_spawn_and_bill import wait_through_proxy


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
