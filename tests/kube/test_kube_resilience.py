"""Hub restarts and a flaky API server: servers survive, spawns end cleanly, nothing leaks."""

import time
from datetime import datetime

import pytest

from tests.billing.kube_pods import killing_times
from tests.kube.conftest import BILLING_ACCOUNT, kube_api, kube_platform, user_of
from tests.kube.test_kube_spawn import pod_of, reach


@pytest.fixture(scope="module")
def platform(cluster, tmp_path_factory):
    """The hub polls servers every 10 s, as by default, not every second as in the other
    tests: a pod gone between two polls must be far from the last poll that found it alive,
    or its end at that poll could not be told from its end when it went."""
    p = kube_platform(cluster, tmp_path_factory.mktemp("kube-resilience"), poll_seconds=10)
    p.start()
    yield p
    p.shutdown()


def live_pods(cluster, user):
    return [
        p
        for p in cluster.pods("gputap")
        if p["metadata"].get("labels", {}).get("hub.jupyter.org/username") == user
    ]


def delete_pod(cluster, pod, user) -> datetime:
    """Delete the user's pod as an administrator would, wait until it is gone; its Killing
    event's time."""
    kube_api(cluster).delete_namespaced_pod(
        pod["metadata"]["name"], "gputap", _preload_content=False
    )
    deadline = time.monotonic() + 30
    while live_pods(cluster, user):
        assert time.monotonic() < deadline, f"{user}'s pod still there"
        time.sleep(0.2)
    return killing_times(cluster.events("gputap"))[pod["metadata"]["uid"]]


def test_hub_restart_keeps_running_servers_and_rebuilds_the_inventory(platform, cluster):
    platform.create_user("eve")
    r = platform.spawn("eve", {"kind": "card", "card": "L40S", "count": 4})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("eve")
    uid = pod_of(cluster, "eve")["metadata"]["uid"]

    platform.stop_hub()
    time.sleep(1)
    platform.start()
    # the restarted hub checks eve's server in the background once init_spawners_timeout
    # (10 s) has passed, which a loaded machine can take: wait for that check, not longer
    assert platform.wait_ready("eve", timeout=60)["ready"]
    reach(platform, "eve")
    assert pod_of(cluster, "eve")["metadata"]["uid"] == uid  # the same pod, never restarted
    # the rebuilt inventory knows the L40S node is full
    platform.create_user("fay")
    r = platform.spawn("fay", {"kind": "card", "card": "L40S"})
    assert r.status_code == 409 and "No L40S free now (0 of 4 free)" in r.json()["message"]
    platform.stop_server("eve")
    assert [s["state"] for s in platform.sessions("eve")] == ["ended"]


def test_api_faults_end_cleanly_and_leave_no_pod_behind(platform, cluster):
    names = [f"flaky{i}" for i in range(4)]
    for name in names:
        platform.create_user(name)
    cluster.faults.reseed(11)
    cluster.faults.fail_requests(0.2, code=500, watches=False)
    try:
        codes = {}
        for name in names:
            r = platform.spawn(name, {"kind": "slice", "card": "H100-80GB", "profile": "1g.10gb"})
            codes[name] = r.status_code
        for name, code in codes.items():
            if code in (201, 202):
                try:
                    platform.wait_ready(name, timeout=60)
                except AssertionError:
                    pass
    finally:
        cluster.faults.clear()
    assert cluster.faults.injected > 0
    for name in names:
        server = platform.server(name)
        if server and server.get("ready"):
            reach(platform, name)
            platform.stop_server(name)
        else:
            assert server is None or not server.get("pending"), server
    deadline = time.monotonic() + 30
    while any(live_pods(cluster, n) for n in names):
        assert time.monotonic() < deadline, [live_pods(cluster, n) for n in names]
        time.sleep(0.5)
    for name in names:
        for session in platform.sessions(name):
            assert session["state"] == "ended"


def test_a_pod_gone_while_billing_was_down_ends_at_its_killing_event_whoever_reports_first(
    platform, cluster
):
    """The restarted hub reports the stop of a pod that vanished while hub and billing were
    down, and may reach billing before billing's pod meter has listed the cluster: the
    meter, which dates the pod's end by its Killing event, still has the first word (the
    hub's stop waits for it), so the session ends when the pod did, not when the hub looked."""
    platform.create_user("gil")
    r = platform.spawn("gil", {"kind": "slice", "card": "H100-80GB", "profile": "1g.10gb"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("gil")
    pod = pod_of(cluster, "gil")
    platform.stop_hub()  # billing, a managed service, with it
    # billing's meter cannot look up Killing events until the fault is cleared
    cluster.faults.fail_requests(
        1.0, code=500, verbs=["GET"], path=r"/events$", users=[user_of(BILLING_ACCOUNT)]
    )
    try:
        killed = delete_pod(cluster, pod, "gil")
        time.sleep(2)  # the hub's stop, if it were the first word, would be dated later
        platform.start()
        # the restarted hub finds gil's server gone and reports its stop to billing, which
        # asks it to wait for the meter (without that wait, the hub's stop time would stand)
        [sid] = [s["id"] for s in platform.sessions("gil")]
        asked_to_wait = f"503 POST /services/billing/api/sessions/{sid}/stop"  # billing's log
        deadline = time.monotonic() + 60
        while asked_to_wait not in platform.log_path.read_text(errors="replace"):
            if platform.sessions("gil")[0]["state"] == "ended":
                break  # closed by the hub's word: the assertion below tells
            assert time.monotonic() < deadline, platform.log_tail()
            time.sleep(0.5)
    finally:
        cluster.faults.clear()
    deadline = time.monotonic() + 60
    while (session := platform.sessions("gil")[0])["state"] != "ended":
        assert time.monotonic() < deadline, session
        time.sleep(0.5)
    ended = datetime.fromisoformat(session["ended_at"])
    assert abs((ended - killed).total_seconds()) <= 1, (session, killed)


def test_a_pod_gone_between_the_hubs_polls_ends_when_it_went_when_the_hub_reports_first(
    platform, cluster
):
    """The hub polls a server every 10 s; a pod that goes between two polls, while billing's
    pod meter hears nothing from the cluster, is settled by the hub alone. It must end when
    the hub's own watch saw the pod go, not at the last poll that found it alive (which
    gave a spot server preempted seconds after its start 0 s, in CI on JupyterHub 5.5)."""
    platform.create_user("hal")
    r = platform.spawn("hal", {"kind": "slice", "card": "H100-80GB", "profile": "1g.10gb"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("hal")
    pod = pod_of(cluster, "hal")
    [sid] = [s["id"] for s in platform.sessions("hal")]
    # billing's meter: its streams and its requests get no answer until the fault is cleared
    cluster.faults.silence_watches(requests=True, users=[user_of(BILLING_ACCOUNT)])
    try:
        time.sleep(6)  # a poll found it alive a while ago
        killed = delete_pod(cluster, pod, "hal")
        platform.wait_stopped("hal", timeout=60)
        deadline = time.monotonic() + 60
        while (session := platform.sessions("hal")[0])["state"] != "ended":
            assert time.monotonic() < deadline, session
            time.sleep(0.5)
    finally:
        cluster.faults.clear()
    assert session["id"] == sid
    ended = datetime.fromisoformat(session["ended_at"])
    # the container's finish follows its Killing event within its grace period, which the
    # simulated cluster caps at 5 s (a server's own shutdown takes about 2 s with
    # jupyter_server 2.21), and event times have whole seconds; the last poll that found it
    # alive was 6 s before the Killing event
    assert -1 < (ended - killed).total_seconds() <= 5 + 1, (session, killed)
