"""Sold out on the cluster: wait in line; spot servers make way for on-demand ones."""

from datetime import datetime

from tests.kube.test_kube_spawn import pod_of
from tests.waiting import wait_for


def test_sold_out_queues_with_position_and_starts_when_another_stops(platform, cluster):
    for name in ("hog", "next"):
        platform.create_user(name)
    r = platform.spawn("hog", {"kind": "card", "card": "A100-80GB", "count": 8})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("hog")

    r = platform.spawn("next", {"kind": "card", "card": "A100-80GB", "queue": True})
    assert r.status_code == 202, r.text
    messages: list[str] = []
    reader = platform.follow_progress("next", messages)
    wait_for(
        lambda: "waiting for a free A100-80GB: 1st in queue" in messages,
        lambda: f"1st in queue among the progress messages {messages}",
        timeout=30,
        step=0.2,
    )
    # no pod while waiting: nothing is charged and nothing is Pending in the cluster
    assert not [p for p in cluster.pods("gputap") if "next" in p["metadata"]["name"]]
    assert platform.sessions("next") == []

    platform.stop_server("hog")
    platform.wait_ready("next", timeout=60)
    reader.join(60)
    assert "matched A100-80GB on node gpu-a100" in messages, messages
    assert pod_of(cluster, "next")["spec"]["nodeName"] == "gpu-a100"
    platform.stop_server("next")


def test_spot_is_preempted_by_on_demand_and_told_why(platform, cluster):
    for name in ("saver", "payer"):
        platform.create_user(name)
    r = platform.spawn("saver", {"kind": "card", "card": "L40S", "count": 4, "spot": True})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("saver")
    spot_pod = pod_of(cluster, "saver")
    assert spot_pod["spec"]["priorityClassName"] == "gputap-spot"
    [spot_session] = platform.account("saver")["running"]
    assert spot_session["price_class"] == "spot"
    assert spot_session["price_per_hour_micro"] == 6_000_000 * 40 // 100  # 60% off 6.00/h

    # on-demand wants one L40S: the scheduler preempts the spot server for it
    r = platform.spawn("payer", {"kind": "card", "card": "L40S"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("payer", timeout=60)
    assert pod_of(cluster, "payer")["spec"]["nodeName"] == "gpu-l40s"
    platform.wait_stopped("saver", timeout=60)
    preempted = [
        e for e in cluster.events("gputap") if e.get("reason") == "Preempted"
        and e["involvedObject"]["name"] == spot_pod["metadata"]["name"]
    ]  # fmt: skip
    assert preempted

    # billing ended at the termination, not when the hub noticed
    [ended] = platform.sessions("saver")
    assert ended["state"] == "ended"
    preempted_at = parse(preempted[0]["lastTimestamp"])
    ran = preempted_at - parse(ended["started_at"])
    assert abs(ended["billed_seconds"] - ran) <= 2  # event times have whole seconds

    # the user sees why on the form
    page = platform.login("saver").get(f"{platform.url}/hub/spawn", timeout=30).text
    assert "Your spot L40S server was stopped" in page and "Preempted by" in page
    platform.stop_server("payer")


def parse(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
