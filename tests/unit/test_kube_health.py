"""GPU faults on Kubernetes from node and pod objects as the API returns them, the findings a
watcher makes of their events (new ones only, each unit counted once), and the inventory's
holds and closed nodes."""

from datetime import UTC, datetime

import pytest

from gputap_common import clock
from spawner.core.catalog import Catalog
from spawner.kube.health import KubeHealthWatcher, node_faults, pod_unhealthy
from spawner.kube.inventory import ClusterInventory

CATALOG = Catalog.load()
GPU = "nvidia.com/gpu"
CONDITIONS = ["GPUMissing", "GPUXIDErrors"]
T0 = "2026-05-04T09:00:00Z"


def node(name="a100", gpus=4, out=0, conditions=(), taints=(), mig=None):
    """A GPU node as the API server returns it: GFD labels, the GPU-presence taint, the
    device plugin's capacity and allocatable, the kubelet's conditions."""
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU: str(gpus)}
    if mig:
        capacity.update({GPU: "0", f"nvidia.com/mig-{mig[0]}": str(mig[1])})
    allocatable = dict(capacity)
    if out:
        resource = f"nvidia.com/mig-{mig[0]}" if mig else GPU
        allocatable[resource] = str(int(capacity[resource]) - out)
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "kubelet is posting ready status",
        "lastHeartbeatTime": T0,
        "lastTransitionTime": T0,
    }
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "17",
            "labels": {
                "kubernetes.io/hostname": name,
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.count": str(gpus),
            },
        },
        "spec": {"taints": [{"key": GPU, "value": "present", "effect": "NoSchedule"}, *taints]},
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [
                ready,
                *(
                    {
                        "type": t,
                        "status": s,
                        "reason": r,
                        "message": m,
                        "lastHeartbeatTime": T0,
                        "lastTransitionTime": T0,
                    }  # fmt: skip
                    for t, s, r, m in conditions
                ),
            ],
        },
    }


def cpu_node(name="cpu-1", conditions=()):
    obj = node(name, conditions=conditions)
    obj["status"]["capacity"] = obj["status"]["allocatable"] = {"cpu": "8", "memory": "32Gi"}
    del obj["metadata"]["labels"]["nvidia.com/gpu.product"]
    return obj


def pod(name="jupyter-ada", node_name="a100", devices=(), phase="Running", uid=None):
    """A running GPU pod; ``devices``: (resourceID, health) the kubelet reports."""
    status = {
        "name": "notebook",
        "image": "gputap/singleuser:1.0",
        "ready": True,
        "restartCount": 0,
        "started": True,
        "state": {"running": {"startedAt": T0}},
    }
    if devices:
        status["allocatedResourcesStatus"] = [
            {"name": GPU, "resources": [{"resourceID": d, "health": h} for d, h in devices]}
        ]
    return {
        "metadata": {"name": name, "namespace": "gputap", "uid": uid or f"uid-{name}"},
        "spec": {
            "nodeName": node_name,
            "containers": [{"name": "notebook", "resources": {"limits": {GPU: "1"}}}],
        },
        "status": {"phase": phase, "containerStatuses": [status]},
    }


XID = ("GPUXIDErrors", "True", "XID79", "GPU has fallen off the bus")
UNHEALTHY_TAINT = {"key": "nvidia.com/gpu-unhealthy", "value": "xid79", "effect": "NoSchedule"}


# -- node_faults, pod_unhealthy ----------------------------------------------------------------


def test_node_faults_are_listed_conditions_nvidia_taints_and_units_out():
    health = node_faults(
        node(
            out=1,
            conditions=[XID, ("GPUMissing", "False", "", ""), ("KernelDeadlock", "True", "", "")],
            taints=[
                UNHEALTHY_TAINT,
                {"key": "nvidia.com/gpu-maintenance", "effect": "PreferNoSchedule"},
                {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
            ],
        ),
        CONDITIONS,
    )
    assert health.reasons == (
        "condition GPUXIDErrors is True",
        "taint nvidia.com/gpu-unhealthy:NoSchedule",
    )
    assert health.detail("condition GPUXIDErrors is True") == (
        "condition GPUXIDErrors is True (XID79: GPU has fallen off the bus)"
    )
    assert health.detail(health.reasons[1]) == (
        "taint nvidia.com/gpu-unhealthy:NoSchedule (value xid79)"
    )
    assert health.gpus_out == {GPU: 1}
    assert health.capacity == {GPU: 4}
    assert health.has_gpus


def test_a_healthy_gpu_node_and_a_cpu_node_show_nothing():
    healthy = node_faults(node(), CONDITIONS)
    assert (healthy.reasons, healthy.gpus_out, healthy.has_gpus) == ((), {}, True)
    assert not node_faults(cpu_node(), CONDITIONS).has_gpus
    mig = node_faults(node(mig=("1g.10gb", 28), out=2), CONDITIONS)
    assert mig.gpus_out == {"nvidia.com/mig-1g.10gb": 2}


def test_pod_unhealthy_names_each_unhealthy_device_of_each_container():
    obj = pod(devices=[("GPU-a", "Healthy"), ("GPU-b", "Unhealthy"), ("GPU-c", "Unknown")])
    sidecar = {
        "name": "agent",
        "allocatedResourcesStatus": [
            {
                "name": "claim:gpu/0",
                "resources": [{"resourceID": "d0", "health": "Unhealthy", "message": "ECC"}],
            }
        ],
    }
    obj["status"]["initContainerStatuses"] = [sidecar]
    assert pod_unhealthy(obj) == [
        ("agent", "claim:gpu/0", "d0", "ECC"),
        ("notebook", GPU, "GPU-b", ""),
    ]
    assert pod_unhealthy(pod()) == []
    assert pod_unhealthy({"metadata": {"name": "p"}, "spec": {}}) == []


# -- the watcher -------------------------------------------------------------------------------


@pytest.fixture
def faults(monkeypatch):
    at = datetime(2026, 5, 4, 9, 30, 5, tzinfo=UTC)
    monkeypatch.setattr(clock, "utcnow", lambda: at)
    return []


@pytest.fixture
def watcher(faults):
    return KubeHealthWatcher(report=faults.append, conditions=CONDITIONS)


def test_a_condition_is_a_node_fault_once_and_again_after_it_cleared(watcher, faults):
    watcher.on_event("node", "ADDED", node())
    assert faults == []
    watcher.on_event("node", "MODIFIED", node(conditions=[XID]))
    [fault] = faults
    assert (fault.kind, fault.source, fault.node, fault.devices) == ("node", "node", "a100", ())
    assert fault.detail == "condition GPUXIDErrors is True (XID79: GPU has fallen off the bus)"
    assert fault.whole_node and fault.units == 0
    assert fault.detected_at == datetime(2026, 5, 4, 9, 30, 5, tzinfo=UTC)
    # the agent's next heartbeat, a relist, a duplicated event: nothing new
    again = node(conditions=[(*XID[:3], "XID79 seen 3 times")])
    for event in ("MODIFIED", "MODIFIED", "ADDED"):
        watcher.on_event("node", event, again)
    assert len(faults) == 1
    watcher.on_event("node", "MODIFIED", node(conditions=[("GPUXIDErrors", "False", "", "")]))
    watcher.on_event("node", "MODIFIED", node(conditions=[XID]))
    assert len(faults) == 2


def test_a_new_taint_is_a_node_fault_but_not_the_gpu_presence_taint(watcher, faults):
    watcher.on_event("node", "ADDED", node())
    watcher.on_event("node", "MODIFIED", node(taints=[UNHEALTHY_TAINT]))
    [fault] = faults
    assert fault.detail == "taint nvidia.com/gpu-unhealthy:NoSchedule (value xid79)"
    both = [UNHEALTHY_TAINT, {"key": "nvidia.com/gpu-unhealthy", "effect": "NoExecute"}]
    watcher.on_event("node", "MODIFIED", node(taints=both, conditions=[XID]))
    assert faults[1].detail == (
        "condition GPUXIDErrors is True (XID79: GPU has fallen off the bus); "
        "taint nvidia.com/gpu-unhealthy:NoExecute"
    )


def test_nodes_without_gpus_are_not_watched(watcher, faults):
    watcher.on_event("node", "ADDED", cpu_node(conditions=[XID]))
    assert faults == []


def test_a_node_seen_faulty_at_first_sight_is_reported_and_a_deleted_node_forgotten(
    watcher, faults
):
    watcher.on_event("node", "ADDED", node(conditions=[XID]))
    watcher.on_event("node", "DELETED", node(conditions=[XID]))
    watcher.on_event("node", "ADDED", node(conditions=[XID]))
    assert [f.kind for f in faults] == ["node", "node"]


def test_an_allocatable_drop_counts_its_units(watcher, faults):
    watcher.on_event("node", "ADDED", node())
    watcher.on_event("node", "MODIFIED", node(out=1))
    [fault] = faults
    assert (fault.kind, fault.source, fault.devices) == ("unhealthy", "node", ())
    assert (fault.resource, fault.units, fault.pods) == (GPU, 1, ())
    assert fault.detail == (
        "1 of 4 nvidia.com/gpu no longer allocatable (the device plugin marked it unhealthy)"
    )
    assert not fault.whole_node
    watcher.on_event("node", "MODIFIED", node(out=1))  # relisted
    watcher.on_event("node", "MODIFIED", node(out=3))
    assert faults[1].units == 2
    assert faults[1].detail.startswith("2 of 4 nvidia.com/gpu no longer allocatable")
    assert sum(f.units for f in faults) == 3


def test_the_pod_told_after_the_drop_names_the_device_without_counting_it_again(watcher, faults):
    watcher.on_event("node", "ADDED", node())
    watcher.on_event("pod", "ADDED", pod(devices=[("GPU-a100-2", "Healthy")]))
    watcher.on_event("node", "MODIFIED", node(out=1))
    watcher.on_event("pod", "MODIFIED", pod(devices=[("GPU-a100-2", "Unhealthy")]))
    drop, told = faults
    assert (told.kind, told.source, told.node) == ("unhealthy", "pod", "a100")
    assert told.devices == ("a100/GPU-a100-2",)
    assert told.pods == ("gputap/jupyter-ada",)
    assert (told.resource, told.units) == (GPU, 0)
    assert (
        told.detail
        == "nvidia.com/gpu GPU-a100-2 of pod gputap/jupyter-ada (container notebook) is Unhealthy"
    )
    assert drop.units + told.units == 1
    watcher.on_event("pod", "MODIFIED", pod(devices=[("GPU-a100-2", "Unhealthy")]))  # relist
    assert len(faults) == 2


def test_the_pod_told_before_the_drop_carries_the_unit_and_the_drop_adds_none(watcher, faults):
    watcher.on_event("node", "ADDED", node())
    watcher.on_event("pod", "MODIFIED", pod(devices=[("GPU-a100-2", "Unhealthy")]))
    watcher.on_event("node", "MODIFIED", node(out=1))
    [told] = faults
    assert (told.source, told.units, told.devices) == ("pod", 1, ("a100/GPU-a100-2",))
    # a second device fails with no pod on it: that drop is counted
    watcher.on_event("node", "MODIFIED", node(out=2))
    assert [(f.source, f.units) for f in faults] == [("pod", 1), ("node", 1)]


def test_a_pod_listed_before_its_node_counts_once(watcher, faults):
    watcher.on_event("pod", "ADDED", pod(devices=[("GPU-a100-0", "Unhealthy")]))
    watcher.on_event("node", "ADDED", node(out=1))
    assert [(f.source, f.units) for f in faults] == [("pod", 1)]


def test_a_device_failing_again_after_a_plugin_restart_is_not_held_twice(watcher, faults):
    watcher.on_event("node", "ADDED", node())
    watcher.on_event("pod", "MODIFIED", pod(devices=[("GPU-a100-1", "Unhealthy")]))
    watcher.on_event("node", "MODIFIED", node(out=1))
    # the plugin restarts: Healthy again, allocatable back; its check fails it once more
    watcher.on_event("node", "MODIFIED", node(out=0))
    watcher.on_event("pod", "MODIFIED", pod(devices=[("GPU-a100-1", "Healthy")]))
    watcher.on_event("pod", "MODIFIED", pod(devices=[("GPU-a100-1", "Unhealthy")]))
    watcher.on_event("node", "MODIFIED", node(out=1))
    assert [(f.source, f.units) for f in faults] == [("pod", 1), ("pod", 0)]


def test_pods_of_a_recreated_server_and_finished_pods(watcher, faults):
    watcher.on_event("node", "ADDED", node())
    watcher.on_event("pod", "MODIFIED", pod(devices=[("GPU-a100-1", "Unhealthy")]))
    watcher.on_event("pod", "DELETED", pod(devices=[("GPU-a100-1", "Unhealthy")]))
    # the server started again, a new pod of the same name on another device that fails
    again = pod(devices=[("GPU-a100-3", "Unhealthy")], uid="uid-2")
    watcher.on_event("pod", "ADDED", again)
    assert [f.devices for f in faults] == [("a100/GPU-a100-1",), ("a100/GPU-a100-3",)]
    done = pod("job", devices=[("GPU-a100-0", "Unhealthy")], phase="Succeeded")
    watcher.on_event("pod", "ADDED", done)
    assert len(faults) == 2


# -- the inventory's holds and closed nodes ----------------------------------------------------


def inventory(gpus=4, out=0):
    inv = ClusterInventory(CATALOG)
    inv.apply_node("ADDED", node(gpus=gpus, out=out))
    return inv


def test_units_held_out_stay_out_when_the_plugin_reports_them_allocatable_again():
    inv = inventory()
    inv.apply_pod("ADDED", pod())
    assert (inv.view.free("A100-80GB"), inv.view.total("A100-80GB")) == (3, 4)
    inv.apply_node("MODIFIED", node(out=1))  # the device plugin marks one Unhealthy
    inv.hold_out("a100", GPU, 1)
    assert inv.held_out == {"a100": {GPU: 1}}
    # not allocatable − held: the plugin's drop and the hold are the same device
    assert (inv.view.free("A100-80GB"), inv.view.total("A100-80GB")) == (2, 3)
    inv.apply_node("MODIFIED", node(out=0))  # the plugin restarted: all 4 allocatable again
    assert (inv.view.free("A100-80GB"), inv.view.total("A100-80GB")) == (2, 3)
    assert inv.preemptible_view.total("A100-80GB") == 3
    inv.give_back("a100", GPU, 1)
    assert inv.held_out == {}
    assert (inv.view.free("A100-80GB"), inv.view.total("A100-80GB")) == (3, 4)


def test_give_back_part_or_all_and_holds_of_nodes_not_seen_yet():
    inv = ClusterInventory(CATALOG)
    inv.hold_out("a100", GPU, 3)  # the fault book is read before the first list
    inv.hold_out("a100", GPU, 0)
    inv.apply_node("ADDED", node())
    assert inv.view.total("A100-80GB") == 1
    inv.give_back("a100", GPU, 1)
    assert (inv.held_out, inv.view.total("A100-80GB")) == ({"a100": {GPU: 2}}, 2)
    inv.reset()  # a full relist forgets the cluster's word, not gputap's holds
    inv.apply_node("ADDED", node())
    assert inv.view.total("A100-80GB") == 2
    inv.give_back("a100", GPU)
    inv.give_back("gone", GPU)
    assert (inv.held_out, inv.view.total("A100-80GB")) == ({}, 4)
    with pytest.raises(ValueError, match="0 or more"):
        inv.hold_out("a100", GPU, -1)
    with pytest.raises(ValueError, match="0 or more"):
        inv.give_back("a100", GPU, -1)


def test_a_closed_node_offers_nothing_until_reopened():
    inv = inventory()
    inv.apply_pod("ADDED", pod())
    inv.close("a100")
    assert inv.closed == {"a100"}
    assert (inv.view.free("A100-80GB"), inv.view.total("A100-80GB")) == (0, 0)
    assert inv.preemptible_view.total("A100-80GB") == 0
    inv.apply_node("MODIFIED", node())  # a node event does not reopen it
    assert inv.view.total("A100-80GB") == 0
    inv.reopen("a100")
    assert (inv.closed, inv.view.free("A100-80GB"), inv.view.total("A100-80GB")) == (set(), 3, 4)
