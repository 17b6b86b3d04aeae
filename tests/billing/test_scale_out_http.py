"""Scale-out through the real hub (issue 17): each worker of a server is a billing session of
its own, shown under its server; a course's ``max_workers`` is set, edited and read by the
hub's client."""

import asyncio

import pytest

from spawner.lifecycle.billing_client import BillingClient

from .hub import user


def start(sid, user, server="gpu", worker=None, sku="RTX-4090", count=1):
    body = {
        "id": sid,
        "username": user,
        "server_name": server,
        "sku": sku,
        "count": count,
        "started_at": "2025-01-01T10:00:00+00:00",
    }
    if worker is not None:
        body["worker"] = worker
    return body


def test_a_server_and_its_workers_each_have_an_open_session(hub, as_hub, as_ops):
    assert as_hub("POST", "api/sessions", json=start("v", "vera")).status_code == 201
    r = as_hub("POST", "api/sessions", json=start("v-w1", "vera", worker="w1"))
    assert r.status_code == 201 and r.json()["worker"] == "w1"
    assert r.json()["server_name"] == "gpu" and r.json()["state"] == "running"
    r = as_hub("POST", "api/sessions", json=start("v-w2", "vera", worker="w2", sku="T4", count=2))
    assert r.status_code == 201
    # a replayed start of a worker answers the first record
    r = as_hub("POST", "api/sessions", json=start("v-w1", "vera", worker="w1", sku="T4"))
    assert r.status_code == 200 and r.json()["sku"] == "RTX-4090"
    running = as_ops("GET", "api/sessions?username=vera&state=running").json()["sessions"]
    assert sorted((s["id"], s["worker"]) for s in running) == [
        ("v", ""),
        ("v-w1", "w1"),
        ("v-w2", "w2"),
    ]
    account = as_ops("GET", "api/accounts/vera").json()
    # 5.00/h server + 5.00/h worker + 2 x 1.50/h worker: the rate and time left count workers
    assert account["rate_per_hour_micro"] == 13_000_000
    assert account["groups"] == [
        {
            "server": "gpu",
            "workers": [
                {
                    "worker": "w1",
                    "session_id": "v-w1",
                    "offering": "RTX-4090",
                    "count": 1,
                    "rate_per_hour_micro": 5_000_000,
                    "rate_per_hour": "5.00",
                    "started_at": "2025-01-01T10:00:00+00:00",
                },
                {
                    "worker": "w2",
                    "session_id": "v-w2",
                    "offering": "T4",
                    "count": 2,
                    "rate_per_hour_micro": 3_000_000,
                    "rate_per_hour": "3.00",
                    "started_at": "2025-01-01T10:00:00+00:00",
                },
            ],
            "rate_per_hour_micro": 8_000_000,
            "rate_per_hour": "8.00",
        }
    ]
    # the user's page lists the workers under their server with the group's rate
    vera = user(hub, "vera")
    page = vera("GET", "").text
    assert page.index('data-id="v"') < page.index('data-id="v-w1"') < page.index('data-id="v-w2"')
    assert "└ worker w1" in page and "2 worker(s) of gpu together" in page
    # a worker's stop closes its session alone
    r = as_hub("POST", "api/sessions/v-w1/stop", json={"ended_at": "2025-01-01T10:00:30Z"})
    assert r.status_code == 200 and r.json()["billed_seconds"] == 30 and r.json()["worker"] == "w1"
    account = as_ops("GET", "api/accounts/vera").json()
    assert [w["worker"] for w in account["groups"][0]["workers"]] == ["w2"]
    assert {s["id"] for s in account["running"]} == {"v", "v-w2"}
    csv = as_ops("GET", "api/usage.csv?username=vera").text.splitlines()
    assert csv[0].endswith(",state,worker") and any(line.endswith(",w1") for line in csv)


@pytest.mark.parametrize(
    "worker", ["w0", "w1000", "W1", "w01", "w1\n", "worker-1", 7, ["w1"], "w" + "9" * 500]
)
def test_a_bad_worker_name_is_400_and_changes_nothing(as_hub, as_ops, worker):
    r = as_hub("POST", "api/sessions", json=start("x-1", "xena", worker=worker))
    assert r.status_code == 400, r.text
    message = r.json()["message"]
    assert "'worker'" in message and "w1 to w999" in message
    assert "9" * 100 not in message  # the input is never echoed in full
    assert as_ops("GET", "api/sessions?username=xena").json() == {"sessions": []}


def test_a_course_caps_its_servers_workers(hub, as_ops):
    prof = user(hub, "wprof")
    stu = user(hub, "wstu")
    assert as_ops("PUT", "api/instructors/wprof").status_code == 201
    course = {"name": "Scale", "allowed": ["T4"], "slug": "scale"}
    for bad in (-1, 65, 1.5, "4", True):
        r = prof("POST", "api/courses", json={**course, "max_workers": bad})
        assert r.status_code == 400 and "max_workers must be a whole number from 0" in r.text
    r = prof("POST", "api/courses", json=course)
    assert r.status_code == 201 and r.json()["max_workers"] == 0  # scale-out forbidden
    plain = prof("POST", "api/courses", json={**course, "slug": "scale-4", "max_workers": 4})
    assert plain.status_code == 201 and plain.json()["max_workers"] == 4
    r = stu("POST", "api/courses/join", json={"code": r.json()["join_code"]})
    assert r.status_code == 200
    # edited by its instructor; others are refused, bad values change nothing
    assert stu("PATCH", "api/courses/scale", json={"max_workers": 8}).status_code == 404
    for body in ({"max_workers": 65}, {"max_workers": None}, {}, {"name": "other"}):
        r = prof("PATCH", "api/courses/scale", json=body)
        assert r.status_code == 400, body
    r = prof("PATCH", "api/courses/scale", json={"max_workers": 8})
    assert r.status_code == 200 and r.json()["max_workers"] == 8
    assert stu("GET", "api/courses/scale").json()["max_workers"] == 8
    # the answer the hub's spawner reads for the user's courses carries it
    client = BillingClient(hub.billing, hub.hub_token)
    taken = asyncio.run(client.courses("wstu"))["courses"]
    assert [(c["slug"], c["max_workers"]) for c in taken] == [("scale", 8)]
