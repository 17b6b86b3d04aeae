"""A stop explains itself (docs/lab.md, "Why a server stopped"): whoever stops a server through
gputap's stop endpoint is recorded as the reason (the user, an admin, billing, the idle
culler, a change), a stop through JupyterHub's own DELETE reads "from the hub", a server that
exits by itself says so and is billed until it was last seen alive; the running server is
told why before it goes, and the hub's server view and spawn form show the reason.

Credit and idle stops are tested where those stops happen: test_running_out.py and
test_idle_culling.py.
"""

import os
import signal
import time
from datetime import datetime

import pytest
import requests

from spawner.lifecycle.change import ANSWER_GRACE_SECONDS
from tests.platform import Platform

CPU = {"kind": "cpu"}
SLICE = {"kind": "slice", "card": "A100-80GB", "profile": "1g.10gb"}


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(tmp_path_factory.mktemp("stop-reasons"), extra={"hub": {"admin_users": ["root"]}})
    p.start()
    yield p
    p.shutdown()


def gputap(platform, token: str, path: str, method: str = "GET", body=None) -> requests.Response:
    headers = {"Authorization": f"token {token}"}
    url = f"{platform.url}/hub/gputap/api/{path}"
    return requests.request(method, url, headers=headers, json=body, timeout=60)


def started(platform, name: str, options: dict = CPU) -> str:
    """Start the user's server; the user's own token."""
    platform.create_user(name)
    token = platform.user_token(name)
    r = platform.spawn(name, options)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready(name)
    return token


def polled_alive(platform, name: str) -> None:
    """Have the hub poll the user's running server now: JupyterHub polls a ready server before
    it refuses to start it again (rather than waiting for its next periodic poll)."""
    r = platform.spawn(name, CPU)
    assert r.status_code == 400 and "is already running" in r.json()["message"], r.text


def stop_view(platform, token: str, name: str) -> dict:
    r = gputap(platform, token, f"users/{name}/server")
    assert r.status_code == 200, r.text
    assert r.json()["running"] is False
    return r.json()["stop"]


def told(platform, name: str, kind: str) -> bool:
    """Whether the user's server extension logged that the hub told it why it stops."""
    line = f"gputap {name}: the hub says this server stops ({kind})"
    return line in platform.log_path.read_text()


def test_the_user_stops_their_own_server_and_it_says_so(platform):
    token = started(platform, "ursula")
    r = gputap(platform, token, "users/ursula/server/stop", "POST")
    assert r.status_code in (202, 204), r.text
    platform.wait_stopped("ursula")
    stop = stop_view(platform, token, "ursula")
    assert stop["kind"] == "user"
    assert stop["message"].startswith("You stopped this server at ")
    assert "Start it again from the hub's home page" in stop["todo"]
    assert stop["notice"] == f"{stop['message']} {stop['todo']}"
    assert told(platform, "ursula", "user"), platform.log_tail()
    # the spawn form tells it too
    form = platform.login("ursula").get(f"{platform.url}/hub/spawn", timeout=30)
    assert "You stopped this server at" in form.text
    # stopping a stopped server: JupyterHub's answer to the same DELETE
    again = gputap(platform, token, "users/ursula/server/stop", "POST")
    assert again.status_code in (204, 400), again.text


def test_an_admin_stop_names_the_admin(platform):
    started(platform, "ada")
    platform.create_user("root")
    root = platform.user_token("root")
    r = gputap(platform, root, "users/ada/server/stop", "POST")
    assert r.status_code in (202, 204), r.text
    platform.wait_stopped("ada")
    stop = stop_view(platform, platform.user_token("ada"), "ada")
    assert stop["kind"] == "admin"
    assert stop["message"].startswith("An admin (root) stopped your server at ")
    assert told(platform, "ada", "admin"), platform.log_tail()


def test_nobody_else_stops_a_server_and_bad_bodies_are_refused(platform):
    token = started(platform, "victor")
    platform.create_user("mallory")
    other = platform.user_token("mallory")
    r = gputap(platform, other, "users/victor/server/stop", "POST")
    assert r.status_code == 404, r.text
    assert r.json()["message"] == "No server victor: it does not exist or is not yours"
    r = gputap(platform, token, "users/victor/server/stop", "POST", {"why": "x" * 5000})
    assert r.status_code == 400, r.text
    assert "takes no body" in r.json()["message"] and "x" * 100 not in r.text
    r = requests.post(f"{platform.url}/hub/gputap/api/users/victor/server/stop", timeout=30)
    assert r.status_code == 403, r.text
    assert platform.server("victor")["ready"]  # none of these stopped it
    platform.stop_server("victor")


def test_a_stop_through_the_hubs_own_api_reads_from_the_hub(platform):
    token = started(platform, "hubert")
    platform.stop_server("hubert")  # JupyterHub's DELETE, as its home and admin pages do
    stop = stop_view(platform, token, "hubert")
    assert stop["kind"] == "hub"
    assert "stopped from the hub" in stop["message"] and "(by you or an admin)" in stop["message"]


def test_a_server_that_dies_by_itself_says_so_and_is_billed_until_last_seen(platform):
    token = started(platform, "dora")
    polled_alive(platform, "dora")
    killed = datetime.now().astimezone()
    os.kill(platform.server("dora")["state"]["pid"], signal.SIGKILL)
    platform.wait_stopped("dora", timeout=40)
    [session] = platform.sessions("dora")
    assert session["state"] == "ended"
    ended = datetime.fromisoformat(session["ended_at"])
    # ended when it was last seen alive, not when the next poll found it gone
    assert ended <= killed, (ended, killed)
    stop = stop_view(platform, token, "dora")
    assert stop["kind"] == "died"
    assert stop["message"].startswith("Your server exited by itself at ")
    assert "(e.g. out of memory)" in stop["message"]


def test_a_change_tells_the_server_and_the_new_server_has_no_stale_reason(platform):
    token = started(platform, "chang", SLICE)
    r = gputap(
        platform,
        token,
        "users/chang/server/change",
        "POST",
        {"options": {"kind": "cpu"}, "queue": False},
    )
    assert r.status_code == 202, r.text
    time.sleep(ANSWER_GRACE_SECONDS)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        change = gputap(platform, token, "users/chang/server/change").json()
        if change["finished_at"]:
            break
        time.sleep(0.3)
    assert change["state"] == "done", change
    assert told(platform, "chang", "change"), platform.log_tail()
    view = gputap(platform, token, "users/chang/server").json()
    assert view["running"] and view["stop"] is None
    platform.stop_server("chang")
