"""NVIDIA node shapes: MIG strategies, time-slicing, allocatable below capacity, NotReady and
unreachable nodes, cloud machine sizes, and which GPUs a container sees."""

import kubernetes.client
import pytest

from tests.kube_sim import SimulatedCluster
from tests.kube_sim.conftest import PY, pod_body
from tests.kube_sim.node_shapes import (
    CLOUD_MACHINES,
    cloud_node_spec,
    gke_allocatable,
    gpu_node_spec,
)
from tests.kube_sim.scheduler import parse_quantity
from tests.waiting import wait_for

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SLEEP = [PY, "-c", "import time; time.sleep(60)"]


def test_mig_single_strategy_sells_slices_as_gpus_with_a_mig_product():
    spec = gpu_node_spec("h100", product="NVIDIA-H100-80GB-HBM3", mig="all-1g.10gb",
                         mig_strategy="single")  # fmt: skip
    labels, allocatable = spec["labels"], spec["allocatable"]
    assert allocatable["nvidia.com/gpu"] == "56"
    assert not any(k.startswith("nvidia.com/mig-") for k in allocatable)
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert labels["nvidia.com/gpu.count"] == "56"
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert int(labels["nvidia.com/gpu.memory"]) < 10 * 1024  # the slice's memory, not the card's
    assert labels["nvidia.com/gpu.slices.gi"] == "1"
    with pytest.raises(ValueError, match="split the same way"):
        gpu_node_spec("h100", mig={"1g.10gb": 7, "3g.40gb": 2}, mig_strategy="single")


def test_mixed_strategy_keeps_the_cards_product_and_names_each_profile():
    spec = gpu_node_spec("a100", mig="all-3g.40gb")
    assert spec["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert spec["labels"]["nvidia.com/mig.strategy"] == "mixed"
    assert spec["allocatable"]["nvidia.com/mig-3g.40gb"] == "16"
    assert spec["allocatable"]["nvidia.com/gpu"] == "0"


def test_time_slicing_with_and_without_rename():
    renamed = gpu_node_spec("t4", product="Tesla-T4", gpus=2, memory_mib=15360, replicas=4)
    assert renamed["allocatable"]["nvidia.com/gpu.shared"] == "8"
    assert renamed["allocatable"]["nvidia.com/gpu"] == "0"
    assert renamed["labels"]["nvidia.com/gpu.product"] == "Tesla-T4"
    assert renamed["labels"]["nvidia.com/gpu.replicas"] == "4"
    plain = gpu_node_spec("t4", product="Tesla-T4", gpus=2, memory_mib=15360, replicas=4,
                          rename_by_default=False)  # fmt: skip
    assert plain["allocatable"]["nvidia.com/gpu"] == "8"
    assert "nvidia.com/gpu.shared" not in plain["allocatable"]
    assert plain["labels"]["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    assert plain["labels"]["nvidia.com/gpu.replicas"] == "4"


def test_unhealthy_gpus_leave_allocatable_but_not_capacity():
    spec = gpu_node_spec("a100", gpus=8, unhealthy=1)
    assert spec["capacity"]["nvidia.com/gpu"] == "8"
    assert spec["allocatable"]["nvidia.com/gpu"] == "7"


def test_cloud_nodes_have_their_real_size_and_less_allocatable():
    machine = CLOUD_MACHINES["g5.xlarge"]
    assert (machine.vcpu, machine.memory_gib, machine.gpus) == (4, 16, 1)
    spec = cloud_node_spec("g5", "g5.xlarge")
    assert spec["capacity"]["cpu"] == "4" and spec["capacity"]["memory"] == "16384Mi"
    # GKE's table for 4 cores / 16 GiB: 80m CPU and 2,662 MiB (+100 MiB eviction) reserved
    assert spec["allocatable"]["cpu"] == "3920m"
    assert spec["allocatable"]["memory"] == "13621Mi"
    assert spec["labels"]["node.kubernetes.io/instance-type"] == "g5.xlarge"
    assert spec["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A10G"
    for name in CLOUD_MACHINES:
        s = cloud_node_spec(name, name)
        for resource in ("cpu", "memory"):
            assert parse_quantity(s["allocatable"][resource]) < parse_quantity(
                s["capacity"][resource]
            )
    assert gke_allocatable(96, 1152 * 1024)["cpu"] == "95690m"
    with pytest.raises(ValueError, match="known: g4dn.xlarge"):
        cloud_node_spec("x", "m5.large")


@pytest.fixture
def cluster():
    with SimulatedCluster.run_in_thread(event_interval=0.5, max_grace_seconds=1) as c:
        yield c


def failed_scheduling(v1, name):
    events = v1.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={name},reason=FailedScheduling"
    ).items
    return [e.message for e in events]


def test_not_ready_and_unreachable_nodes_are_tainted_and_skipped(cluster, v1):
    cluster.gpu_node("down", gpus=1, ready="False")
    cluster.gpu_node("gone", gpus=1, ready="Unknown")
    nodes = {n.metadata.name: n for n in v1.list_node().items}
    [ready] = [c for c in nodes["gone"].status.conditions if c.type == "Ready"]
    assert (ready.status, ready.reason) == ("Unknown", "NodeStatusUnknown")
    taints = {(t.key, t.effect) for t in nodes["gone"].spec.taints}
    assert ("node.kubernetes.io/unreachable", "NoSchedule") in taints
    assert ("node.kubernetes.io/unreachable", "NoExecute") in taints
    assert ("node.kubernetes.io/not-ready", "NoSchedule") in {
        (t.key, t.effect) for t in nodes["down"].spec.taints
    }
    body = pod_body("ada", command=SLEEP, resources={"limits": {"nvidia.com/gpu": "1"}},
                    tolerations=[GPU_TOLERATION])  # fmt: skip
    v1.create_namespaced_pod("default", body)
    # kube-scheduler's TaintToleration filter, in its words
    assert wait_for(lambda: failed_scheduling(v1, "ada")) == [
        "0/2 nodes are available: 1 node(s) had untolerated taint "
        "{node.kubernetes.io/not-ready: }, 1 node(s) had untolerated taint "
        "{node.kubernetes.io/unreachable: }."
    ]
    # the API server's DefaultTolerationSeconds: NoExecute tolerated for 300 s, not NoSchedule
    pod = v1.read_namespaced_pod("ada", "default")
    assert {(t.key, t.effect, t.toleration_seconds) for t in pod.spec.tolerations} >= {
        ("node.kubernetes.io/not-ready", "NoExecute", 300),
        ("node.kubernetes.io/unreachable", "NoExecute", 300),
    }
    cluster.set_ready("gone", "True")  # the kubelet is back: the controller lifts its taints
    assert wait_for(lambda: v1.read_namespaced_pod("ada", "default").spec.node_name) == "gone"
    assert not [t for t in v1.read_node("gone").spec.taints if "unreachable" in t.key]


def test_a_pod_without_a_gpu_request_sees_what_its_image_says(cluster, v1):
    cluster.add_node("gpu-untainted", labels=gpu_node_spec("x", gpus=2)["labels"],
                     allocatable={"nvidia.com/gpu": "2"})  # fmt: skip
    cuda = "nvidia/cuda:12.6.3-runtime-ubuntu24.04"

    def pod(name, resources=None, env=None):
        body = pod_body(name, command=SLEEP, resources=resources, env=env)
        body["spec"]["containers"][0]["image"] = cuda
        v1.create_namespaced_pod("default", body)
        wait_for(lambda: v1.read_namespaced_pod(name, "default").status.phase == "Running")
        return cluster.visible_gpus("default", name)

    # the CUDA image's NVIDIA_VISIBLE_DEVICES=all: a CPU-only pod sees every GPU of its node
    assert pod("cpu-all") == ["GPU-gpu-untainted-0", "GPU-gpu-untainted-1"]
    assert pod("cpu-void", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]) == []
    # a GPU request: the device plugin's devices, one each
    one = pod("gpu-a", resources={"limits": {"nvidia.com/gpu": "1"}})
    other = pod("gpu-b", resources={"limits": {"nvidia.com/gpu": "1"}})
    assert len(one) == len(other) == 1 and one != other


def test_a_spot_class_that_never_preempts_leaves_lower_pods_running(cluster, v1):
    scheduling = kubernetes.client.SchedulingV1Api(v1.api_client)
    scheduling.create_priority_class({"metadata": {"name": "low"}, "value": -100})
    scheduling.create_priority_class(
        {"metadata": {"name": "polite"}, "value": -10, "preemptionPolicy": "Never"}
    )
    cluster.gpu_node("one", gpus=1)
    gpu = {"limits": {"nvidia.com/gpu": "1"}}
    v1.create_namespaced_pod("default", pod_body("low", command=SLEEP, resources=gpu,
                             tolerations=[GPU_TOLERATION], priorityClassName="low"))  # fmt: skip
    wait_for(lambda: v1.read_namespaced_pod("low", "default").status.phase == "Running")
    v1.create_namespaced_pod("default", pod_body("polite", command=SLEEP, resources=gpu,
                             tolerations=[GPU_TOLERATION], priorityClassName="polite"))  # fmt: skip
    assert v1.read_namespaced_pod("polite", "default").spec.preemption_policy == "Never"
    assert wait_for(lambda: failed_scheduling(v1, "polite")) == [
        "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    ]
    assert v1.read_namespaced_pod("low", "default").status.phase == "Running"
