"""Data disks as storage sessions: priced per GB-hour, metered per second like servers,
paid from the user's own credit, never stopped, never GPU time (on SQLite and PostgreSQL)."""

from datetime import timedelta

import pytest

from billing_service.domain.enforcement import sessions_to_stop
from billing_service.domain.pod_facts import PodFacts
from billing_service.domain.reconciliation import sessions_to_close
from billing_service.domain.usage import daily_gpu_hours
from billing_service.handlers.views import account_view
from billing_service.store.pods import bind_pod, open_metered_sessions

from .conftest import T0


@pytest.fixture(autouse=True)
def books_balance(store):
    """The ledger check holds after every test."""
    yield
    assert [str(p) for p in store.check_ledger()] == []


def open_disk(store, sid="d1", user="ada", gb=100, at=T0, name="data"):
    record, created = store.start_session(sid, user, f"disk:{name}", "disk", gb, at, at, "storage")
    assert created
    return record


def test_a_disk_is_metered_per_second_with_interval_charges_and_one_final(store):
    # the settings name no disk price: 0.0002 per GB-hour, 100 GB = 0.02/h = 20_000 micro/h
    disk = open_disk(store)
    assert (disk.price_per_hour_micro, disk.count, disk.price_class) == (200, 100, "storage")
    assert store.post_interval_charges(T0 + timedelta(seconds=95), 30) == 1
    # replays of the same pass change nothing
    assert store.post_interval_charges(T0 + timedelta(seconds=95), 30) == 0
    [running] = store.sessions("ada", "running")
    assert running.charged_micro == 20_000 * 90 // 3600 == 500
    ended = store.stop_session("d1", T0 + timedelta(seconds=3601, milliseconds=500), T0)
    # exactly 3601 whole seconds: floor(20_000 x 3601 / 3600)
    assert (ended.billed_seconds, ended.cost_micro, ended.charged_micro) == (3601, 20_005, 20_005)
    assert store.stop_session("d1", T0 + timedelta(days=1), T0) == ended
    txs = [t for t in store.transactions("ada") if t.kind == "charge"]
    assert [t.idempotency_key for t in txs] == ["charge:d1:3", "charge:d1:final"]
    assert sum(t.amount_micro for t in txs) == -20_005
    # from the trial pool, to revenue
    assert txs[1].postings[0] == ("user:ada:trial", -19_505)
    assert store.account("ada", T0).balance_micro == 10_000_000 - 20_005


@pytest.mark.parametrize(
    "server_name, sku, price_class, extra, says",
    [
        ("disk:data", "T4", "storage", {}, "'storage' is for data disks only"),
        ("disk:data", "disk", "on-demand", {}, "send price_class 'storage'"),
        ("data", "disk", "storage", {}, "server_name: a data disk's storage session is named"),
        ("disk:", "disk", "storage", {}, "server_name"),
        ("disk:data", "disk", "storage", {"hold_id": "h1"}, "hold_id: data disks take no"),
        ("disk:data", "disk", "storage", {"course": "dl101"}, "course: a course's hours never"),
    ],
)
def test_a_storage_session_must_be_a_disk_named_disk_colon(
    store, server_name, sku, price_class, extra, says
):
    with pytest.raises(ValueError, match=says):
        store.start_session("d1", "ada", server_name, sku, 10, T0, T0, price_class, **extra)
    assert store.sessions(None) == []


def test_disks_need_no_admission(store):
    for sku, price_class in [("disk", "storage"), ("disk", "on-demand"), ("T4", "storage")]:
        with pytest.raises(ValueError):
            store.admit("ada", sku, 10, T0, price_class)
    with pytest.raises(ValueError, match="Data disks need no admission"):
        store.admit("ada", "disk", 10, T0, "storage")


def test_disks_alone_are_never_stopped_the_balance_goes_negative_and_spawns_are_refused(store):
    store.open_account("ada", T0)
    store.adjust("ada", 10_000 - 10_000_000, "leave 0.01", "k1", T0)
    # 1000 GB at 0.0002 = 0.20/h: the 0.01 lasts 3 minutes
    open_disk(store, gb=1000)
    later = T0 + timedelta(hours=1)
    store.post_interval_charges(later, 30)
    state = store.account("ada", later)
    assert state.balance_micro == 10_000 - 200_000
    assert sessions_to_stop([state], later, 5) == []
    view = account_view(state, later, "credits", (900, 300))
    assert view["seconds_left"] == 0 and view["rate_per_hour_micro"] == 200_000
    assert view["running"] == [] and [s["server_name"] for s in view["storage"]] == ["disk:data"]
    assert view["storage"][0]["cost_micro"] == 200_000
    [warning] = view["warnings"]
    assert "data disks are never stopped: the balance goes below zero" in warning["message"]
    admission = store.admit("ada", "cpu", 1, later)
    assert not admission.allowed
    assert admission.message.endswith(
        "Stop a running server or ask an admin for credit. Your data disks cost 0.20/h while "
        "they exist; delete one you no longer need."
    )
    # credit added: spawns pass again, the disk still runs
    store.grant("ada", "topup", 5_000_000, "top-up", "t1", later)
    assert store.admit("ada", "cpu", 1, later).allowed
    assert [s.id for s in store.sessions("ada", "running")] == ["d1"]


def test_out_of_credit_with_a_server_and_a_disk_stops_the_server_only(store):
    store.open_account("ada", T0)
    store.adjust("ada", 100_000 - 10_000_000, "leave 0.10", "k1", T0)
    open_disk(store, gb=1000)
    store.start_session("s1", "ada", "gpu", "cpu", 1, T0, T0)
    # 0.10/h (cpu) + 0.20/h (disk) = 0.30/h: 0.10 lasts 20 minutes, the server alone 60
    state = store.account("ada", T0 + timedelta(minutes=19, seconds=58))
    assert [s.id for s in state.servers] == ["s1"] and [s.id for s in state.disks] == ["d1"]
    stop = sessions_to_stop([state], T0 + timedelta(minutes=19, seconds=58), 5)
    assert [s.id for s in stop] == ["s1"]
    assert sessions_to_stop([state], T0 + timedelta(minutes=19), 5) == []


def test_a_course_allowance_never_pays_for_a_disk(store):
    store.open_account("stu", T0)
    store.grant("stu", "allowance", 3_000_000, "week 1", "a1", T0, course="dl101")
    store.adjust("stu", -10_000_000, "no trial", "k1", T0)
    open_disk(store, user="stu", gb=1000)
    later = T0 + timedelta(hours=1)
    store.post_interval_charges(later, 30)
    state = store.account("stu", later)
    assert state.pools["user:stu:allowance:dl101"] == 3_000_000
    # the trial pool paid first, as always (the adjustment left the balance at zero)
    assert state.pools["user:stu:trial"] == 10_000_000 - 200_000
    assert state.pools["user:stu:paid"] == -10_000_000
    # the allowance is no money the disk may use: the disk's group has nothing left
    [(course, available, sessions)] = state.funding_groups(later)
    assert (course, available, [s.id for s in sessions]) == ("", -200_000, ["d1"])


def test_reconciliation_and_the_pod_meter_never_close_a_disk_and_usage_counts_no_gpu(store):
    disk = open_disk(store)
    store.start_session("s1", "ada", "", "A100-80GB", 2, T0, T0)
    running = store.sessions("ada", "running")
    seen, missing = {}, {}
    for minutes in (1, 2):
        closed = sessions_to_close(running, set(), seen, missing, T0 + timedelta(minutes=minutes))
    assert [s.id for s, _ in closed] == ["s1"]
    # a pod naming the disk's session (a bad annotation) never makes it the meter's to close
    facts = PodFacts(
        username="ada",
        server_name="gpu",
        sku="T4",
        count=1,
        price_class="on-demand",
        session_id=disk.id,
        namespace="gputap",
        pod_name="jupyter-ada",
        pod_uid="uid-1",
        course="",
        started_at=T0,
        ended_at=None,
        finished=False,
    )
    bind_pod(store.engine, facts, T0)
    assert open_metered_sessions(store.engine, "gputap") == []
    # GPU-hours: the two A100s for an hour; the 100 GB disk counts nothing
    usage = daily_gpu_hours(store.sessions("ada"), T0 + timedelta(hours=1), T0, None)
    assert [d["gpu_seconds"] for d in usage] == [7200]
    store.stop_session("s1", T0 + timedelta(hours=1), T0 + timedelta(hours=1))
    store.stop_session("d1", T0 + timedelta(hours=1), T0 + timedelta(hours=1))
