"""The hub's server API (docs/lab.md): a server's facts and choices read with the server's own
token, changing its GPU (billed to the second on both sides of the change), refusals that
stop nothing, a failed start that goes back to the old card, and nobody else's server.

The simulated inventory: one A100-80GB cut into 1g.10gb x3 and 2g.20gb x2, one whole
A100-80GB, two RTX-4090 and one T4. Billing runs as an external service, so a test can take
it away.
"""

import math
import time
from datetime import datetime
from pathlib import Path

import pytest
import requests

from hub_config.hub import SERVER_TOKEN_SCOPES
from spawner.lifecycle.change import ANSWER_GRACE_SECONDS
from tests.integration.test_spawn_and_bill import wait_through_proxy
from tests.platform import Platform

SLICE = {"kind": "slice", "card": "A100-80GB", "profile": "1g.10gb"}
CARD = {"kind": "card", "card": "A100-80GB", "count": 1}
RTX = {"kind": "card", "card": "RTX-4090", "count": 1}


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("server-api"), external_billing=True)
    p.start()
    yield p
    p.shutdown()


def api(platform, token: str | None, path: str, method: str = "GET", body=None):
    headers = {"Authorization": f"token {token}"} if token else {}
    return requests.request(
        method, f"{platform.url}/hub/gputap/api/{path}", headers=headers, json=body, timeout=30
    )


def started(platform, name: str, options: dict) -> str:
    """Start the user's server and return its own token ($JUPYTERHUB_API_TOKEN)."""
    platform.create_user(name)
    r = platform.spawn(name, options)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready(name)
    return platform.server_env(name)["JUPYTERHUB_API_TOKEN"]


def wait_change(platform, token: str, name: str, timeout: float = 90) -> dict:
    """The change's status once it has finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = api(platform, token, f"users/{name}/server/change")
        assert r.status_code == 200, r.text
        change = r.json()
        if change["finished_at"]:
            return change
        time.sleep(0.2)
    raise AssertionError(f"{name}'s change did not finish:\n{platform.log_tail()}")


def pid(platform, name: str) -> int:
    return platform.server(name)["state"]["pid"]


def wait_new_server(platform, name: str, old_pid: int, timeout: float = 90) -> None:
    """Wait until the user's server runs again as a new process (after a change: the old
    one stops a moment after the change is accepted, ANSWER_GRACE_SECONDS)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        server = platform.server(name)
        if server and server.get("ready") and server["state"].get("pid") != old_pid:
            return
        time.sleep(0.2)
    raise AssertionError(f"{name}'s server did not come back:\n{platform.log_tail()}")


def test_facts_and_choices_with_the_servers_own_token(platform):
    token = started(platform, "alice", SLICE)
    me = requests.get(
        f"{platform.url}/hub/api/user", headers={"Authorization": f"token {token}"}, timeout=10
    ).json()
    for scope in ("read:servers!server=alice/", "servers!server=alice/"):
        assert scope in me["scopes"]
    assert "custom:gputap:disks!user=alice" in me["scopes"]

    r = api(platform, token, "users/alice/server")
    assert r.status_code == 200, r.text
    facts = r.json()
    [running] = platform.sessions("alice")
    assert {k: facts[k] for k in ("user", "server", "running", "pending", "offering")} == {
        "user": "alice",
        "server": "",
        "running": True,
        "pending": None,
        "offering": "A100-80GB/1g.10gb",
    }
    assert facts["label"] == "A100-80GB 1g.10gb slice" and facts["count"] == 1
    assert facts["simulated"] is True and facts["course"] == "" and facts["disks"] == []
    assert facts["session"]["id"] == running["id"] and facts["session"]["state"] == "running"
    assert facts["account"]["username"] == "alice" and facts["change"] is None

    r = api(platform, token, "users/alice/server/choices")
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["current"] == "A100-80GB/1g.10gb"
    assert answer["currency"] == "credits" and answer["simulated"] is True
    by_key = {c["key"]: c for c in answer["choices"]}
    own = by_key["A100-80GB/1g.10gb"]
    assert (own["free"], own["total"]) == (3, 3)  # the slice alice holds counts as free
    assert own["options"] == {"kind": "slice", "card": "A100-80GB", "mig_profile": "1g.10gb"}
    assert own["price_per_hour"] == "1.142857" and own["course"] is None
    assert by_key["RTX-4090"]["options"] == RTX and by_key["RTX-4090"]["max_count"] == 2
    assert answer["choices"][-1]["options"] == {"kind": "cpu"}
    prices = [c["price_per_hour_micro"] for c in answer["choices"][:-1]]
    assert prices == sorted(prices)  # cheapest first

    # a token with exactly the server token's scopes, made through the REST API
    scopes = [s + "=alice/" if s.endswith("!server") else s for s in SERVER_TOKEN_SCOPES]
    r = platform.post("/users/alice/tokens", {"scopes": scopes, "expires_in": 600})
    assert r.status_code == 201, r.text
    made = r.json()["token"]
    assert api(platform, made, "users/alice/server").json()["offering"] == "A100-80GB/1g.10gb"
    assert api(platform, made, "users/alice/server/choices").status_code == 200
    r = api(platform, made, "users/alice/server/change", "POST", {"options": {"kind": "gpu"}})
    assert r.status_code == 400 and "kind must be one of" in r.json()["message"]
    platform.stop_server("alice")


def test_change_a_slice_to_a_whole_card_bills_both_sessions_to_the_second(platform):
    token = started(platform, "carol", SLICE)
    wait_through_proxy(platform, "carol", token)
    home = Path(platform.server_env("carol")["HOME"])
    (home / "model.pt").write_text("weights")
    time.sleep(2)

    old_pid = pid(platform, "carol")
    asked = time.time()
    r = api(platform, token, "users/carol/server/change", "POST", {"options": CARD})
    answered = time.time()
    assert r.status_code == 202, r.text
    change = r.json()
    assert (change["state"], change["from"], change["to"]) == (
        "stopping",
        "A100-80GB/1g.10gb",
        "A100-80GB",
    )
    assert change["finished_at"] is None

    # the server's own token died with the old server: the new one has its own
    wait_new_server(platform, "carol", old_pid)
    token = platform.server_env("carol")["JUPYTERHUB_API_TOKEN"]
    change = wait_change(platform, token, "carol")
    assert change["state"] == "done", change
    assert change["message"] == "Now running on A100-80GB."
    facts = api(platform, token, "users/carol/server").json()
    assert facts["offering"] == "A100-80GB" and facts["running"] is True
    assert facts["change"]["state"] == "done"
    assert platform.server_env("carol")["CUDA_VISIBLE_DEVICES"].startswith("GPU-")
    assert (home / "model.pt").read_text() == "weights"  # same home, files kept

    old, new = sorted(platform.sessions("carol"), key=lambda s: s["started_at"])
    assert (old["sku"], old["state"], new["sku"], new["state"]) == (
        "A100-80GB/1g.10gb",
        "ended",
        "A100-80GB",
        "running",
    )
    assert facts["session"]["id"] == new["id"]
    ended = datetime.fromisoformat(old["ended_at"]).timestamp()
    began = datetime.fromisoformat(old["started_at"]).timestamp()
    # billing ends when the stop is asked for, a moment after the change was accepted
    assert asked - 0.5 <= ended <= answered + ANSWER_GRACE_SECONDS + 2
    assert old["billed_seconds"] == math.floor(ended - began)
    assert old["cost_micro"] == old["price_per_hour_micro"] * old["billed_seconds"] // 3600
    assert datetime.fromisoformat(new["started_at"]).timestamp() >= ended
    assert platform.ledger_problems() == []

    log = platform.log_path.read_text()
    for state in ("stopping", "starting", "done"):
        assert f"carol: change A100-80GB/1g.10gb -> A100-80GB: {state}:" in log
    platform.stop_server("carol")


def test_sold_out_is_refused_and_stops_nothing_or_waits_in_the_queue(platform):
    token = started(platform, "dave", SLICE)
    started(platform, "erin", CARD)  # the only whole A100-80GB
    before = pid(platform, "dave")

    r = api(platform, token, "users/dave/server/change", "POST", {"options": CARD})
    assert r.status_code == 409, r.text
    answer = r.json()
    assert answer["message"].startswith("No A100-80GB free now (0 of 1 free). Free now:")
    assert "Your server was not stopped." in answer["message"]
    assert answer["alternatives"] and all("options" in a for a in answer["alternatives"])
    assert pid(platform, "dave") == before and platform.server("dave")["ready"]
    assert [s["state"] for s in platform.sessions("dave")] == ["running"]
    assert api(platform, token, "users/dave/server/change").status_code == 404  # none asked

    # with the queue: stopped, waits for the card holding nothing, starts when it frees up
    r = api(platform, token, "users/dave/server/change", "POST", {"options": CARD, "queue": True})
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 30
    while True:
        change = api(platform, platform.ops_token, "users/dave/server/change").json()
        if change["state"] == "waiting":
            break
        assert time.monotonic() < deadline, change
        time.sleep(0.2)
    assert change["message"] == "waiting for a free A100-80GB: 1st in queue"
    assert [s["state"] for s in platform.sessions("dave")] == ["ended"]  # nothing while waiting
    platform.stop_server("erin")
    platform.wait_ready("dave")
    change = wait_change(platform, platform.ops_token, "dave")
    assert change["state"] == "done" and change["to"] == "A100-80GB", change
    platform.stop_server("dave")


def test_a_change_the_course_will_refuse_is_refused_before_anything_stops(platform):
    """The course's rules are asked before the stop: a change to an option the course does
    not pay for, or with a course the student does not take, stops nothing."""
    r = platform.billing(
        "api/courses",
        "POST",
        {"name": "Slices only", "allowed": ["A100-80GB/1g.10gb"], "weekly_hours": 6},
    )
    assert r.status_code == 201, r.text
    slug = r.json()["slug"]
    platform.create_user("fay")
    r = platform.billing(f"api/courses/{slug}/students", "POST", {"username": "fay"})
    assert r.status_code in (200, 201), r.text
    token = started(platform, "fay", {**SLICE, "course": slug})
    before = pid(platform, "fay")

    r = api(
        platform, token, "users/fay/server/change", "POST", {"options": {**RTX, "course": slug}}
    )
    assert r.status_code == 409, r.text
    message = r.json()["message"]
    assert "Slices only pays for A100-80GB/1g.10gb only, not RTX-4090" in message, message
    assert message.endswith("Your server was not stopped."), message
    r = api(
        platform,
        token,
        "users/fay/server/change",
        "POST",
        {"options": {**RTX, "course": "secret-ml"}},
    )
    assert r.status_code == 409, r.text
    assert "You take no active course 'secret-ml'" in r.json()["message"]
    assert pid(platform, "fay") == before and platform.server("fay")["ready"]
    assert [s["state"] for s in platform.sessions("fay")] == ["running"]
    assert api(platform, token, "users/fay/server/change").status_code == 404  # none started
    platform.stop_server("fay")


@pytest.mark.parametrize(
    "body,message",
    [
        ({"options": {"kind": "card", "card": "B300"}}, "unknown card 'B300'"),
        ({"options": {"kind": "card", "card": "RTX-4090", "count": 3}}, "at most 2"),
        ({"options": {"kind": "card", "card": "T4", "spot": True}}, "Kubernetes"),
        ({"options": RTX, "force": True}, "Unknown field(s) 'force'"),
        ({"queue": True}, "options must be an object"),
        ({"options": RTX, "queue": "yes"}, "queue must be true or false"),
        ([RTX], "The body must be a JSON object"),
    ],
)
def test_bad_changes_are_refused_with_what_is_wrong(platform, body, message):
    if platform.server("frank") is None:
        started(platform, "frank", SLICE)
    before = pid(platform, "frank")
    r = api(platform, platform.user_token("frank"), "users/frank/server/change", "POST", body)
    assert r.status_code == 400, r.text
    assert message in r.json()["message"]
    assert pid(platform, "frank") == before and platform.server("frank")["ready"]


def test_a_named_server_and_the_change_of_a_stopped_one(platform):
    platform.create_user("fay")
    r = platform.spawn("fay", {"kind": "cpu"}, server_name="nb")
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("fay", server_name="nb")
    token = platform.server_env("fay", "nb")["JUPYTERHUB_API_TOKEN"]
    facts = api(platform, token, "users/fay/servers/nb").json()
    assert (facts["server"], facts["offering"], facts["running"]) == ("nb", "cpu", True)
    # the named server's token is for that server only
    assert api(platform, token, "users/fay/server").status_code == 404

    user_token = platform.user_token("fay")
    platform.stop_server("fay", "nb")
    r = api(platform, user_token, "users/fay/servers/nb/change", "POST", {"options": RTX})
    assert r.status_code == 409, r.text
    assert r.json()["message"] == (
        "fay/nb is not running; start it with the options you want instead"
    )
    assert platform.server("fay", "nb") is None
    assert api(platform, user_token, "users/fay/servers/nb").json()["running"] is False


def test_nobody_sees_or_changes_another_users_server(platform):
    started(platform, "gail", SLICE)
    server_token_of_hank = started(platform, "hank", {"kind": "cpu"})
    before = pid(platform, "gail")

    for token in (platform.user_token("hank"), server_token_of_hank):
        for method, path, body in [
            ("GET", "users/gail/server", None),
            ("GET", "users/gail/server/choices", None),
            ("GET", "users/gail/server/change", None),
            ("POST", "users/gail/server/change", {"options": RTX}),
            ("POST", "users/gail/server/change", {"options": {"kind": "nonsense"}}),
        ]:
            r = api(platform, token, path, method, body)
            assert r.status_code == 404, (path, r.text)
            assert r.json()["message"] == "No server gail: it does not exist or is not yours"
    # exactly what a server that does not exist answers
    r = api(platform, platform.ops_token, "users/ghost/server")
    assert r.json()["message"] == "No server ghost: it does not exist or is not yours"
    r = api(platform, platform.user_token("gail"), "users/gail/servers/other")
    assert r.status_code == 404
    assert r.json()["message"] == "No server gail/other: it does not exist or is not yours"
    assert api(platform, None, "users/gail/server").status_code == 403  # no credentials
    assert pid(platform, "gail") == before and platform.server("gail")["ready"]

    # operators holding admin:servers (here the ops service) may read and change any server
    r = api(platform, platform.ops_token, "users/gail/server")
    assert r.status_code == 200 and r.json()["user"] == "gail"
    r = api(platform, platform.ops_token, "users/gail/server/change", "POST", {"options": {}})
    assert r.status_code == 202, r.text
    assert wait_change(platform, platform.ops_token, "gail")["to"] == "cpu"
    for name in ("gail", "hank"):
        platform.stop_server(name)


def test_a_new_start_that_fails_goes_back_to_the_old_card(platform):
    token = started(platform, "ivy", SLICE)
    started(platform, "jack", RTX)  # one RTX-4090 left
    r = api(platform, token, "users/ivy/server/change", "POST", {"options": RTX})
    assert r.status_code == 202, r.text
    # while ivy's server stops, someone else takes the last RTX-4090
    platform.create_user("kate")
    r = platform.spawn("kate", RTX)
    assert r.status_code in (201, 202), r.text

    platform.wait_ready("kate")
    change = wait_change(platform, platform.ops_token, "ivy")
    assert change["state"] == "reverted", change
    assert change["message"].startswith(
        "The RTX-4090 server did not start (No RTX-4090 free now (0 of 2 free)."
    )
    assert change["message"].endswith("you are back on the A100-80GB 1g.10gb slice server.")
    platform.wait_ready("ivy")
    assert platform.server_env("ivy")["GPUTAP_OFFERING"] == "A100-80GB/1g.10gb"
    sessions = sorted(platform.sessions("ivy"), key=lambda s: s["started_at"])
    assert [(s["sku"], s["state"]) for s in sessions] == [
        ("A100-80GB/1g.10gb", "ended"),
        ("A100-80GB/1g.10gb", "running"),
    ]
    assert platform.account("ivy")["held_micro"] == 0  # the failed start's hold is released
    assert platform.ledger_problems() == []
    for name in ("ivy", "jack", "kate"):
        platform.stop_server(name)


def test_billing_down_answers_503_and_stops_nothing(platform):
    token = started(platform, "lena", SLICE)
    before = pid(platform, "lena")
    platform.stop_billing()
    try:
        r = api(platform, token, "users/lena/server")
        assert r.status_code == 503, r.text
        assert r.json()["message"].startswith("Billing is unreachable, so this server's cost")
        r = api(platform, token, "users/lena/server/change", "POST", {"options": RTX})
        assert r.status_code == 503, r.text
        assert "yours was not stopped" in r.json()["message"]
        assert pid(platform, "lena") == before and platform.server("lena")["ready"]
    finally:
        platform.start_billing()
    platform.stop_server("lena")
