"""Spawns that cannot happen say why, change nothing, and never share a device."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests


@pytest.mark.parametrize(
    "options,message",
    [
        ({"kind": "card", "card": "B300"}, "unknown card 'B300'"),
        ({"kind": "card", "card": "RTX-4090", "count": 0}, "count must be at least 1"),
        ({"kind": "card", "card": "RTX-4090", "count": -1}, "count must be at least 1"),
        ({"kind": "card", "card": "RTX-4090", "count": 3}, "at most 2"),
        ({"kind": "card", "card": "RTX-4090", "count": "many"}, "whole number"),
        ({"kind": "slice", "card": "A100-80GB", "profile": "9g.99gb"}, "no MIG profile"),
        ({"kind": "card", "card": "H100-80GB"}, "this platform has no H100-80GB"),
        ({"kind": "spec", "min_memory_gb": "lots"}, "must be a number"),
        ({"kind": "gpu"}, "kind must be one of"),
    ],
)
def test_bad_options_get_a_400_that_says_what_is_wrong(platform, options, message):
    platform.create_user("mallory")
    r = platform.spawn("mallory", options)
    assert r.status_code == 400, r.text
    assert message in r.json()["message"]
    assert platform.server("mallory") is None


def test_concurrent_spawns_never_share_a_device_and_the_loser_hears_why(platform):
    names = ["u1", "u2", "u3"]
    for name in names:
        platform.create_user(name)
    with ThreadPoolExecutor(3) as pool:
        answers = list(
            pool.map(lambda n: platform.spawn(n, {"kind": "card", "card": "RTX-4090"}), names)
        )
    codes = sorted(r.status_code for r in answers)
    assert codes[:2] in ([201, 201], [201, 202], [202, 202]) and codes[2] == 409, codes
    refused = next(r for r in answers if r.status_code == 409)
    message = refused.json()["message"]
    assert message.startswith("No RTX-4090 free now (0 of 2 free). Free now:"), message
    started = [n for n, r in zip(names, answers, strict=True) if r.status_code != 409]
    devices = []
    for name in started:
        platform.wait_ready(name)
        devices.append(platform.server_env(name)["CUDA_VISIBLE_DEVICES"])
    assert len(set(devices)) == 2 and all(d.startswith("GPU-") for d in devices)

    # stopping one frees its card for the user who was refused
    loser = next(n for n in names if n not in started)
    platform.stop_server(started[0])
    r = platform.spawn(loser, {"kind": "card", "card": "RTX-4090"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready(loser)
    assert platform.server_env(loser)["CUDA_VISIBLE_DEVICES"] == devices[0]
    for name in (started[1], loser):
        platform.stop_server(name)


def test_no_credit_is_refused_with_the_numbers(platform):
    platform.create_user("broke")
    token = platform.user_token("broke")
    me = requests.get(
        f"{platform.url}/services/billing/api/me",
        headers={"Authorization": f"token {token}"},
        timeout=10,
    )
    assert me.status_code == 200, me.text
    platform.adjust("broke", "-9.999")
    r = platform.spawn("broke", {"kind": "card", "card": "A100-80GB"})
    assert r.status_code == 402, r.text
    assert "Not enough credit for A100-80GB" in r.json()["message"]
    assert platform.server("broke") is None
    assert platform.account("broke")["balance_micro"] == 1_000  # nothing was charged
    # a cheaper option the credit does cover still starts
    assert platform.sessions("broke") == []


def test_a_refused_new_named_server_is_not_left_behind_against_the_limit(platform):
    """JupyterHub makes a named server before its start is asked; a refused first start
    left it there, empty, counting against named_server_limit_per_user (5 here)."""
    platform.create_user("nemo")
    for i in range(5):
        r = platform.spawn("nemo", {"kind": "card", "card": "H100-80GB"}, server_name=f"try{i}")
        assert r.status_code == 400, r.text
    listed = "/users/nemo?include_stopped_servers=1"
    platform.wait_for(
        lambda: not [n for n in platform.get(listed).json()["servers"] if n.startswith("try")],
        "the refused servers gone",
        10,
    )
    r = platform.spawn("nemo", {"kind": "cpu"}, server_name="works")
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("nemo", server_name="works")
    platform.stop_server("nemo", server_name="works")
    # a named server that ran is kept when a later start is refused
    r = platform.spawn("nemo", {"kind": "card", "card": "H100-80GB"}, server_name="works")
    assert r.status_code == 400, r.text
    time.sleep(1)
    assert "works" in platform.get(listed).json()["servers"]
