"""The rules around a worker group (issue 17, docs/scale-out.md): a group on which no job
runs is stopped after ``scale_out.idle_seconds``, billing with it, and a job running on it
keeps it (here the idle time is 6 s and the hub asks the agents how they are every 2 s); a
course's max_workers forbids or caps the workers of the servers it pays for."""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest
import requests

from tests.platform import Platform

IDLE_SECONDS = 6


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    p = Platform(
        tmp_path_factory.mktemp("scale-out-rules"),
        extra={"scale_out": {"idle_seconds": IDLE_SECONDS}},
    )
    p.start()
    yield p
    p.shutdown()


def parse(at: str) -> float:
    return datetime.fromisoformat(at).timestamp()


def test_a_group_without_a_job_stops_after_the_idle_time_and_a_job_keeps_it(platform):
    platform.create_user("ida")
    auth = {"Authorization": f"token {platform.user_token('ida')}"}
    url = f"{platform.url}/hub/gputap/api/users/ida/server/workers"
    r = platform.spawn("ida", {"kind": "cpu"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("ida")
    r = requests.post(url, json={"count": 1}, headers=auth, timeout=30)
    assert r.status_code == 202, r.text

    def view() -> dict:
        return requests.get(url, headers=auth, timeout=30).json()

    deadline = time.monotonic() + 90
    while (group := view())["workers"][0]["state"] != "ready":
        assert time.monotonic() < deadline, group
        time.sleep(0.2)
    [worker] = group["workers"]

    # a job of twice the idle time, run on the worker's agent as gputap.run does: the group
    # stays while it runs
    job = requests.post(
        f"http://{worker['host']}:{worker['port']}/run",
        data=json.dumps({"argv": ["sleep", str(2 * IDLE_SECONDS)], "env": {}, "cwd": ""}),
        headers={"Authorization": f"token {group['token']}"},
        stream=True,
        timeout=60,
    )
    assert job.status_code == 200, job.text
    lines = [json.loads(line) for line in job.iter_lines() if line]
    job_ended = time.time()
    assert lines[-1] == {"exit": 0}, lines
    assert view()["workers"][0]["state"] == "ready"

    # then, with nothing running, it stops after the idle time (and one look of the hub's)
    deadline = time.monotonic() + IDLE_SECONDS + 15
    while (state := view()["workers"][0])["state"] not in ("stopped", "failed"):
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    assert state["state"] == "stopped", state
    assert "No job ran on the group for" in state["reason"], state
    [session] = [s for s in platform.sessions("ida") if s["worker"] == "w1"]
    assert session["state"] == "ended"
    ended = parse(session["ended_at"])
    assert job_ended + IDLE_SECONDS - 1 <= ended <= job_ended + IDLE_SECONDS + 4, ended - job_ended
    assert platform.server("ida") is not None  # the server runs on
    platform.stop_server("ida")


SLICE = {"kind": "slice", "card": "A100-80GB", "mig_profile": "1g.10gb"}


def course(platform: Platform, name: str, student: str, **rule) -> str:
    body = {"name": name, "allowed": ["A100-80GB/1g.10gb"], **rule}
    r = platform.billing("api/courses", "POST", body)
    assert r.status_code == 201, r.text
    slug = r.json()["slug"]
    platform.create_user(student)
    r = platform.billing(f"api/courses/{slug}/students", "POST", {"username": student})
    assert r.status_code in (200, 201), r.text
    return slug


def test_a_course_forbids_or_caps_scale_out_of_the_servers_it_pays_for(platform):
    """A course's max_workers: 0 (the default) forbids workers beside its servers, N caps
    them; the workers it allows are billed to the course, as their server."""
    closed = course(platform, "No scale-out", "cat")
    # (a worker's GPUs count among those a student runs at once on the course)
    capped = course(platform, "Two nodes", "dan", max_workers=1, max_concurrent_gpus=2)
    for student, slug in (("cat", closed), ("dan", capped)):
        r = platform.spawn(student, {**SLICE, "course": slug})
        assert r.status_code in (201, 202), r.text
        platform.wait_ready(student)

    def ask(student: str, count: int) -> requests.Response:
        return requests.post(
            f"{platform.url}/hub/gputap/api/users/{student}/server/workers",
            json={"count": count},
            headers={"Authorization": f"token {platform.user_token(student)}"},
            timeout=30,
        )

    r = ask("cat", 1)
    assert r.status_code == 403, r.text
    assert (
        "The course No scale-out pays for this server and does not allow scale-out"
        in (r.json()["message"])
    )
    r = ask("dan", 2)
    assert r.status_code == 403, r.text
    assert "The course Two nodes allows at most 1 worker(s), not 2." in r.json()["message"]
    assert not [s for s in platform.sessions("cat") + platform.sessions("dan") if s["worker"]]

    r = ask("dan", 1)
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 60
    while not [s for s in platform.sessions("dan") if s["worker"] == "w1"]:
        assert time.monotonic() < deadline, platform.log_tail()
        time.sleep(0.3)
    [worker] = [s for s in platform.sessions("dan") if s["worker"] == "w1"]
    assert worker["course"] == capped
    for student in ("cat", "dan"):
        platform.stop_server(student)


def test_a_worker_stop_names_the_session_it_means(platform):
    """Billing's enforcer stops a worker by its name and session: a name now running another
    session is not stopped (409); a body with anything else is a 400; nothing changes."""
    platform.create_user("sid")
    auth = {"Authorization": f"token {platform.user_token('sid')}"}
    url = f"{platform.url}/hub/gputap/api/users/sid/server/workers"
    r = platform.spawn("sid", {"kind": "cpu"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("sid")
    assert requests.post(url, json={"count": 1}, headers=auth, timeout=30).status_code == 202

    def worker() -> dict:
        return requests.get(url, headers=auth, timeout=30).json()["workers"][0]

    deadline = time.monotonic() + 90
    while worker()["state"] != "ready":
        assert time.monotonic() < deadline, worker()
        time.sleep(0.2)
    stop = f"{url}/w1/stop"
    r = requests.post(stop, json={"session_id": "an-earlier-one"}, headers=auth, timeout=30)
    assert r.status_code == 409 and "w1 now runs another session" in r.json()["message"], r.text
    r = requests.post(stop, json={"reason": "x" * 500}, headers=auth, timeout=30)
    assert r.status_code == 400 and "x" * 100 not in r.text, r.text
    assert worker()["state"] == "ready"

    r = requests.post(stop, json={"session_id": worker()["session_id"]}, headers=auth, timeout=30)
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 30
    while worker()["state"] != "stopped":
        assert time.monotonic() < deadline, worker()
        time.sleep(0.2)
    platform.stop_server("sid")
