"""Billing down for minutes: no spawn starts (503 naming billing), running servers keep
running, and once billing is back their sessions are billed in full, to the second.

Billing runs here as an external service (``billing.managed: false``, started and killed by
the test): a managed one would be restarted by the hub within its poll interval, so it could
not stay down. The outage length is ``GPUTAP_TEST_BILLING_OUTAGE_SECONDS`` (default 300, the
acceptance case: this is the long test of ``make test``; ``-m "not long"`` skips it).
"""

import http.server
import os
import threading
import time

import pytest
import requests

from tests.integration.test_spawn_and_bill import wait_through_proxy
from tests.platform import Platform

OUTAGE_SECONDS = float(os.environ.get("GPUTAP_TEST_BILLING_OUTAGE_SECONDS", "300"))


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("outage"), external_billing=True)
    p.start()
    yield p
    p.shutdown()


def refused_for_billing(platform, name: str) -> None:
    r = platform.spawn(name, {"kind": "card", "card": "RTX-4090"})
    assert r.status_code == 503, f"{r.text}\n{platform.log_tail()}"
    assert r.json()["message"].startswith("Billing is unreachable, so no server can start now")
    assert platform.server(name) is None


@pytest.mark.long
@pytest.mark.parametrize("outage_seconds", [OUTAGE_SECONDS])
def test_billing_down_refuses_spawns_and_bills_running_servers_in_full(platform, outage_seconds):
    platform.create_user("otto")
    platform.create_user("nina")
    token = platform.user_token("otto")
    r = platform.spawn("otto", {"kind": "card", "card": "T4"})
    assert r.status_code in (201, 202), r.text
    up = wait_through_proxy(platform, "otto", token)
    platform.wait_ready("otto")

    platform.stop_billing()
    back_at = time.monotonic() + outage_seconds
    refused_for_billing(platform, "nina")
    r = requests.get(
        f"{platform.url}/hub/gputap/account",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    assert r.status_code == 503 and "Billing is unreachable" in r.json()["message"], r.text
    time.sleep(max(0.0, back_at - time.monotonic() - 5))
    refused_for_billing(platform, "nina")  # still refused at the end of the outage
    time.sleep(max(0.0, back_at - time.monotonic()))
    wait_through_proxy(platform, "otto", token, timeout=5)  # otto worked on throughout

    platform.start_billing()
    before = time.time()
    [running] = platform.sessions("otto")
    after = time.time()
    assert running["state"] == "running"  # the outage neither ended nor paused it
    assert before - up - 1 <= running["billed_seconds"] <= after - up + 1

    down = time.time()
    platform.stop_server("otto")
    [session] = platform.sessions("otto")
    assert session["state"] == "ended"
    assert abs(session["billed_seconds"] - (down - up)) <= 1
    assert session["billed_seconds"] >= outage_seconds  # the outage is billed too
    assert platform.account("otto")["balance_micro"] == 10_000_000 - session["cost_micro"]

    r = platform.spawn("nina", {"kind": "card", "card": "RTX-4090"})  # spawns work again
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("nina")
    platform.stop_server("nina")


class Stranger(http.server.BaseHTTPRequestHandler):
    """Whatever took billing's port once billing died: answers every request with a 404 page."""

    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<html><body>404: Not Found</body></html>")

    do_POST = do_PUT = do_DELETE = do_GET

    def log_message(self, *args) -> None:
        pass


def test_something_else_on_billings_port_is_billing_down_not_a_bare_500(platform):
    platform.create_user("sam")
    platform.stop_billing(hold_port=False)
    stranger = http.server.HTTPServer(("127.0.0.1", platform.billing_port), Stranger)
    serving = threading.Thread(target=stranger.serve_forever, daemon=True)
    serving.start()
    try:
        refused_for_billing(platform, "sam")
    finally:
        stranger.shutdown()
        stranger.server_close()
        platform.start_billing()
