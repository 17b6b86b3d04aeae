"""Running out of credit: billing stops the server within ``billing.max_overrun_seconds``,
the balance never goes below that many seconds of charges, and files stay; before that,
the hub tells the user how long their credit lasts.

A T4 costs 3.60/h here (1000 micro-credits a second) and the trial credit is 0.02: 20 s.
"""

import time
from pathlib import Path

import pytest
import requests

from tests.integration.test_spawn_and_bill import wait_through_proxy
from tests.platform import Platform

T4 = {"kind": "card", "card": "T4"}
PER_SECOND = 1000  # micro-credits
CREDIT_SECONDS = 20
OVERRUN_SECONDS = 3


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(
        tmp_path_factory.mktemp("running-out"),
        extra={
            "billing": {
                "prices": {"T4": "3.60"},
                "trial_credit": "0.02",
                "max_overrun_seconds": OVERRUN_SECONDS,
                "warning_minutes": [15, 5],
            }
        },
    )
    p.start()
    yield p
    p.shutdown()


def test_the_hub_shows_the_user_their_own_credit_warning(platform):
    platform.create_user("wendy")
    token = platform.user_token("wendy")
    url = f"{platform.url}/hub/gputap/account"
    r = platform.spawn("wendy", T4)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("wendy")
    r = requests.get(url, headers={"Authorization": f"token {token}"}, timeout=30)
    platform.stop_server("wendy")
    assert r.status_code == 200, r.text
    account = r.json()
    assert account["username"] == "wendy" and account["seconds_left"] <= CREDIT_SECONDS
    # at most 20 s left crosses both thresholds: the smaller one is reported
    [warning] = account["warnings"]
    assert warning["threshold_seconds"] == 300
    assert warning["seconds_left"] == account["seconds_left"]
    assert "3.60/h" in warning["message"]
    # nobody else's account, and nothing without logging in
    assert requests.get(url, timeout=10).status_code == 403
    assert platform.api.get(url, timeout=10).status_code == 403  # a service is no user


def test_running_out_of_credit_stops_the_server_within_the_overrun_and_keeps_files(platform):
    platform.create_user("spender")
    token = platform.user_token("spender")
    r = platform.spawn("spender", T4)
    assert r.status_code in (201, 202), r.text
    up = wait_through_proxy(platform, "spender", token)
    platform.wait_ready("spender")
    home = Path(platform.server_env("spender")["HOME"])
    (home / "results.csv").write_text("epoch,loss\n1,0.5\n")

    lowest = platform.account("spender")["balance_micro"]
    deadline = up + CREDIT_SECONDS + OVERRUN_SECONDS + 15
    while platform.server("spender") is not None:
        assert time.time() < deadline, f"still running:\n{platform.log_tail()}"
        lowest = min(lowest, platform.account("spender")["balance_micro"])
        time.sleep(0.5)

    [session] = platform.sessions("spender")
    assert session["state"] == "ended"
    # not stopped early (one enforcement interval of margin), nor later than the overrun
    assert CREDIT_SECONDS - 2 <= session["billed_seconds"] <= CREDIT_SECONDS + OVERRUN_SECONDS
    floor = -OVERRUN_SECONDS * PER_SECOND
    assert min(lowest, platform.account("spender")["balance_micro"]) >= floor
    assert (home / "results.csv").read_text() == "epoch,loss\n1,0.5\n"

    # the stop explains itself: in the hub's server view (Lab, the hub's home page) and on
    # the spawn form, and the server was told before it went (docs/lab.md)
    r = requests.get(
        f"{platform.url}/hub/gputap/api/users/spender/server",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    stop = r.json()["stop"]
    assert stop["kind"] == "credit"
    assert stop["message"].startswith("Your server was stopped at ")
    assert "your credit ran out" in stop["message"]
    assert stop["todo"].startswith("Add credit on the billing page, then start again")
    log = platform.log_path.read_text()
    assert "gputap spender: the hub says this server stops (credit)" in log
    form = platform.login("spender").get(f"{platform.url}/hub/spawn", timeout=30)
    assert "your credit ran out" in form.text
