"""Billing closes sessions whose server the hub no longer runs, and only those."""

import secrets
import time
import uuid
from datetime import UTC, datetime

import pytest
import requests

from tests.billing.hub import HUB_SCOPES
from tests.platform import Platform


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    hub_token = secrets.token_hex(16)
    p = Platform(
        tmp_path_factory.mktemp("reconcile"),
        extra={"billing": {"reconcile_interval_seconds": 1}},
        services=[{"name": "hubsim", "api_token": hub_token, "scopes": HUB_SCOPES}],
    )
    p.hub_token = hub_token
    p.start()
    yield p
    p.shutdown()


def test_a_session_without_a_server_is_closed_and_a_running_one_kept(platform):
    platform.create_user("ghost")
    platform.create_user("kept")
    r = platform.spawn("kept", {"kind": "card", "card": "T4"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("kept")
    # a session the hub knows nothing about (its settle call was lost)
    sid = str(uuid.uuid4())
    r = requests.post(
        f"{platform.url}/services/billing/api/sessions",
        headers={"Authorization": f"token {platform.hub_token}"},
        json={
            "id": sid,
            "username": "ghost",
            "server_name": "",
            "sku": "T4",
            "count": 1,
            "started_at": datetime.now(UTC).isoformat(),
        },
        timeout=10,
    )
    assert r.status_code == 201, r.text
    deadline = time.monotonic() + 15
    while platform.sessions("ghost")[0]["state"] != "ended":
        assert time.monotonic() < deadline, platform.log_tail()
        time.sleep(0.5)
    [ghost] = platform.sessions("ghost")
    assert ghost["billed_seconds"] == 0 and ghost["cost_micro"] == 0  # never seen running
    assert [s["state"] for s in platform.sessions("kept")] == ["running"]
    platform.stop_server("kept")
    assert [s["state"] for s in platform.sessions("kept")] == ["ended"]
