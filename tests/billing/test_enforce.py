import json
from datetime import timedelta

from billing_service.domain.enforcement import sessions_to_stop
from billing_service.domain.records import AccountState, SessionRecord
from billing_service.loops.enforce import Enforcer
from billing_service.loops.hub_api import server_url, stop_url, worker_stop_url, workers_url

from .conftest import T0


def running(sid, price=3_600_000, count=1, user="ada", server="", worker="", course=""):
    return SessionRecord(
        sid, user, server, "X", count, price, T0, None, None, None, worker=worker, course=course
    )


def disk(sid, gb=100, price=36_000, user="ada"):
    """A data disk's storage session: 36_000 micro per GB-hour, 10 micro/s per GB."""
    return SessionRecord(
        sid, user, f"disk:{sid}", "disk", gb, price, T0, None, None, None, price_class="storage"
    )


def account(balance, *sessions, user="ada"):
    return AccountState(user, T0, balance, tuple(sessions))


def test_stops_when_credit_would_run_out_before_next_check():
    # 3.60/h = 1_000 micro/s; after 60 s 60_000 are spent
    acct = account(65_000, running("s1"), running("s2", price=0))
    now = T0 + timedelta(seconds=60)
    # available 5_000 <= 5 s x 1_000: stop every server of the account
    assert [s.id for s in sessions_to_stop([acct], now, 5)] == ["s1", "s2"]
    # 6_000 > 5_000 still lasts past the next check
    assert sessions_to_stop([account(66_001, running("s1"))], now, 5) == []


def test_boundary_is_inclusive_and_idle_accounts_are_left():
    now = T0 + timedelta(seconds=10)
    assert len(sessions_to_stop([account(15_000, running("s1"))], now, 5)) == 1
    assert (
        sessions_to_stop(
            [
                account(
                    -5,
                )
            ],
            now,
            5,
        )
        == []
    )
    assert len(sessions_to_stop([account(-5, running("s1", price=0))], now, 5)) == 1


def test_server_url_escapes():
    api = "http://127.0.0.1:8081/hub/api/"
    assert server_url(api, "ada", "") == "http://127.0.0.1:8081/hub/api/users/ada/server"
    assert (
        server_url(api, "a b@x", "gpu/1")
        == "http://127.0.0.1:8081/hub/api/users/a%20b%40x/servers/gpu%2F1"
    )


def test_stop_url_is_gputaps_stop_endpoint_beside_the_hub_api():
    api = "http://127.0.0.1:8081/prefix/hub/api/"
    assert (
        stop_url(api, "ada", "")
        == "http://127.0.0.1:8081/prefix/hub/gputap/api/users/ada/server/stop"
    )
    assert (
        stop_url(api, "a b@x", "gpu/1")
        == "http://127.0.0.1:8081/prefix/hub/gputap/api/users/a%20b%40x/servers/gpu%2F1/stop"
    )


class RecordingClient:
    def __init__(self):
        self.requests = []

    async def fetch(self, request):
        self.requests.append(request)

        class Response:
            code = 204

        return Response()


async def test_enforcer_asks_once_per_window():
    client = RecordingClient()
    accounts = [account(0, running("s1", server="gpu"))]

    async def load(now):
        return accounts

    enforcer = Enforcer(
        load, api_url="http://hub/api", api_token="secret", interval_seconds=5, http_client=client
    )
    assert [s.id for s in await enforcer.check(T0)] == ["s1"]
    assert await enforcer.check(T0 + timedelta(seconds=10)) == []
    assert [s.id for s in await enforcer.check(T0 + timedelta(seconds=31))] == ["s1"]
    # gputap's stop endpoint, which records that credit ran out (docs/lab.md)
    assert [(r.method, r.url) for r in client.requests] == [
        ("POST", "http://hub/gputap/api/users/ada/servers/gpu/stop")
    ] * 2
    assert client.requests[0].headers["Authorization"] == "token secret"


def test_disks_drain_the_credit_but_only_servers_are_stopped():
    now = T0 + timedelta(seconds=60)
    # 1_000 micro/s server + 1_000 micro/s disk: 120_000 spent, 10_000 left = 5 s of both
    acct = account(130_000, running("s1", server="gpu"), disk("d1"))
    assert [s.id for s in sessions_to_stop([acct], now, 5)] == ["s1"]
    # without the disk's drain the server would last 10 s: the disk counts
    assert sessions_to_stop([account(70_000, running("s1", server="gpu"))], now, 5) == []
    # disks alone, credit long gone: nothing to stop
    assert sessions_to_stop([account(-1_000_000, disk("d1"), disk("d2"))], now, 5) == []


async def test_enforcement_never_asks_the_hub_to_stop_a_disk():
    client = RecordingClient()
    accounts = [
        account(0, running("s1", server="gpu"), disk("d1")),
        account(-5_000_000, disk("d2", user="bo"), user="bo"),
    ]

    async def load(now):
        return accounts

    enforcer = Enforcer(
        load, api_url="http://hub/api", api_token="secret", interval_seconds=5, http_client=client
    )
    assert [s.id for s in await enforcer.check(T0)] == ["s1"]
    assert [r.url for r in client.requests] == ["http://hub/gputap/api/users/ada/servers/gpu/stop"]


def test_worker_urls_are_beside_the_servers_stop_endpoint():
    api = "http://127.0.0.1:8081/prefix/hub/api/"
    base = "http://127.0.0.1:8081/prefix/hub/gputap/api/users"
    assert workers_url(api, "ada", "") == f"{base}/ada/server/workers"
    assert worker_stop_url(api, "ada", "", "w3") == f"{base}/ada/server/workers/w3/stop"
    assert (
        worker_stop_url(api, "a b", "gpu/1", "w12")
        == f"{base}/a%20b/servers/gpu%2F1/workers/w12/stop"
    )


def test_a_group_short_of_money_loses_its_workers_first():
    now = T0 + timedelta(seconds=60)
    # server and two workers at 1_000 micro/s each: 180_000 spent after 60 s
    sessions = (
        running("s", server="gpu"),
        running("w1", server="gpu", worker="w1"),
        running("w2", server="gpu", worker="w2"),
    )
    # 12_000 left: 4 s of all three (short), 12 s of the server alone: the workers stop
    stopped = sessions_to_stop([account(192_000, *sessions)], now, 5)
    assert [s.id for s in stopped] == ["w1", "w2"]
    # 4_000 left: the server alone would last 4 s, short too: all of them stop
    stopped = sessions_to_stop([account(184_000, *sessions)], now, 5)
    assert sorted(s.id for s in stopped) == ["s", "w1", "w2"]
    # 20_000 left: 6.7 s of all three lasts past the next check: nothing stops
    assert sessions_to_stop([account(200_000, *sessions)], now, 5) == []


def test_workers_are_judged_with_the_group_that_pays_for_them():
    now = T0 + timedelta(seconds=60)
    # the course's server and worker are paid by its allowance alone: its pool runs short;
    # the user's own server (plenty of credit) stays
    acct = AccountState(
        "ada",
        T0,
        10_000_000 + 130_000,
        (
            running("own", server="mine"),
            running("c", server="dl", course="dl"),
            running("cw", server="dl", worker="w1", course="dl"),
        ),
        pools={"user:ada:allowance:dl": 130_000, "user:ada:paid": 10_000_000},
    )
    # allowance: 130_000 - 120_000 = 10_000 left, 5 s of both (short), 10 s of the server
    assert [s.id for s in sessions_to_stop([acct], now, 5)] == ["cw"]


async def test_enforcer_stops_a_worker_through_its_stop_endpoint_before_servers():
    client = RecordingClient()
    accounts = [
        account(0, running("s1", server="gpu"), running("s1w1", server="gpu", worker="w1")),
        account(192_000 - 1, *(running(k, user="bo", worker=w) for k, w in
                               (("b", ""), ("bw1", "w1"), ("bw2", "w2"))), user="bo"),
    ]  # fmt: skip

    async def load(now):
        return accounts

    enforcer = Enforcer(
        load, api_url="http://hub/api", api_token="secret", interval_seconds=5, http_client=client
    )
    now = T0 + timedelta(seconds=60)
    assert sorted(s.id for s in await enforcer.check(now)) == ["bw1", "bw2", "s1", "s1w1"]
    urls = [(r.method, r.url) for r in client.requests]
    base = "http://hub/gputap/api/users"
    assert urls == [
        ("POST", f"{base}/ada/servers/gpu/workers/w1/stop"),
        ("POST", f"{base}/bo/server/workers/w1/stop"),
        ("POST", f"{base}/bo/server/workers/w2/stop"),
        ("POST", f"{base}/ada/servers/gpu/stop"),
    ]
    assert all(r.headers["Authorization"] == "token secret" for r in client.requests)
    # a worker's stop names its session (names are reused after a worker ends); a server's
    # stop has no body
    bodies = [r.body and json.loads(r.body) for r in client.requests]
    assert bodies == [{"session_id": "s1w1"}, {"session_id": "bw1"}, {"session_id": "bw2"}, b""]
    assert client.requests[0].headers["Content-Type"] == "application/json"
