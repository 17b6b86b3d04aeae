import json
from datetime import timedelta

from billing_service.domain.reconciliation import sessions_to_close, workers_seen
from billing_service.domain.records import AccountState, SessionRecord
from billing_service.loops.reconcile import Reconciler

from .conftest import T0


def session(sid, user="ann", server="", started=T0, worker=""):
    return SessionRecord(
        sid, user, server, "T4", 1, 1_500_000, started, None, None, None, worker=worker
    )


def test_a_server_missing_twice_is_closed_when_last_seen():
    s = session("s1")
    seen, missing = {}, {}
    assert sessions_to_close([s], {("ann", "")}, seen, missing, T0 + timedelta(seconds=30)) == []
    assert sessions_to_close([s], set(), seen, missing, T0 + timedelta(seconds=60)) == []
    closed = sessions_to_close([s], set(), seen, missing, T0 + timedelta(seconds=90))
    assert closed == [(s, T0 + timedelta(seconds=30))]


def test_a_server_never_seen_is_closed_at_its_start_and_a_returning_one_is_kept():
    never = session("s2", user="bob")
    back = session("s3", user="cid")
    seen, missing = {}, {}
    sessions_to_close([never, back], set(), seen, missing, T0 + timedelta(seconds=10))
    # cid's server shows up again (it was starting): nothing is closed for it
    closed = sessions_to_close(
        [never, back], {("cid", "")}, seen, missing, T0 + timedelta(seconds=20)
    )
    assert closed == [(never, T0)]
    assert "s3" not in missing


def test_named_servers_are_told_apart_and_closed_sessions_forgotten():
    a, b = session("a", server="exp"), session("b", server="")
    seen, missing = {}, {}
    for _ in range(2):
        closed = sessions_to_close([a, b], {("ann", "exp")}, seen, missing, T0)
    assert closed == [(b, T0)]
    sessions_to_close([a], {("ann", "exp")}, seen, missing, T0)
    assert set(seen) == {"a"} and missing == {}


def test_a_restarted_billing_closes_at_the_persisted_last_seen():
    # this process never saw it, but an earlier one recorded last_seen_at
    s = session("s4", user="dee")
    seen_before = T0 + timedelta(seconds=40)
    s = SessionRecord(**{**s.__dict__, "last_seen_at": seen_before})
    seen, missing = {}, {}
    sessions_to_close([s], set(), seen, missing, T0 + timedelta(seconds=60))
    closed = sessions_to_close([s], set(), seen, missing, T0 + timedelta(seconds=90))
    assert closed == [(s, seen_before)]


def disk(sid, user="ann"):
    return SessionRecord(
        sid, user, f"disk:{sid}", "disk", 50, 200, T0, None, None, None, price_class="storage"
    )


def test_a_disk_is_never_closed_though_the_hub_runs_no_server_for_it():
    d, s = disk("d1"), session("s1")
    seen, missing = {}, {}
    for minutes in (1, 2, 3):
        closed = sessions_to_close([d, s], set(), seen, missing, T0 + timedelta(minutes=minutes))
    assert [c for c, _ in closed] == [s]
    assert "d1" not in missing and "d1" not in seen


class Hub:
    """The hub's REST API as the reconciler reads it: every user has no server."""

    def __init__(self):
        self.asked = []

    async def fetch(self, request):
        self.asked.append(request.url)

        class Response:
            body = json.dumps({"servers": {}}).encode()

        return Response()


async def test_reconciliation_does_not_ask_the_hub_about_users_with_disks_only():
    hub = Hub()
    accounts = [
        AccountState("ann", T0, 0, (disk("d1"),)),
        AccountState("bob", T0, 0, (session("s1", user="bob"), disk("d2", user="bob"))),
    ]
    closed = []

    async def load(now):
        return accounts

    async def close(session_id, ended_at):
        closed.append(session_id)
        return next(s for a in accounts for s in a.running if s.id == session_id)

    reconciler = Reconciler(
        load, close, api_url="http://hub/api", api_token="t", interval_seconds=30, http_client=hub
    )
    for minutes in (1, 2):
        await reconciler.check(T0 + timedelta(minutes=minutes))
    assert closed == ["s1"]
    assert set(hub.asked) == {"http://hub/api/users/bob"}


def listed(*workers):
    """The hub's workers answer: (name, state, session id, ended_at) per worker."""
    return workers_seen(
        {
            "workers": [
                {"name": n, "state": st, "session_id": sid, "ended_at": end}
                for n, st, sid, end in workers
            ]
        }
    )


def test_a_worker_gone_is_closed_and_its_servers_session_kept():
    server, w1, w2 = session("s"), session("s-w1", worker="w1"), session("s-w2", worker="w2")
    end = (T0 + timedelta(seconds=45)).isoformat()
    workers = {("ann", ""): listed(("w1", "ready", "s-w1", None), ("w2", "failed", "s-w2", end))}
    seen, missing = {}, {}
    for k in (1, 2):
        now = T0 + timedelta(minutes=k)
        closed = sessions_to_close([server, w1, w2], {("ann", "")}, seen, missing, now, workers)
    # the failed worker ends when the hub says it did; the server and ready worker go on
    assert closed == [(w2, T0 + timedelta(seconds=45))]
    # w1 no longer listed (nor its server's other state matters): closed when last seen
    workers = {("ann", ""): listed()}
    for k in (3, 4):
        now = T0 + timedelta(minutes=k)
        closed = sessions_to_close([server, w1], {("ann", "")}, seen, missing, now, workers)
    assert closed == [(w1, T0 + timedelta(minutes=2))]


def test_a_server_gone_is_closed_by_its_own_state_not_its_workers():
    server, w1 = session("s", server="gpu"), session("s-w1", server="gpu", worker="w1")
    workers = {("ann", "gpu"): listed(("w1", "stopping", "s-w1", None))}
    seen, missing = {}, {}
    for _ in (1, 2):
        closed = sessions_to_close([server, w1], set(), seen, missing, T0, workers)
    assert closed == [(server, T0)]
    # a worker session whose server's workers were not read is left alone
    for _ in (1, 2, 3):
        assert sessions_to_close([w1], set(), seen, missing, T0, {}) == []


def test_a_later_worker_of_the_same_name_does_not_keep_an_old_session():
    old = session("old-w1", worker="w1")
    workers = {("ann", ""): listed(("w1", "ready", "new-w1", None))}
    seen, missing = {}, {}
    for _ in (1, 2):
        closed = sessions_to_close([old], set(), seen, missing, T0, workers)
    assert closed == [(old, T0)]


class WorkersHub:
    """The hub's REST API and gputap's workers API as the reconciler reads them: ann's
    default server runs with worker w1 listed stopped; bob's server "gpu" is gone (404)."""

    def __init__(self):
        self.asked = []

    async def fetch(self, request):
        from tornado.httpclient import HTTPClientError

        self.asked.append(request.url)
        bodies = {
            "http://hub/api/users/ann": {"servers": {"": {}}},
            "http://hub/gputap/api/users/ann/server/workers": {
                "workers": [
                    {"name": "w1", "state": "stopped", "session_id": "a-w1",
                     "ended_at": (T0 + timedelta(seconds=30)).isoformat()},
                    {"name": "w2", "state": "ready", "session_id": "a-w2", "ended_at": None},
                ]
            },
        }  # fmt: skip
        if request.url not in bodies:
            raise HTTPClientError(404)

        class Response:
            body = json.dumps(bodies[request.url]).encode()

        return Response()


async def test_reconciler_asks_the_workers_api_for_worker_sessions():
    hub = WorkersHub()
    accounts = [
        AccountState(
            "ann",
            T0,
            0,
            (session("a"), session("a-w1", worker="w1"), session("a-w2", worker="w2")),
        ),
        AccountState("bob", T0, 0, (session("b-w1", user="bob", server="gpu", worker="w1"),)),
    ]
    closed = []

    async def load(now):
        return accounts

    async def close(session_id, ended_at):
        closed.append((session_id, ended_at))
        return next(s for a in accounts for s in a.running if s.id == session_id)

    reconciler = Reconciler(
        load, close, api_url="http://hub/api", api_token="t", interval_seconds=30, http_client=hub
    )
    for minutes in (1, 2):
        await reconciler.check(T0 + timedelta(minutes=minutes))
    assert sorted(closed) == [("a-w1", T0 + timedelta(seconds=30)), ("b-w1", T0)]
    assert set(hub.asked) == {
        "http://hub/api/users/ann",
        "http://hub/gputap/api/users/ann/server/workers",
        "http://hub/gputap/api/users/bob/servers/gpu/workers",
    }
