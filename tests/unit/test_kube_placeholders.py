"""Placeholder pods (spawner/kube/placeholders.py): sized as a server of their offering, at the
spot class; kept by a pure reconciliation; counted by the inventory as room an on-demand
server takes (devices, CPU and memory) and spot servers do not."""

from __future__ import annotations

import pytest

from spawner.core.catalog import Catalog
from spawner.core.placement import Placement
from spawner.kube.inventory import ClusterInventory, node_gpus
from spawner.kube.objects import gpu_pod_settings
from spawner.kube.placeholders import (
    Shape,
    check_wanted,
    make_placeholder_pod,
    placeholder_name,
    placeholder_shape,
    placeholders_to_evict,
    reconcile,
)
from tests.unit.test_kube_inventory import node, pod

CATALOG = Catalog.load()


def test_a_placeholder_is_a_pause_pod_sized_as_one_server_of_its_offering():
    shape = placeholder_shape("A100-80GB/1g.10gb", CATALOG, {})
    made = make_placeholder_pod(
        name=placeholder_name("A100-80GB/1g.10gb", 0),
        namespace="gputap",
        key="A100-80GB/1g.10gb",
        catalog=CATALOG,
        shape=shape,
        priority_class="gputap-spot",
        image="registry.k8s.io/pause:3.10.1",
        tolerations=[{"key": "course", "operator": "Exists", "effect": "NoSchedule"}],
    )
    # what a server of the same slice asks for (objects.gpu_pod_settings)
    server = gpu_pod_settings(
        Placement(CATALOG.offering("A100-80GB/1g.10gb"), 1, "n", 0),
        CATALOG,
        username="ada",
        session_id="s",
        product="NVIDIA-A100-SXM4-80GB",
    )
    assert made == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "gputap-placeholder-a100-80gb-1g-10gb-0",
            "namespace": "gputap",
            "labels": {
                "gputap.io/placeholder": "a100-80gb-1g-10gb",
                "app.kubernetes.io/component": "gputap-placeholder",
                "app.kubernetes.io/managed-by": "gputap",
            },
            "annotations": {"gputap.io/offering": "A100-80GB/1g.10gb"},
        },
        "spec": {
            "priorityClassName": "gputap-spot",
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "nvidia.com/gpu.product",
                                        "operator": "In",
                                        "values": [
                                            "NVIDIA-A100-SXM4-80GB",
                                            "NVIDIA-A100-80GB-PCIe",
                                        ],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "course", "operator": "Exists", "effect": "NoSchedule"},
            ],
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65534,
                "runAsGroup": 65534,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "pause",
                    "image": "registry.k8s.io/pause:3.10.1",
                    "resources": {
                        "requests": {
                            "cpu": f"{server['cpu_guarantee']:g}",
                            "memory": server["mem_guarantee"],
                            "nvidia.com/mig-1g.10gb": "1",
                        },
                        "limits": {
                            "memory": server["mem_guarantee"],
                            "nvidia.com/mig-1g.10gb": "1",
                        },
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def test_the_shape_is_that_of_the_nodes_that_offer_it_else_the_catalogs():
    single = node_gpus(
        node("h100-single", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", {"nvidia.com/gpu": "56"}),
        CATALOG,
    )
    assert placeholder_shape("H100-80GB/1g.10gb", CATALOG, {"h100-single": single}) == Shape(
        "nvidia.com/gpu", ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",)
    )
    # no node of it yet (a node group scaled to zero): the mixed strategy, any of its products
    assert placeholder_shape("H100-80GB/1g.10gb", CATALOG, {}) == Shape(
        "nvidia.com/mig-1g.10gb", CATALOG.card("H100-80GB").products
    )
    assert placeholder_shape("L40S", CATALOG, {}).resource == "nvidia.com/gpu"


def test_what_is_asked_for_is_checked_with_a_reason():
    assert check_wanted({"A100-80GB": 2, "H100-80GB/1g.10gb": 0}, CATALOG) == {
        "A100-80GB": 2,
        "H100-80GB/1g.10gb": 0,
    }
    for wanted, reason in (
        ({"Z999": 1}, "unknown card or slice"),
        ({"cpu": 1}, "scheduling.userPlaceholder"),
        ({"A100-80GB": 65}, "give 0 to 64"),
        ({"A100-80GB": -1}, "give 0 to 64"),
        ({"A100-80GB": True}, "give 0 to 64"),
    ):
        with pytest.raises(ValueError, match=reason):
            check_wanted(wanted, CATALOG)


def placeholder(name: str, node_name: str | None = None, **meta) -> dict:
    made = make_placeholder_pod(
        name=name,
        namespace="gputap",
        key="L40S",
        catalog=CATALOG,
        shape=Shape("nvidia.com/gpu", ("NVIDIA-L40S",)),
        priority_class="gputap-spot",
        image="pause",
    )
    made["metadata"].update(meta)
    made["metadata"]["uid"] = name
    made["spec"]["nodeName"] = node_name
    made["status"] = {"phase": "Running" if node_name else "Pending"}
    return made


def test_reconciling_makes_the_missing_and_deletes_the_unwanted_and_the_ended():
    wanted = {"L40S": 2, "A100-80GB": 1}
    assert reconcile(wanted, []) == (
        [("A100-80GB", 0), ("L40S", 0), ("L40S", 1)],
        [],
    )
    evicted = placeholder("gputap-placeholder-l40s-1", "gpu-l40s")
    evicted["status"]["phase"] = "Failed"
    going = placeholder("gputap-placeholder-a100-80gb-0", deletionTimestamp="2026-12-07T00:00:00Z")
    pods = [
        placeholder("gputap-placeholder-l40s-0", "gpu-l40s"),
        evicted,
        going,
        placeholder("gputap-placeholder-l40s-2", "gpu-l40s"),  # no longer wanted
    ]
    # the one being deleted is left to go (made again once it is gone)
    assert reconcile(wanted, pods) == (
        [],
        ["gputap-placeholder-l40s-1", "gputap-placeholder-l40s-2"],
    )
    assert reconcile(wanted, pods[:1]) == ([("A100-80GB", 0), ("L40S", 1)], [])


def test_on_demand_takes_a_placeholders_room_and_spot_does_not():
    inv = ClusterInventory(CATALOG)
    l40s = node("gpu-l40s", "NVIDIA-L40S", {"nvidia.com/gpu": "2"})
    l40s["status"]["allocatable"].update(cpu="64", memory="256Gi")
    inv.apply_node("ADDED", l40s)
    held = placeholder("gputap-placeholder-l40s-0", "gpu-l40s")
    inv.apply_pod("ADDED", held)
    assert inv.view.free("L40S") == 1  # spot: the placeholder's room is not for it
    assert inv.preemptible_view.free("L40S") == 2  # on-demand: it is
    # a server placed there gets the CPU and memory the placeholder holds
    assert inv.room("gpu-l40s") == (64_000, 256 * 2**30)
    inv.apply_pod("ADDED", pod("other", "gpu-l40s", {"nvidia.com/gpu": "1", "cpu": "4"}))
    assert inv.room("gpu-l40s") == (60_000, 256 * 2**30)
    # a start reserved on the placeholder's unit: one unit short, which the placeholder gives
    assert inv.shortfall("gpu-l40s", "L40S") == 0
    inv.reserve("ada/#1", "L40S", "gpu-l40s", 1)
    assert inv.shortfall("gpu-l40s", "L40S") == 1
    assert placeholders_to_evict([held], "gpu-l40s", "nvidia.com/gpu", 1) == [
        ("gputap", "gputap-placeholder-l40s-0")
    ]
    assert placeholders_to_evict([held], "gpu-other", "nvidia.com/gpu", 1) == []
    inv.apply_pod("DELETED", held)
    assert inv.shortfall("gpu-l40s", "L40S") == 0


def test_the_newest_placeholders_give_their_room_first():
    pods = [
        placeholder(
            f"gputap-placeholder-l40s-{i}", "gpu-l40s", creationTimestamp=f"2026-12-07T00:00:0{i}Z"
        )  # fmt: skip
        for i in range(3)
    ]
    assert placeholders_to_evict(pods, "gpu-l40s", "nvidia.com/gpu", 2) == [
        ("gputap", "gputap-placeholder-l40s-2"),
        ("gputap", "gputap-placeholder-l40s-1"),
    ]
    assert placeholders_to_evict(pods, "gpu-l40s", "nvidia.com/mig-1g.10gb", 2) == []
    # one already going gives its room: one more is enough
    pods[2]["metadata"]["deletionTimestamp"] = "2026-12-07T00:01:00Z"
    assert placeholders_to_evict(pods, "gpu-l40s", "nvidia.com/gpu", 2) == [
        ("gputap", "gputap-placeholder-l40s-1")
    ]
