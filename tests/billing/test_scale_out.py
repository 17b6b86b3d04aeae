"""Scale-out workers in the store, on SQLite and PostgreSQL: a worker's session beside its
server's, charged and settled apart; what enforcement decides for them from the database."""

from datetime import timedelta

import pytest

from billing_service.domain.enforcement import sessions_to_stop

from .conftest import T0


@pytest.fixture(autouse=True)
def books_balance(store):
    yield
    assert [str(p) for p in store.check_ledger()] == []


def test_a_server_and_its_worker_are_open_at_once_and_settled_apart(store):
    server, created = store.start_session("s", "ada", "gpu", "RTX-4090", 1, T0, T0)
    assert created and server.worker == ""
    worker, created = store.start_session("s-w1", "ada", "gpu", "RTX-4090", 1, T0, T0, worker="w1")
    assert created and worker.worker == "w1" and worker.server_name == "gpu"
    running = store.sessions("ada", "running")
    assert sorted((s.id, s.worker) for s in running) == [("s", ""), ("s-w1", "w1")]
    ended = store.stop_session("s-w1", T0 + timedelta(seconds=36), T0)
    assert ended.worker == "w1" and ended.cost_micro == 50_000  # 36 s at 5.00/h
    assert [s.id for s in store.sessions("ada", "running")] == ["s"]
    [charge] = [t for t in store.transactions("ada") if t.session_id == "s-w1"]
    assert charge.memo == "ada/gpu#w1: 1 x RTX-4090"


def test_a_data_disk_has_no_workers(store):
    with pytest.raises(ValueError, match="worker"):
        store.start_session(
            "d", "ada", "disk:data", "disk", 10, T0, T0, "storage", worker="w1"
        )  # fmt: skip


def test_enforcement_on_stored_sessions_stops_the_workers_first(store):
    # 10.00 of trial; a server and two workers at 5.00/h each: 15.00/h
    store.start_session("s", "ada", "gpu", "RTX-4090", 1, T0, T0)
    for k in (1, 2):
        store.start_session(f"s-w{k}", "ada", "gpu", "RTX-4090", 1, T0, T0, worker=f"w{k}")
    # 10.00 lasts 40 min at 15.00/h: with 4 s of it left, the workers stop, the server (12 s
    # of it left alone) goes on
    now = T0 + timedelta(minutes=40) - timedelta(seconds=4)
    stop = sessions_to_stop(store.accounts_with_running_sessions(now), now, 5)
    assert sorted(s.id for s in stop) == ["s-w1", "s-w2"]
    # 1 s left: the server would not last either
    now = T0 + timedelta(minutes=40) - timedelta(seconds=1)
    stop = sessions_to_stop(store.accounts_with_running_sessions(now), now, 5)
    assert sorted(s.id for s in stop) == ["s", "s-w1", "s-w2"]
