"""Hub restarts and a flaky API server: servers survive, spawns end cleanly, nothing leaks."""

import time

from tests.kube.test_kube_spawn import pod_of, reach


def live_pods(cluster, user):
    return [
        p
        for p in cluster.pods("gputap")
        if p["metadata"].get("labels", {}).get("hub.jupyter.org/username") == user
    ]


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
