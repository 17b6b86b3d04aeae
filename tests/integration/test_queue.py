"""Sold out: wait in line, first come first served, and start when someone stops."""

import time

import requests


def test_waiting_in_line_for_a_sold_out_card(platform):
    for name in ("holder", "first", "second", "rude"):
        platform.create_user(name)
    r = platform.spawn("holder", {"kind": "card", "card": "A100-80GB"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("holder")

    r = platform.spawn("first", {"kind": "card", "card": "A100-80GB", "queue": True})
    assert r.status_code == 202, r.text  # pending: waiting in line, nothing is charged
    messages: list[str] = []
    watcher = platform.follow_progress("first", messages)
    deadline = time.monotonic() + 20
    while "waiting for a free A100-80GB: 1st in queue" not in messages:
        assert time.monotonic() < deadline, messages
        time.sleep(0.2)

    r = platform.spawn("second", {"kind": "card", "card": "A100-80GB", "queue": True})
    assert r.status_code == 202, r.text
    # someone who does not wait cannot jump the line
    r = platform.spawn("rude", {"kind": "card", "card": "A100-80GB"})
    assert r.status_code == 409, r.text
    assert "2 waiting before you" in r.json()["message"]
    assert [s["state"] for s in platform.sessions("first")] == []  # free while waiting

    platform.stop_server("holder")
    platform.wait_ready("first", timeout=60)
    watcher.join(60)
    assert any(m.startswith("matched A100-80GB on") for m in messages), messages
    assert platform.server("second")["ready"] is False  # still waiting, now 1st
    platform.stop_server("first")
    platform.wait_ready("second", timeout=60)
    platform.stop_server("second")


def test_spot_needs_kubernetes(platform):
    platform.create_user("spotty")
    r = platform.spawn("spotty", {"kind": "card", "card": "T4", "spot": True})
    assert r.status_code == 400 and "spot" in r.json()["message"]
    r = platform.spawn("spotty", {"kind": "card", "card": "T4", "queue": "perhaps"})
    assert r.status_code == 400 and "queue must be true or false" in r.json()["message"]
    assert requests.get(f"{platform.url}/hub/health", timeout=5).ok
