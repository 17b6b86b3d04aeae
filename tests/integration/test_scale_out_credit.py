"""Credit running out with a worker group (issue 17, docs/scale-out.md): billing counts the
whole group and stops the workers first, within ``billing.max_overrun_seconds``; the server
runs on while its own credit lasts. The balance never goes below the overrun's worth of the
group's charges.

Billing checks every second: a group runs short when what it has no longer pays one more
second of all it runs; it then stops the workers, and the server too only if what is left
would not pay one more second of the server alone (billing_service/domain/enforcement.py).
Here the server is a CPU server at 0.036/h (10 micro-credits a second) and each worker a
1g.10gb slice of an A100 at 3.60/h (the card 25.20/h, a seventh of it: 1000 a second); the
trial credit is 0.05: about 25 s of the group, then the server alone lasts minutes.
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest
import requests

from tests.platform import Platform

SLICE = {"kind": "slice", "card": "A100-80GB", "mig_profile": "1g.10gb"}
PER_SECOND = 1000  # micro-credits, one slice
SERVER_PER_SECOND = 10  # a CPU server
OVERRUN_SECONDS = 3


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(
        tmp_path_factory.mktemp("scale-out-credit"),
        extra={
            "billing": {
                "prices": {"A100-80GB": "25.20", "cpu": "0.036"},
                "trial_credit": "0.05",
                "max_overrun_seconds": OVERRUN_SECONDS,
            },
            "scale_out": {"idle_seconds": 0},
        },
    )
    p.start()
    yield p
    p.shutdown()


def parse(at: str) -> float:
    return datetime.fromisoformat(at).timestamp()


def test_running_out_with_a_group_stops_the_workers_first_within_the_overrun(platform):
    platform.create_user("grace")
    token = platform.user_token("grace")
    auth = {"Authorization": f"token {token}"}
    url = f"{platform.url}/hub/gputap/api/users/grace/server/workers"
    r = platform.spawn("grace", {"kind": "cpu"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("grace")
    r = requests.post(url, json={"count": 2, "options": SLICE}, headers=auth, timeout=30)
    assert r.status_code == 202, r.text

    def worker_sessions() -> list[dict]:
        found = [s for s in platform.sessions("grace") if s.get("worker")]
        return sorted(found, key=lambda s: s["worker"])

    lowest = platform.account("grace")["balance_micro"]
    deadline = time.monotonic() + 120
    while not (found := worker_sessions()) or any(s["state"] != "ended" for s in found):
        assert time.monotonic() < deadline, f"the workers still run:\n{platform.log_tail()}"
        lowest = min(lowest, platform.account("grace")["balance_micro"])
        time.sleep(0.3)
    time.sleep(3)  # three more checks: the server's own credit lasts, it runs on

    workers = worker_sessions()
    [server] = [s for s in platform.sessions("grace") if not s.get("worker")]
    assert [w["worker"] for w in workers] == ["w1", "w2"]
    assert {w["sku"] for w in workers} == {"A100-80GB/1g.10gb"}
    account = platform.account("grace")
    if server["state"] == "ended":
        # on a loaded machine the workers' stops can reach the hub late and use up what
        # would have kept the server: then, and only then, the server stops for credit too,
        # after its workers (a server stopped with a second of its own left is a bug)
        assert account["balance_micro"] < SERVER_PER_SECOND, (server, account)
        assert parse(server["ended_at"]) >= max(parse(w["ended_at"]) for w in workers)
    else:
        assert platform.server("grace") is not None
    # nobody ran on credit that was not there, beyond the overrun of the group
    group_rate = PER_SECOND * 2 + SERVER_PER_SECOND
    assert min(lowest, account["balance_micro"]) >= -OVERRUN_SECONDS * group_rate
    # and the workers ran until the credit was gone, not stopped early
    assert account["balance_micro"] <= group_rate * 2
    view = requests.get(url, headers=auth, timeout=30).json()
    assert [w["state"] for w in view["workers"]] == ["stopped", "stopped"]
    assert all("your credit ran out" in w["reason"] for w in view["workers"]), view

    # the hub's log says billing asked each worker to stop because the credit ran out
    log = platform.log_path.read_text()
    for name in ("w1", "w2"):
        [line] = [x for x in log.splitlines() if f"grace#{name}: stopping:" in x]
        assert "your credit ran out" in line, line
    if server["state"] != "ended":
        platform.stop_server("grace")
