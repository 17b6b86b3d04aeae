"""The pod meter: pod -> billing facts (pure), and the meter against the simulated cluster.

The meter tests run it in the test's event loop with the cluster (tests/kube_sim) and a store
on SQLite: they stop it to play billing being down, and start a new one as a restart would.
"""

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from kubernetes_asyncio import client
from sqlalchemy import select

from billing_service.app import make_meter
from billing_service.config import billing_config
from billing_service.domain.pod_facts import MeteredSession, killed_at, pod_facts, vanished_end
from billing_service.loops import kube_meter
from billing_service.loops.kube_meter import KubeConfigMissing, KubeMeter
from billing_service.orm import BillingSession
from gputap_common.settings import load_settings
from tests.kube_sim import SimulatedCluster, admin_key
from tests.kube_sim.api import EVENT, NAMESPACE, POD
from tests.waiting import wait_for_async

from .conftest import make_store
from .kube_pods import NAMESPACE as NS
from .kube_pods import Truth, gputap_pod, killing_times

T0 = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)


def t(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def at(seconds: float) -> str:
    """``t(seconds)`` as the API writes times."""
    return t(seconds).strftime("%Y-%m-%dT%H:%M:%SZ")


def api_pod(phase="Running", state=None, last_state=None, **meta):
    """A gputap pod as the API returns it, created at T0, in ``phase``."""
    metadata = {
        "name": "jupyter-ada",
        "namespace": "gputap",
        "uid": "0b5e-uid",
        "creationTimestamp": at(0),
        "labels": {"gputap.io/user": "ada", "gputap.io/count": "2",
                   "gputap.io/price-class": "spot"},
        "annotations": {"gputap.io/user": "ada@uni.edu", "gputap.io/server": "gpu",
                        "gputap.io/offering": "A100-80GB", "gputap.io/session": "s-1"},
    }  # fmt: skip
    metadata.update(meta)
    status = {"phase": phase}
    if state is not None:
        status["containerStatuses"] = [
            {"name": "notebook", "state": state, "lastState": last_state or {}}
        ]
    return {"metadata": metadata, "spec": {"containers": [{"name": "notebook"}]}, "status": status}


# -- pod -> facts ------------------------------------------------------------------------------


def test_a_pending_or_creating_pod_is_not_billed_yet():
    for pod in (
        api_pod("Pending"),
        api_pod("Pending", {"waiting": {"reason": "ContainerCreating"}}),
        api_pod("Pending", {"waiting": {"reason": "ErrImagePull"}}),
    ):
        facts = pod_facts(pod)
        assert facts.started_at is None and facts.ended_at is None
        assert not facts.finished and not facts.running


def test_a_running_pod_names_its_session_and_what_to_bill():
    facts = pod_facts(api_pod(state={"running": {"startedAt": at(42)}}))
    assert facts.session_id == "s-1"
    assert (facts.username, facts.server_name) == ("ada@uni.edu", "gpu")  # annotations, as is
    assert (facts.sku, facts.count, facts.price_class) == ("A100-80GB", 2, "spot")
    assert (facts.namespace, facts.pod_name, facts.pod_uid) == ("gputap", "jupyter-ada", "0b5e-uid")
    assert facts.started_at == t(42)
    assert facts.ended_at is None and facts.running
    assert facts.course == ""  # the user's own credit pays


def test_a_course_funded_pod_names_its_course():
    pod = api_pod(state={"running": {"startedAt": at(1)}})
    pod["metadata"]["annotations"]["gputap.io/course"] = "dl-2026"
    assert pod_facts(pod).course == "dl-2026"


def test_a_pod_names_the_environment_its_server_runs():
    pod = api_pod(state={"running": {"startedAt": at(1)}})
    assert pod_facts(pod).environment == ""
    pod["metadata"]["annotations"]["gputap.io/environment"] = "torch"
    assert pod_facts(pod).environment == "torch"


def test_a_worker_pod_is_metered_by_its_worker_container_as_its_worker():
    """A worker of the server's group (docs/scale-out.md): its own session, its container
    ``worker``; a pod that names a worker but has no such container is not guessed at."""
    pod = api_pod(state={"running": {"startedAt": at(5)}})
    pod["metadata"]["annotations"]["gputap.io/worker"] = "w2"
    pod["spec"]["containers"] = [{"name": "worker"}]
    pod["status"]["containerStatuses"][0]["name"] = "worker"
    facts = pod_facts(pod)
    assert (facts.worker, facts.server_name, facts.started_at) == ("w2", "gpu", t(5))
    pod["spec"]["containers"] = [{"name": "notebook"}]
    with pytest.raises(ValueError, match="no container named 'worker'"):
        pod_facts(pod)
    pod["metadata"]["annotations"]["gputap.io/worker"] = "worker-2"
    with pytest.raises(ValueError, match="must be w1 to w999"):
        pod_facts(pod)
    assert pod_facts(api_pod(state={"running": {"startedAt": at(5)}})).worker == ""


def test_a_pod_without_session_annotation_is_its_own_session():
    pod = api_pod(state={"running": {"startedAt": at(1)}})
    del pod["metadata"]["annotations"]["gputap.io/session"]
    assert pod_facts(pod).session_id == "pod-0b5e-uid"


def test_a_finished_pod_ends_at_its_container_finish():
    state = {"terminated": {"startedAt": at(10), "finishedAt": at(70), "exitCode": 0}}
    facts = pod_facts(api_pod("Succeeded", state))
    assert (facts.started_at, facts.ended_at) == (t(10), t(70))
    assert facts.finished and not facts.running


def test_a_container_that_will_restart_keeps_its_session_open_from_its_first_start():
    last = {"terminated": {"startedAt": at(10), "finishedAt": at(20), "exitCode": 1}}
    waiting = api_pod("Running", {"waiting": {"reason": "CrashLoopBackOff"}}, last)
    restarted = api_pod("Running", {"running": {"startedAt": at(30)}}, last)
    for pod in (waiting, restarted):
        facts = pod_facts(pod)
        assert facts.started_at == t(10)
        assert facts.ended_at is None and not facts.finished


def test_a_pod_being_deleted_ends_at_the_deletion_request():
    # deletionTimestamp is the request time plus the grace period
    pod = api_pod(
        state={"running": {"startedAt": at(10)}},
        deletionTimestamp=at(130),
        deletionGracePeriodSeconds=30,
    )
    facts = pod_facts(pod)
    assert facts.ended_at == t(100)
    assert facts.finished and not facts.running


def test_a_pod_deleted_after_it_finished_ends_at_its_finish():
    state = {"terminated": {"startedAt": at(10), "finishedAt": at(50)}}
    pod = api_pod("Failed", state, deletionTimestamp=at(90), deletionGracePeriodSeconds=30)
    assert pod_facts(pod).ended_at == t(50)


def test_a_pod_that_failed_without_a_container_end_is_finished_with_no_end_yet():
    pod = api_pod("Failed", {"running": {"startedAt": at(10)}}, reason="Preempted")
    facts = pod_facts(pod)
    assert facts.finished and facts.ended_at is None


@pytest.mark.parametrize("minutes", [7, -7])
def test_times_from_a_node_whose_clock_is_off_are_read_on_the_api_servers_clock(minutes):
    def on_node(seconds: float) -> str:
        return (t(seconds) + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")

    state = {"terminated": {"startedAt": on_node(10), "finishedAt": on_node(70)}}
    pod = api_pod("Succeeded", state)
    # bound by the API server at 2 s, taken by the node's kubelet at once (its clock)
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": at(2)}
    ]
    pod["status"]["startTime"] = on_node(2)
    facts = pod_facts(pod)
    assert (facts.started_at, facts.ended_at) == (t(10), t(70))


def test_a_container_that_never_started_reports_no_start():
    # a runtime reports the zero time for a container that failed to start
    state = {"terminated": {"startedAt": "1970-01-01T00:00:00Z", "finishedAt": at(5),
                            "reason": "StartError", "exitCode": 128}}  # fmt: skip
    facts = pod_facts(api_pod("Failed", state))
    assert facts.started_at is None


def test_pods_that_are_not_gputap_servers_are_skipped():
    for key in ("gputap.io/user", "gputap.io/offering"):
        pod = api_pod(state={"running": {"startedAt": at(1)}})
        del pod["metadata"]["annotations"][key]
        assert pod_facts(pod) is None
    assert pod_facts({"metadata": {"name": "other", "labels": {}}}) is None


@pytest.mark.parametrize(
    "change, message",
    [
        ({"labels": {"gputap.io/user": "ada", "gputap.io/count": "two"}}, "gputap.io/count"),
        ({"labels": {"gputap.io/user": "ada", "gputap.io/count": "0"}}, "gputap.io/count"),
        (
            {
                "labels": {
                    "gputap.io/user": "ada",
                    "gputap.io/count": "1",
                    "gputap.io/price-class": "cheap",
                }
            },
            "gputap.io/price-class",
        ),  # fmt: skip
    ],
)
def test_a_gputap_pod_billing_cannot_read_is_refused_by_name(change, message):
    with pytest.raises(ValueError, match=message) as e:
        pod_facts(api_pod(**change))
    assert "gputap/jupyter-ada" in str(e.value)


def test_a_gputap_pod_without_a_notebook_container_is_refused():
    pod = api_pod(state={"running": {"startedAt": at(1)}})
    pod["spec"]["containers"] = [{"name": "main"}]
    with pytest.raises(ValueError, match="notebook"):
        pod_facts(pod)


# -- sessions whose pod is gone ------------------------------------------------------------------


def metered(last_seen=None):
    return MeteredSession("s-1", "gputap", "jupyter-ada", "0b5e-uid", "ada", "",
                          t(10), last_seen)  # fmt: skip


def killing(seconds, uid="0b5e-uid", name="jupyter-ada", reason="Killing"):
    involved = {"kind": "Pod", "namespace": "gputap", "name": name}
    if uid:
        involved["uid"] = uid
    return {"reason": reason, "involvedObject": involved, "firstTimestamp": at(seconds),
            "lastTimestamp": at(seconds)}  # fmt: skip


def test_a_vanished_pod_ends_at_its_last_killing_event():
    events = [
        killing(50),
        killing(80),  # e.g. a probe restarted it at 50, the deletion killed it at 80
        killing(90, uid="other-pod"),
        killing(95, reason="Pulled"),
    ]
    assert killed_at(events, metered()) == t(80)
    assert vanished_end(metered(t(60)), t(80)) == t(80)


def test_an_event_without_uid_counts_by_name_only_after_the_session_started():
    assert killed_at([killing(5, uid="")], metered()) is None  # an older pod of that name
    assert killed_at([killing(40, uid="")], metered()) == t(40)
    # a later server may have reused the name: the earliest kill after the start
    assert killed_at([killing(70, uid=""), killing(40, uid="")], metered()) == t(40)
    assert killed_at([killing(70, uid=""), killing(80)], metered()) == t(80)  # uid first


def test_without_an_event_a_vanished_pod_ends_when_last_seen_else_at_its_start():
    seen = t(60)
    assert vanished_end(metered(seen), None) == seen
    assert vanished_end(metered(None), None) == t(10)
    # a clock behind the session's start never makes it end before it started
    assert vanished_end(metered(None), T0) == t(10)


# -- the meter on the simulated cluster ----------------------------------------------------------


@pytest.fixture
async def cluster():
    async with SimulatedCluster(crash_backoff=0.3, max_grace_seconds=1) as cluster:
        cluster.add_node("cpu-1", allocatable={"cpu": "64", "memory": "256Gi", "pods": "100"})
        cluster.api.create(NAMESPACE, "", {"metadata": {"name": NS}})
        truth = Truth()
        cluster.api.store.subscribe(truth)
        cluster.truth = truth
        yield cluster


@pytest.fixture
def store(tmp_path):
    store = make_store(f"sqlite:///{tmp_path}/billing.sqlite")
    yield store
    store.engine.dispose()


class Meters:
    """Starts meters on the cluster as billing would (one database thread); each start is a
    fresh process's meter, and stopping one is billing going down."""

    def __init__(self, store, cluster):
        self.store = store
        self.executor = ThreadPoolExecutor(1)
        self.api_client = client.ApiClient(
            client.Configuration(host=cluster.url, api_key=admin_key(cluster))
        )
        self.tasks: dict[KubeMeter, asyncio.Task] = {}

    async def start(self, seen_interval_seconds=0.3, start_grace_seconds=0, **watch) -> KubeMeter:
        """A meter as billing makes it; ``watch_seconds`` overrides its watch window."""
        meter = KubeMeter(
            self.store,
            self.executor,
            client.CoreV1Api(self.api_client),
            NS,
            seen_interval_seconds=seen_interval_seconds,
            start_grace_seconds=start_grace_seconds,
            **watch,
        )
        self.tasks[meter] = asyncio.ensure_future(meter.run())
        await wait_for_async(lambda: meter.synced, timeout=15)  # listed and watching
        return meter

    async def stop(self, meter: KubeMeter) -> None:
        task = self.tasks.pop(meter)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def close(self) -> None:
        for meter in list(self.tasks):
            await self.stop(meter)
        await self.api_client.close()
        self.executor.shutdown(wait=True)


@pytest.fixture
async def meters(cluster, store):
    meters = Meters(store, cluster)
    yield meters
    await meters.close()


def session(store, session_id):
    return next((s for s in store.sessions(None) if s.id == session_id), None)


def last_seen(store, session_id):
    with store.engine.connect() as db:
        return db.scalar(select(BillingSession.last_seen_at).where(BillingSession.id == session_id))


def running_start(cluster, name):
    status = cluster.api.get(POD, NS, name)["status"]
    started = status["containerStatuses"][0]["state"]["running"]["startedAt"]
    return datetime.fromisoformat(started)


@pytest.mark.parametrize("evidence", ["killing event", "last seen", "start"])
async def test_a_pod_deleted_while_billing_is_down_is_closed_at_its_last_known_end(
    cluster, store, meters, evidence
):
    # never marked seen when the evidence is to be the start (no timer, no relist); else
    # recorded every 0.3 s as seen when last known current: each relist, each watch (1 s)
    # that ended on time
    never = evidence == "start"
    meter = await meters.start(
        seen_interval_seconds=3600 if never else 0.3, watch_seconds=300 if never else 1
    )
    cluster.api.create(POD, NS, gputap_pod("jupyter-ada", "ada", session_id="s-ada"))
    await wait_for_async(lambda: session(store, "s-ada"), timeout=15)
    started = running_start(cluster, "jupyter-ada")
    assert session(store, "s-ada").started_at == started
    await asyncio.sleep(3)  # running, and seen running
    await meters.stop(meter)  # billing is down from here
    seen = last_seen(store, "s-ada")
    await asyncio.sleep(1.6)
    cluster.api.delete(POD, NS, "jupyter-ada")
    await wait_for_async(lambda: not cluster.pods(NS), timeout=15)
    [uid] = cluster.truth.snapshot()
    killed = killing_times(cluster.events(NS))[uid]
    if evidence != "killing event":
        for event in cluster.events(NS, "jupyter-ada"):
            cluster.api.delete(EVENT, NS, event["metadata"]["name"])
    await asyncio.sleep(1.1)  # a restart well after the pod went

    await meters.start()
    closed = await wait_for_async(
        lambda: (s := session(store, "s-ada")) and s.ended_at and s, timeout=15
    )
    expected = {"killing event": killed, "last seen": seen, "start": started}[evidence]
    assert closed.ended_at == expected
    assert closed.billed_seconds == int((expected - started).total_seconds())
    if evidence == "last seen":
        assert started + timedelta(seconds=1) < seen < killed
    if evidence == "start":
        assert seen is None and closed.billed_seconds == 0 and closed.cost_micro == 0


@pytest.mark.parametrize("code", [500, 403, 429])
async def test_a_pod_list_the_api_refuses_is_not_an_empty_namespace(cluster, store, meters, code):
    """The client hands an error answer over as is when asked for the raw JSON (as the meter
    lists): a refused list is an error to retry, never a namespace without pods whose
    sessions all vanished."""
    await meters.start(watch_seconds=1)  # each watch ends in a relist after a second
    cluster.api.create(POD, NS, gputap_pod("jupyter-ada", "ada", session_id="s-ada"))
    await wait_for_async(lambda: session(store, "s-ada"), timeout=15)
    rule = cluster.faults.fail_requests(1.0, code=code, verbs=["GET"], path=r"/pods$",
                                        watches=False)  # fmt: skip
    await wait_for_async(lambda: cluster.faults.injected >= 2, timeout=15)  # two relists refused
    cluster.faults.rules.remove(rule)
    await asyncio.sleep(1.5)
    assert session(store, "s-ada").ended_at is None
    assert [p["metadata"]["name"] for p in cluster.pods(NS)] == ["jupyter-ada"]


async def test_every_watch_event_delivered_twice_bills_each_pod_once(cluster, store, meters):
    cluster.faults.duplicate_watch_events()
    await meters.start()  # listed: what follows arrives through the (doubled) watch
    make = cluster.api.create
    make(POD, NS, gputap_pod("exits", "ada", "T4", seconds=1.5, session_id="s-exits"))
    make(POD, NS, gputap_pod("deleted", "ada", "A100-80GB", count=2, session_id="s-deleted"))
    make(POD, NS, gputap_pod("no-id", "bob", "cpu"))
    make(POD, NS, gputap_pod("spot-slice", "bob", "A100-80GB/1g.10gb", price_class="spot",
                             session_id="s-spot"))  # fmt: skip
    crash = ["/bin/sh", "-c", "sleep 1; exit 3"]
    make(POD, NS, gputap_pod("crashes", "cy", "L40S", command=crash, restart_policy="OnFailure",
                             session_id="s-crashes"))  # fmt: skip
    make(POD, NS, gputap_pod("pending", "cy", "T4", session_id="s-pending",
                             node_selector={"nvidia.com/gpu.product": "Tesla-T4"}))  # fmt: skip
    make(POD, NS, gputap_pod("unpriced", "cy", "Z9000", session_id="s-unpriced"))
    await asyncio.sleep(2.5)  # "exits" has ended; "crashes" has been restarted
    for name in ("deleted", "crashes", "pending"):
        cluster.api.delete(POD, NS, name)
    await wait_for_async(lambda: {p["metadata"]["name"] for p in cluster.pods(NS)}
                == {"exits", "no-id", "spot-slice", "unpriced"}, timeout=15)  # fmt: skip
    for name in ("no-id",):
        cluster.api.delete(POD, NS, name)
    await wait_for_async(lambda: len(cluster.pods(NS)) == 3, timeout=15)
    truth = {t.name: t for t in cluster.truth.snapshot().values()}
    ended = {"exits", "deleted", "no-id", "crashes"}

    def settled():
        sessions = {s.id: s for s in store.sessions(None)}
        closed = {s.id for s in sessions.values() if s.ended_at}
        return sessions if {truth[n].session_id for n in ended} <= closed else None

    sessions = await wait_for_async(settled, timeout=15)
    assert cluster.faults.duplicated > 20
    # one session per pod that ran and has a price, nothing for the pending or unpriced pod
    assert set(sessions) == {truth[n].session_id for n in ended | {"spot-slice"}}
    assert truth["no-id"].session_id == f"pod-{truth['no-id'].uid}"
    killed = killing_times(cluster.events(NS))
    for name in ended:
        t, s = truth[name], sessions[truth[name].session_id]
        assert (s.username, s.sku, s.count, s.price_class) == (
            t.username, t.sku, t.count, t.price_class)  # fmt: skip
        assert s.started_at == t.started  # a restarted container bills from its first start
        assert s.ended_at == t.end and s.billed_seconds == t.seconds()
        if t.uid in killed:
            assert abs((killed[t.uid] - s.ended_at).total_seconds()) <= 1
    assert truth["exits"].finished and truth["exits"].seconds() in (1, 2)
    assert sessions["s-deleted"].billed_seconds >= 2 and truth["crashes"].started
    assert sessions["s-spot"].ended_at is None and sessions["s-spot"].price_class == "spot"
    costs = {}
    for s in sessions.values():
        if s.ended_at:
            costs[s.username] = costs.get(s.username, 0) + s.cost_micro
            assert s.cost_micro == s.price_per_hour_micro * s.count * s.billed_seconds // 3600
    now = datetime.now(UTC)
    for user in ("ada", "bob", "cy"):
        assert store.account(user, now).balance_micro == 10_000_000 - costs.get(user, 0)
    assert store.check_ledger() == []


async def test_a_pod_billing_cannot_bill_is_reported_once_not_at_every_relist(
    cluster, store, meters, caplog, monkeypatch
):
    caplog.set_level(logging.WARNING, logger="billing.meter")
    await meters.start(watch_seconds=1)  # a relist every 2 s
    cluster.api.create(POD, NS, gputap_pod("unpriced", "cy", "Z9000", session_id="s-unpriced"))
    cluster.api.create(POD, NS, gputap_pod("no-count", "cy", "T4", count=0, session_id="s-zero"))
    await wait_for_async(
        lambda: all(p["status"].get("phase") == "Running" for p in cluster.pods(NS)), timeout=15
    )
    await asyncio.sleep(5)
    lines = [r.getMessage() for r in caplog.records]
    assert len([line for line in lines if "gputap/unpriced" in line]) == 1, lines
    assert len([line for line in lines if "gputap/no-count" in line]) == 1, lines
    assert store.sessions(None) == []
    monkeypatch.setattr(kube_meter, "REFUSAL_REMINDER_SECONDS", 0)  # a reminder is due
    await wait_for_async(
        lambda: len([r for r in caplog.records if "gputap/unpriced" in r.getMessage()]) > 1,
        timeout=15,
    )


async def test_the_meter_never_bills_a_disk_pod_nor_closes_a_disk_session(cluster, store, meters):
    """A pod is a server: one offering "disk", or naming a data disk's storage session,
    is refused, and the disk's session stays open after the pod is gone."""
    now = datetime.now(UTC)
    store.start_session("d-1", "ada", "disk:data", "disk", 50, now, now, "storage")
    meter = await meters.start()
    make = cluster.api.create
    make(POD, NS, gputap_pod("names-disk", "ada", "T4", seconds=1, session_id="d-1"))
    make(POD, NS, gputap_pod("is-disk", "ada", "disk", seconds=1, session_id="s-disk"))
    await wait_for_async(
        lambda: all(p["status"].get("phase") == "Succeeded" for p in cluster.pods(NS)), timeout=15
    )
    for name in ("names-disk", "is-disk"):
        cluster.api.delete(POD, NS, name)
    await wait_for_async(lambda: not cluster.pods(NS), timeout=15)
    await meters.stop(meter)
    await meters.start()  # a restart closes vanished pods' sessions: not the disk's
    [disk] = store.sessions(None)
    assert (disk.id, disk.ended_at, disk.price_class) == ("d-1", None, "storage")


async def test_the_spawner_opens_the_session_in_the_start_grace_else_billing_does(
    cluster, store, meters
):
    meter = await meters.start(start_grace_seconds=2)
    # the spawner's admission holds credit, and its start hands the hold to the session
    admission = store.admit("ada", "A100-80GB", 1, datetime.now(UTC), idempotency_key="s-hub")
    assert [h.id for h in store.holds("ada", datetime.now(UTC))] == [admission.hold.id]
    cluster.api.create(POD, NS, gputap_pod("by-hub", "ada", session_id="s-hub"))
    hub_down = gputap_pod("hub-down", "bob", "T4", session_id="s-meter", environment="torch")
    cluster.api.create(POD, NS, hub_down)
    pods = await wait_for_async(lambda: (p := cluster.truth.snapshot()) and all(
        t.started for t in p.values()) and {t.session_id: t for t in p.values()},
        timeout=15)  # fmt: skip
    await asyncio.sleep(0.5)
    assert session(store, "s-meter") is None and session(store, "s-hub") is None  # waiting
    started = pods["s-hub"].started
    store.start_session("s-hub", "ada", "", "A100-80GB", 1, started, datetime.now(UTC),
                        hold_id=admission.hold.id)  # fmt: skip
    # the hub never opens the other one: billing does once the grace is over, from the start
    opened = await wait_for_async(lambda: session(store, "s-meter"), timeout=10)
    assert opened.started_at == pods["s-meter"].started
    assert opened.environment == "torch"  # what the pod's annotation says it runs
    assert datetime.now(UTC) - pods["s-meter"].started >= timedelta(seconds=2)
    assert store.holds("ada", datetime.now(UTC)) == []  # the session took the hold over
    assert session(store, "s-hub").started_at == started
    # both pods were bound at first sight, so after a restart billing closes the hub's
    # session too when its pod vanished meanwhile
    await meters.stop(meter)
    for name in ("by-hub", "hub-down"):
        cluster.api.delete(POD, NS, name)
    await wait_for_async(lambda: not cluster.pods(NS), timeout=15)
    killed = killing_times(cluster.events(NS))
    await meters.start(start_grace_seconds=2)
    for session_id in ("s-hub", "s-meter"):
        closed = session(store, session_id)
        assert closed.ended_at == killed[pods[session_id].uid]


async def test_dropped_watches_and_api_errors_delay_the_meter_but_lose_nothing(
    cluster, store, meters
):
    cluster.faults.drop_watches(after_events=2)
    cluster.faults.fail_requests(0.3, code=503, verbs=["GET"], path=r"/pods|/events")
    await meters.start()
    make = cluster.api.create
    make(POD, NS, gputap_pod("exits", "ada", "T4", seconds=1.2, session_id="s-exits"))
    make(POD, NS, gputap_pod("deleted", "ada", "L40S", session_id="s-deleted"))
    await wait_for_async(
        lambda: (p := cluster.truth.snapshot()) and all(t.started for t in p.values()), timeout=15
    )
    await asyncio.sleep(1.5)
    cluster.api.delete(POD, NS, "deleted")
    await wait_for_async(lambda: len(cluster.pods(NS)) == 1, timeout=15)
    truth = {t.session_id: t for t in cluster.truth.snapshot().values()}

    def settled():
        sessions = {s.id: s for s in store.sessions(None) if s.ended_at}
        return sessions if set(sessions) == set(truth) else None

    sessions = await wait_for_async(settled, timeout=30)
    assert cluster.faults.injected > 0
    for session_id, t in truth.items():
        assert (sessions[session_id].started_at, sessions[session_id].ended_at) == (
            t.started,
            t.end,
        )


#: how soon the meter, as billing runs it, closes a session whose pod ended while its watch was
#: silent: a watch lasts WATCH_SECONDS (10 s) and is given up 5 s after it should have ended,
#: then billing relists after 1 s (docs/kubernetes.md, "Watches": 16 s); the rest is slack for
#: a loaded machine. The hub's own watches have the same 15 s bound (tests/kube/
#: test_kube_silent_watch.py allows 25 s).
NOTICED_WITHIN = 30


@pytest.mark.parametrize("evidence", ["killing event", "last seen"])
async def test_a_pod_that_ends_behind_a_silent_watch_is_billed_to_its_end_soon(
    cluster, store, meters, evidence
):
    await meters.start()  # its watch window as billing runs it
    cluster.api.create(POD, NS, gputap_pod("quiet", "ada", "L40S", session_id="s-quiet"))
    await wait_for_async(lambda: session(store, "s-quiet"), timeout=15)
    await asyncio.sleep(1.5)  # running, and seen running
    cluster.faults.silence_watches()  # the open watch too: nothing more arrives, nothing ends
    silenced = datetime.now(UTC)
    cluster.api.delete(POD, NS, "quiet")
    await wait_for_async(lambda: not cluster.pods(NS), timeout=15)
    gone = time.monotonic()
    if evidence == "last seen":  # the cluster lost the pod's events
        for event in cluster.events(NS, "quiet"):
            cluster.api.delete(EVENT, NS, event["metadata"]["name"])
    [t] = cluster.truth.snapshot().values()

    closed = await wait_for_async(
        lambda: (s := session(store, "s-quiet")) and s.ended_at and s, timeout=NOTICED_WITHIN
    )
    noticed = time.monotonic() - gone
    assert closed.started_at == t.started
    if evidence == "killing event":
        assert abs((closed.ended_at - t.end).total_seconds()) <= 1
    else:
        # what billing saw before the silence, never the time it was blind: the pod may have
        # ended at any moment of it
        assert closed.ended_at <= silenced
        assert t.end - closed.ended_at <= timedelta(seconds=NOTICED_WITHIN)
    assert noticed <= NOTICED_WITHIN


# -- wiring ----------------------------------------------------------------------------------------


async def test_the_meter_runs_on_kubernetes_only_and_with_a_usable_api_config(
    tmp_path, store, monkeypatch
):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    config = billing_config(load_settings(environ={}).billing)
    executor = ThreadPoolExecutor(1)
    assert await make_meter(config, {"backend": "local"}, store, executor) is None
    # not in a cluster, no kubeconfig: refused, saying what to set
    with pytest.raises(KubeConfigMissing, match="Set billing.kubeconfig or KUBECONFIG"):
        await make_meter(config, {"backend": "kubernetes"}, store, executor)
    missing = replace(config, kubeconfig=str(tmp_path / "nowhere"))
    with pytest.raises(KubeConfigMissing, match="nowhere"):
        await make_meter(missing, {"backend": "kubernetes"}, store, executor)
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(SimulatedCluster().kubeconfig_dict() | {"clusters": [
        {"name": "kube-sim", "cluster": {"server": "http://127.0.0.1:6443"}}]}))  # fmt: skip
    kube = {"backend": "kubernetes", "kubernetes": {"namespace": "gpu-users"}}
    meters = [await make_meter(replace(config, kubeconfig=str(path)), kube, store, executor)]
    monkeypatch.setenv("KUBECONFIG", str(path))  # as the hub passes it on
    meters.append(await make_meter(config, kube, store, executor))
    override = {"backend": "kubernetes", "kubernetes": {"api_host": "http://k8s:80"}}
    meters.append(await make_meter(config, override, store, executor))  # as for the spawner
    assert [(m.api.api_client.configuration.host, m.namespace) for m in meters] == [
        ("http://127.0.0.1:6443", "gpu-users"),
        ("http://127.0.0.1:6443", "gpu-users"),
        ("http://k8s:80", "gputap"),
    ]
    for meter in meters:
        await meter.api.api_client.close()
    executor.shutdown()


def test_billing_refuses_to_start_when_it_cannot_reach_the_cluster(tmp_path):
    settings = tmp_path / "gputap.yaml"
    body = {
        "data_dir": str(tmp_path),
        "spawner": {"backend": "kubernetes"},
        "billing": {"kubeconfig": str(tmp_path / "missing")},
    }
    settings.write_text(yaml.safe_dump(body))
    started = subprocess.run(
        [sys.executable, "-m", "billing_service"],
        cwd=Path(__file__).resolve().parents[2],
        env={
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
            "GPUTAP_SETTINGS": str(settings),
            "JUPYTERHUB_API_TOKEN": "t",
            "JUPYTERHUB_API_URL": "http://127.0.0.1:9/hub/api",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 1
    [refusal] = [line for line in started.stderr.splitlines() if "[C " in line]
    assert f"cannot use the kubeconfig {tmp_path / 'missing'}" in refusal
    assert "Traceback" not in started.stderr
