"""Admission holds credit until the server starts: parallel spawns cannot overdraw, and a
start that fails gives the credit back at once.

Here a T4 costs 3.60/h (1000 micro-credits a second), the minimum billable period is 60 s,
and a new account's trial credit, 0.06, pays for exactly one period. Twenty simulated T4s
make sure every spawn gets as far as admission (none is refused for want of a card).
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from tests.platform import Platform

T4 = {"kind": "card", "card": "T4"}
SERVERS = [f"s{i}" for i in range(1, 21)]


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    root = tmp_path_factory.mktemp("holds")
    inventory = root / "twenty-t4.yaml"
    inventory.write_text(yaml.safe_dump({"node": "rack", "gpus": [{"card": "T4"}] * 20}))
    p = Platform(
        root,
        extra={
            "hub": {"named_server_limit_per_user": len(SERVERS)},
            "spawner": {"inventory": "file", "inventory_file": str(inventory)},
            "billing": {
                "prices": {"T4": "3.60"},
                "min_billable_seconds": 60,
                "trial_credit": "0.06",
            },
        },
    )
    p.start()
    yield p
    p.shutdown()


def outcome(platform, name: str, server_name: str, answer) -> str:
    """ "running", or the message the user got when the spawn failed (from the REST answer,
    or from spawn progress when the spawn was still going when the answer came)."""
    if answer.status_code == 201:
        return "running"
    if answer.status_code != 202:
        return f"{answer.status_code}: {answer.json()['message']}"
    messages: list[str] = []
    platform.follow_progress(name, messages, server_name=server_name).join(90)
    server = platform.server(name, server_name)
    return "running" if server and server["ready"] else messages[-1]


def test_a_start_that_fails_after_admission_frees_the_credit_at_once(platform):
    platform.create_user("fay")
    home = platform.root / "data" / "homes" / "fay"
    home.parent.mkdir(parents=True, exist_ok=True)
    home.write_text("a file where the home folder should be")  # the server cannot start
    r = platform.spawn("fay", T4)
    assert r.status_code == 500, r.text  # admitted, then the server process failed
    assert platform.server("fay") is None
    assert platform.billing("api/accounts/fay/holds").json()["holds"] == []
    home.unlink()
    # credit for one period, held by the failed start unless it was released
    r = platform.spawn("fay", T4)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("fay")
    platform.stop_server("fay")


def test_twenty_parallel_spawns_with_credit_for_one_run_exactly_one(platform):
    platform.create_user("pat")
    with ThreadPoolExecutor(len(SERVERS)) as pool:
        answers = list(pool.map(lambda s: platform.spawn("pat", T4, server_name=s), SERVERS))
    outcomes = {s: outcome(platform, "pat", s, a) for s, a in zip(SERVERS, answers, strict=True)}
    running = [s for s, result in outcomes.items() if result == "running"]
    assert len(running) == 1, outcomes
    [winner] = running
    refusals = [result for s, result in outcomes.items() if s != winner]
    assert len(refusals) == 19
    for refusal in refusals:
        assert refusal.startswith("402: Not enough credit for T4"), outcomes
    [session] = platform.sessions("pat")
    assert (session["server_name"], session["state"]) == (winner, "running")

    # the winner's hold became its session and the refused ones placed none: nothing is held
    r = platform.billing("api/accounts/pat/holds")
    assert r.ok and r.json()["holds"] == [], r.text
    platform.stop_server("pat", winner)
