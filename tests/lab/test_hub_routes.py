"""The routes that ask the hub's server API, against tests/lab/fake_hub.py.

The server extension uses the server's own token (``JUPYTERHUB_API_TOKEN``), passes the
hub's answers and errors through with their status and message, refuses bad input with
400 before asking the hub, and never writes the token to its log.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
import requests
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from tests.lab.conftest import hub_env

ROUTES = [
    ("GET", "gputap/gpu"),
    ("GET", "gputap/server"),
    ("GET", "gputap/choices"),
    ("GET", "gputap/change"),
    ("POST", "gputap/change"),
    ("GET", "gputap/disks"),
    ("POST", "gputap/disks"),
    ("DELETE", "gputap/disks/data"),
    ("POST", "gputap/disks/data/attach"),
    ("POST", "gputap/disks/data/detach"),
    ("POST", "gputap/stop"),
    ("GET", "gputap/stopping"),
    ("POST", "gputap/stopping"),
]


@pytest.fixture(scope="module")
def server(lab_server, hub):
    state, url = hub
    return lab_server("IdleGPU", env=hub_env(state, url))


@pytest.fixture
def state(hub):
    """The fake hub's state, fresh for each test."""
    state, _ = hub
    state.seen.clear()
    state.disks.clear()
    state.change = None
    state.fail_next = None
    return state


def hub_requests(state) -> list[tuple[str, str]]:
    return [(seen.method, seen.path) for seen in state.seen]


@pytest.mark.parametrize("method,path", ROUTES)
def test_every_route_needs_login(server, state, method, path):
    assert server.request(method, path, auth=False, json={"x": 1}).status_code == 403
    # past the XSRF check too (a page's cookie and header), it is the login that is missing
    browser = requests.Session()
    browser.get(server.url + "login", timeout=30)
    xsrf = browser.cookies["_xsrf"]
    answer = browser.request(
        method, server.url + path, headers={"X-XSRFToken": xsrf}, json={"x": 1}, timeout=30
    )
    assert answer.status_code == 403
    assert "_xsrf" not in answer.json()["message"]
    assert state.seen == []


def test_server_facts(server, state):
    answer = server.get("gputap/server")
    assert answer.status_code == 200
    facts = answer.json()
    assert facts["user"] == "alice" and facts["server"] == ""
    assert facts["offering"] == "A100-80GB/1g.10gb"
    assert facts["session"]["price_per_hour_micro"] == 1142857
    assert facts["account"]["available_micro"] == 8857143
    assert state.seen[-1].path == "/hub/gputap/api/users/alice/server"
    assert state.seen[-1].authorized


def test_choices(server, state):
    answer = server.get("gputap/choices")
    assert answer.status_code == 200
    assert [c["key"] for c in answer.json()["choices"]] == ["A100-80GB/1g.10gb", "H100-80GB", "cpu"]
    assert hub_requests(state) == [("GET", "/hub/gputap/api/users/alice/server/choices")]


def test_change_status_404_before_any_change(server, state):
    answer = server.get("gputap/change")
    assert answer.status_code == 404
    assert answer.json()["message"] == "No change of GPU was asked for this server."


def test_change_sold_out_then_queue(server, state):
    options = {"kind": "card", "card": "H100-80GB", "count": 1}
    sold_out = server.post("gputap/change", json={"options": options})
    assert sold_out.status_code == 409
    body = sold_out.json()
    assert body["message"].startswith("No free H100-80GB now (0 of 8)")
    # the alternatives reach the browser with the message
    assert [c["key"] for c in body["alternatives"]] == ["A100-80GB/1g.10gb", "cpu"]
    assert state.seen[-1].body == {"options": options, "queue": False}

    queued = server.post("gputap/change", json={"options": options, "queue": True})
    assert queued.status_code == 202
    assert queued.json()["state"] == "waiting"
    assert queued.json()["to"] == "H100-80GB"
    assert server.get("gputap/change").json()["state"] == "waiting"


def test_change(server, state):
    answer = server.post("gputap/change", json={"options": {"kind": "cpu"}, "queue": False})
    assert answer.status_code == 202
    assert answer.json()["state"] == "stopping"
    assert hub_requests(state) == [("POST", "/hub/gputap/api/users/alice/server/change")]


@pytest.mark.parametrize(
    "body,message",
    [
        (b"not json", "The body is not JSON"),
        (b"", "Send a JSON body."),
        (b"[]", "Send a JSON object"),
        (b"{}", "Missing options"),
        (b'{"options": "cpu"}', "options must be a non-empty JSON object"),
        (b'{"options": {}}', "options must be a non-empty JSON object"),
        (b'{"options": {"kind": "cpu"}, "queue": "yes"}', "queue must be true or false"),
        (b'{"options": {"kind": "cpu"}, "card": "H100"}', "Unknown fields ['card']"),
    ],
)
def test_change_bad_input(server, state, body, message):
    answer = server.post("gputap/change", data=body)
    assert answer.status_code == 400
    assert message in answer.json()["message"]
    assert state.seen == []


#: bodies nested past any depth a route reads: deeper than Python's recursion limit, and
#: just under it (read, but a recursion error wherever the value is written or shown)
NESTED = [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
    b'{"options": {"kind": "cpu", "a": ' + b"[" * 900 + b"]" * 900 + b"}}",
]


@pytest.mark.parametrize("body", NESTED, ids=["list-100000", "object-5000", "options-900"])
@pytest.mark.parametrize(
    "path", ["gputap/change", "gputap/disks", "gputap/stopping", "gputap/disks/data/attach"]
)
def test_a_body_nested_too_deep_is_a_400_that_says_so(server, state, path, body):
    answer = server.post(path, data=body)
    assert answer.status_code == 400, answer.text
    message = answer.json()["message"]
    assert "nested too deep" in message and "levels" in message
    assert len(message) < 200
    assert state.seen == []


def test_disks_lifecycle(server, state):
    listing = server.get("gputap/disks").json()
    assert listing["disks"] == []
    assert listing["limits"]["max_size_gb"] == 100
    assert listing["price_per_gb_hour_micro"] == 140

    created = server.post("gputap/disks", json={"name": "data", "size_gb": 20})
    assert created.status_code == 201
    assert created.json()["name"] == "data" and created.json()["size_gb"] == 20
    assert [d["name"] for d in server.get("gputap/disks").json()["disks"]] == ["data"]

    again = server.post("gputap/disks", json={"name": "data", "size_gb": 5})
    assert again.status_code == 409
    assert again.json()["message"] == "You already have a disk named data."

    attached = server.post("gputap/disks/data/attach")
    assert attached.status_code == 202
    assert attached.json()["restart"]["state"] == "stopping"
    # attached to this server: the extension names it for the hub
    assert state.seen[-1].body == {"server": ""}
    assert server.get("gputap/disks").json()["disks"][0]["attached_to"] == ""

    refused = server.delete("gputap/disks/data")
    assert refused.status_code == 409
    assert "detach it first" in refused.json()["message"]

    detached = server.post("gputap/disks/data/detach", json={})
    assert detached.status_code == 202
    assert state.seen[-1].path == "/hub/gputap/api/users/alice/disks/data/detach"

    deleted = server.delete("gputap/disks/data")
    assert deleted.status_code == 204
    assert deleted.content == b""
    assert server.get("gputap/disks").json()["disks"] == []
    assert all(seen.authorized for seen in state.seen)


def test_disk_errors_from_the_hub_pass_through(server, state):
    too_big = server.post("gputap/disks", json={"name": "huge", "size_gb": 5000})
    assert too_big.status_code == 400
    assert too_big.json()["message"] == "A disk is 1 to 100 GB, not 5000."
    missing = server.delete("gputap/disks/nothere")
    assert missing.status_code == 404
    assert missing.json()["message"] == "No disk named nothere."
    assert len(state.seen) == 2


@pytest.mark.parametrize(
    "body,message",
    [
        ({"name": "Data", "size_gb": 10}, "Disk name 'Data' is not valid"),
        ({"name": "9lives", "size_gb": 10}, "is not valid"),
        ({"name": "a" * 33, "size_gb": 10}, "is not valid"),
        ({"name": "../etc", "size_gb": 10}, "is not valid"),
        ({"name": 7, "size_gb": 10}, "is not valid"),
        ({"name": "data"}, "Missing size_gb"),
        ({"size_gb": 3}, "Missing name"),
        ({"name": "data", "size_gb": "10"}, "size_gb must be a whole number"),
        ({"name": "data", "size_gb": 1.5}, "size_gb must be a whole number"),
        ({"name": "data", "size_gb": True}, "size_gb must be a whole number"),
        ({"name": "data", "size_gb": 0}, "size_gb must be a whole number"),
        ({"name": "data", "size_gb": 1, "path": "/"}, "Unknown fields ['path']"),
    ],
)
def test_create_disk_bad_input(server, state, body, message):
    answer = server.post("gputap/disks", data=json.dumps(body))
    assert answer.status_code == 400
    assert message in answer.json()["message"]
    assert state.seen == []


@pytest.mark.parametrize(
    "method,path",
    [
        ("DELETE", "gputap/disks/Bad%20Name"),
        ("DELETE", "gputap/disks/-data"),
        ("POST", "gputap/disks/UPPER/attach"),
        ("POST", "gputap/disks/a%2Fb/detach"),
    ],
)
def test_bad_disk_name_in_the_path(server, state, method, path):
    answer = server.request(method, path)
    assert answer.status_code in (400, 404)
    if answer.status_code == 400:
        assert "is not valid" in answer.json()["message"]
    assert state.seen == []


def test_attach_takes_no_body(server, state):
    answer = server.post("gputap/disks/data/attach", json={"server": "other"})
    assert answer.status_code == 400
    assert "takes no body" in answer.json()["message"]
    assert state.seen == []


def test_hub_error_page_is_a_502_with_a_message(server, state):
    state.fail_next = (502, "<html><body>Bad Gateway</body></html>")
    answer = server.get("gputap/server")
    assert answer.status_code == 502
    assert answer.json()["message"] == (
        "The hub answered 502 without saying why; try again in a minute."
    )


def test_hub_500_passes_through(server, state):
    state.fail_next = (500, '{"status": 500, "message": "Unhandled error"}')
    answer = server.get("gputap/choices")
    assert answer.status_code == 500
    assert answer.json()["message"] == "Unhandled error"


@pytest.mark.parametrize("status,answered", [(200, 502), (404, 404)])
def test_a_hub_answer_nested_too_deep_is_no_500(server, state, status, answered):
    state.fail_next = (status, "[" * 100_000 + "]" * 100_000)
    answer = server.get("gputap/server")
    assert answer.status_code == answered, answer.text
    assert answer.json()["message"].startswith(f"The hub answered {status}")


def test_token_is_sent_and_never_logged(server, state):
    server.get("gputap/server")
    server.post("gputap/change", json={"options": {"kind": "cpu"}})
    assert state.seen and all(seen.authorized for seen in state.seen)
    log = server.log()
    assert "gputap" in log  # the log is the server's, at DEBUG
    assert state.token not in log


def test_wrong_token_is_the_hubs_403(lab_server, hub, state, tmp_path):
    _, url = hub
    env = hub_env(state, url) | {"JUPYTERHUB_API_TOKEN": "not-the-token"}
    server = lab_server("IdleGPU", env=env)
    answer = server.get("gputap/server")
    assert answer.status_code == 403
    assert answer.json()["message"] == "Missing or invalid credentials."
    assert "not-the-token" not in server.log()


def test_named_server(lab_server, hub, state):
    _, url = hub
    state.servers.add("big job")
    try:
        server = lab_server("IdleGPU", env=hub_env(state, url, "big job"))
        answer = server.get("gputap/server")
        assert answer.status_code == 200
        assert answer.json()["server"] == "big job"
        assert state.seen[-1].path == "/hub/gputap/api/users/alice/servers/big%20job"
        server.post("gputap/disks", json={"name": "scratch", "size_gb": 1})
        assert server.post("gputap/disks/scratch/attach").status_code == 202
        assert state.seen[-1].body == {"server": "big job"}
    finally:
        state.servers.discard("big job")


def test_hub_unreachable(lab_server, state):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    env = hub_env(state, f"http://127.0.0.1:{closed}/hub/api")
    server = lab_server("IdleGPU", env=env)
    answer = server.get("gputap/server")
    assert answer.status_code == 502
    assert answer.json()["message"].startswith("The hub could not be reached")
    assert "try again" in answer.json()["message"]


def test_not_started_by_a_hub(lab_server, state):
    server = lab_server("IdleGPU")
    for method, path in ROUTES[1:4] + [("GET", "gputap/disks")]:
        answer = server.request(method, path)
        assert answer.status_code == 503
        assert "not started by gputap's hub" in answer.json()["message"]
    # the GPU panel still works
    assert server.get("gputap/gpu").status_code == 200


def test_stop_asks_the_hubs_stop_endpoint_with_the_servers_token(server, state):
    answer = server.post("gputap/stop")
    assert answer.status_code == 204, answer.text
    [seen] = state.seen
    assert (seen.method, seen.path) == ("POST", "/hub/gputap/api/users/alice/server/stop")
    assert seen.authorized
    refused = server.post("gputap/stop", json={"now": True})
    assert refused.status_code == 400 and "takes no body" in refused.json()["message"]
    assert len(state.seen) == 1


STOPPING = {
    "kind": "credit",
    "message": "Your server was stopped at 14:05 UTC: your credit ran out.",
    "todo": "Add credit on the billing page, then start again; your files are kept.",
    "at": "2025-05-01T14:05:00+00:00",
    "notice": "Your server was stopped at 14:05 UTC: your credit ran out. Add credit ...",
}


async def _stopping_event(server) -> dict:
    """Subscribe to the server's events as Lab does, announce a stop, and read the event."""
    url = server.url.replace("http://", "ws://") + "api/events/subscribe"
    socket = await websocket_connect(
        HTTPRequest(url, headers={"Authorization": f"token {server.token}"})
    )
    try:
        answer = await asyncio.get_running_loop().run_in_executor(
            None, lambda: server.post("gputap/stopping", json=STOPPING)
        )
        assert answer.status_code == 204, answer.text
        while True:
            event = json.loads(await asyncio.wait_for(socket.read_message(), 10))
            if event.get("schema_id", "").endswith("gputap_lab/stopping/v1"):
                return event
    finally:
        socket.close()


def test_the_hubs_stop_announcement_is_kept_and_reaches_open_pages_at_once(server, state):
    event = asyncio.run(_stopping_event(server))
    assert {k: event[k] for k in STOPPING} == STOPPING
    assert server.get("gputap/stopping").json() == STOPPING
    assert "the hub says this server stops (credit)" in server.log()
    assert state.seen == []  # nothing asked of the hub


@pytest.mark.parametrize(
    "body,message",
    [
        ([1], "Send a JSON object"),
        ({**STOPPING, "kind": "bored"}, "kind must be one of"),
        ({k: v for k, v in STOPPING.items() if k != "todo"}, "missing todo"),
        ({**STOPPING, "x" * 300: 1}, "1 unknown field(s)"),
        ({**STOPPING, "message": "y" * 600}, "at most 500 characters"),
        ({**STOPPING, "at": "yesterday"}, "ISO 8601"),
        ({**STOPPING, "kind": "fault", "restarting": "yes"}, "restarting must be true or false"),
    ],
)
def test_bad_stop_announcements_are_refused(server, body, message):
    answer = server.post("gputap/stopping", json=body)
    assert answer.status_code == 400
    assert message in answer.json()["message"]
    assert "x" * 300 not in answer.text and "y" * 600 not in answer.text


def test_a_gpu_faults_announcement_says_whether_the_hub_restarts_the_server(server, state):
    fault = {
        **STOPPING,
        "kind": "fault",
        "message": "The GPU of your server failed at 14:05 UTC (XID 79); billing stopped then.",
        "todo": "gputap is starting your server again on a healthy GPU; Lab reloads when it is "
        "back. Your files are kept.",
        "restarting": True,
    }
    assert server.post("gputap/stopping", json=fault).status_code == 204
    assert server.get("gputap/stopping").json() == fault
    # absent is false, and stays absent: the page reads it so
    plain = {k: v for k, v in fault.items() if k != "restarting"}
    assert server.post("gputap/stopping", json=plain).status_code == 204
    assert server.get("gputap/stopping").json() == plain
