"""Placeholder pods on the simulated cluster, through the real hub: GPU headroom kept per
offering at the spot class; an on-demand start takes a placeholder's room (never a spot
server's) and the placeholder comes back Pending, which is what asks an autoscaler for the
next node; spot servers never take that room; placeholders bill nobody."""

from __future__ import annotations

import pytest

from tests.kube.conftest import NAMESPACE, gputap_cluster, kube_platform
from tests.kube.test_kube_spawn import pod_of
from tests.waiting import wait_for

PLACEHOLDER = "gputap-placeholder-l40s-0"
L40S = {"kind": "card", "card": "L40S"}


@pytest.fixture(scope="module")
def cluster(chart_rbac):
    with gputap_cluster(chart_rbac, seed=11) as c:
        # two L40S: room for two servers (8 cores and 64 GB each), one of them kept free
        c.gpu_node("gpu-l40s", product="NVIDIA-L40S", gpus=2, cpu="20", memory="160Gi")
        yield c


@pytest.fixture(scope="module")
def platform(cluster, tmp_path_factory):
    p = kube_platform(
        cluster,
        tmp_path_factory.mktemp("kube-placeholders"),
        kubernetes={"placeholders": {"L40S": 1}},
    )
    p.start()
    yield p
    p.shutdown()


def placeholder(cluster) -> dict | None:
    found = [p for p in cluster.pods(NAMESPACE) if p["metadata"]["name"] == PLACEHOLDER]
    return found[0] if found else None


def running_placeholder(cluster) -> dict:
    def running() -> bool:
        pod = placeholder(cluster)
        return bool(pod and (pod.get("status") or {}).get("phase") == "Running")

    wait_for(running, lambda: f"the placeholder runs: {placeholder(cluster)}", timeout=60)
    return placeholder(cluster)


def test_an_on_demand_start_takes_the_placeholders_room_and_the_spot_server_keeps_its_own(
    platform, cluster
):
    kept = running_placeholder(cluster)
    # sized as an L40S server, at the spot class: it never preempts anyone
    assert kept["spec"]["nodeName"] == "gpu-l40s"
    assert kept["spec"]["priorityClassName"] == "gputap-spot"
    assert kept["spec"]["priority"] == -10 and kept["spec"]["preemptionPolicy"] == "Never"
    [container] = kept["spec"]["containers"]
    assert container["resources"]["requests"] == {
        "cpu": "8",
        "memory": "64G",
        "nvidia.com/gpu": "1",
    }

    for name in ("sam", "sue", "olga"):
        platform.create_user(name)
    # a spot server takes the free L40S; the placeholder's room is not for spot servers
    r = platform.spawn("sam", {**L40S, "spot": True})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("sam")
    r = platform.spawn("sue", {**L40S, "spot": True})
    assert r.status_code == 409, r.text
    sam_pod = pod_of(cluster, "sam")["metadata"]["uid"]

    # on-demand: placed on the placeholder's room, which the hub frees for it
    r = platform.spawn("olga", L40S)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("olga", timeout=60)
    assert pod_of(cluster, "olga")["spec"]["nodeName"] == "gpu-l40s"
    # the spot server was not the one to go
    assert pod_of(cluster, "sam")["metadata"]["uid"] == sam_pod
    assert platform.server("sam")["ready"]
    preempted = [e for e in cluster.events(NAMESPACE) if e.get("reason") == "Preempted"]
    assert preempted == []

    # the placeholder comes back, Pending: what a cluster autoscaler adds a node for
    def pending_again() -> bool:
        pod = placeholder(cluster)
        return bool(
            pod
            and pod["metadata"]["uid"] != kept["metadata"]["uid"]
            and pod["status"].get("phase") == "Pending"
            and any(
                e.get("reason") == "FailedScheduling"
                for e in cluster.events(NAMESPACE, PLACEHOLDER)
            )
        )

    wait_for(pending_again, lambda: f"a new, Pending placeholder: {placeholder(cluster)}", 60)

    # placeholders bill nobody: the users' sessions only, and the ledger adds up
    assert [s["price_class"] for s in platform.account("sam")["running"]] == ["spot"]
    assert [s["price_class"] for s in platform.account("olga")["running"]] == ["on-demand"]
    assert platform.ledger_problems() == []

    # olga stops: the placeholder holds her room again
    platform.stop_server("olga")
    again = running_placeholder(cluster)
    assert again["spec"]["nodeName"] == "gpu-l40s"
    platform.stop_server("sam")
