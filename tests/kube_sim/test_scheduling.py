"""The simulated scheduler: pods land only where GPUs, MIG slices, selectors and taints allow."""

import json
import time

import kubernetes.client
import pytest

from tests.kube_sim import SimulatedCluster, admin_key
from tests.kube_sim.conftest import PY, pod_body
from tests.waiting import wait_for

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SLEEP = [PY, "-c", "import time; time.sleep(60)"]


@pytest.fixture
def cluster():
    with SimulatedCluster.run_in_thread(event_interval=0.5, max_grace_seconds=1) as c:
        c.gpu_node("a100-1", gpus=2)
        c.gpu_node("mig-1", gpus=1, mig="all-1g.10gb")
        c.gpu_node("l4-1", product="NVIDIA-L4", gpus=1, memory_mib=23034)
        yield c


def gpu_pod(name, resources, product=None, tolerate=True, **spec):
    if product:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": product}
    if tolerate:
        spec["tolerations"] = [GPU_TOLERATION]
    return pod_body(name, command=SLEEP, resources={"limits": resources}, **spec)


def node_of(v1, name):
    return v1.read_namespaced_pod(name, "default").spec.node_name


def failed_scheduling(v1, name):
    events = v1.list_namespaced_event(
        "default", field_selector=f"involvedObject.name={name},reason=FailedScheduling"
    ).items
    return [e.message for e in events]


def test_gpu_pod_with_product_selector_lands_on_the_a100(v1):
    v1.create_namespaced_pod(
        "default", gpu_pod("ada", {"nvidia.com/gpu": "2"}, product="NVIDIA-A100-SXM4-80GB")
    )
    assert wait_for(lambda: node_of(v1, "ada")) == "a100-1"
    scheduled = v1.list_namespaced_event("default", field_selector="reason=Scheduled").items
    assert [e.message for e in scheduled] == ["Successfully assigned default/ada to a100-1"]


def test_mig_slice_pod_lands_on_the_mig_node(v1, cluster):
    node = next(n for n in v1.list_node().items if n.metadata.name == "mig-1")
    assert node.status.allocatable["nvidia.com/mig-1g.10gb"] == "7"
    assert node.metadata.labels["nvidia.com/mig.strategy"] == "mixed"
    assert node.metadata.labels["nvidia.com/mig.config"] == "all-1g.10gb"
    v1.create_namespaced_pod("default", gpu_pod("slice", {"nvidia.com/mig-1g.10gb": "1"}))
    assert wait_for(lambda: node_of(v1, "slice")) == "mig-1"


def test_pod_that_does_not_fit_stays_pending_then_binds_when_room_frees(v1):
    v1.create_namespaced_pod(
        "default", gpu_pod("first", {"nvidia.com/gpu": "2"}, product="NVIDIA-A100-SXM4-80GB")
    )
    wait_for(lambda: node_of(v1, "first"))
    v1.create_namespaced_pod(
        "default", gpu_pod("second", {"nvidia.com/gpu": "1"}, product="NVIDIA-A100-SXM4-80GB")
    )
    messages = wait_for(lambda: failed_scheduling(v1, "second"))
    # the MIG node keeps its A100 product label (GFD mixed strategy) but has no whole GPUs
    assert messages[0] == (
        "0/3 nodes are available: 2 Insufficient nvidia.com/gpu, "
        "1 node(s) didn't match Pod's node affinity/selector."
    )
    pod = v1.read_namespaced_pod("second", "default")
    assert pod.status.phase == "Pending" and not pod.spec.node_name
    cond = next(c for c in pod.status.conditions if c.type == "PodScheduled")
    assert (cond.status, cond.reason) == ("False", "Unschedulable")
    v1.delete_namespaced_pod("first", "default")
    assert wait_for(lambda: node_of(v1, "second")) == "a100-1"


def test_failed_scheduling_events_are_rate_limited(v1):
    v1.create_namespaced_pod("default", gpu_pod("greedy", {"nvidia.com/gpu": "64"}))
    wait_for(lambda: failed_scheduling(v1, "greedy"))
    import time

    time.sleep(1.2)  # the scheduler retries every second; events at most every 0.5 s here
    assert 1 <= len(failed_scheduling(v1, "greedy")) <= 4


def test_cordoned_nodes_are_skipped(v1, cluster):
    cluster.cordon("l4-1")
    v1.create_namespaced_pod("default", gpu_pod("l4", {"nvidia.com/gpu": "1"}, product="NVIDIA-L4"))
    messages = wait_for(lambda: failed_scheduling(v1, "l4"))
    assert "1 node(s) were unschedulable" in messages[0]
    cluster.uncordon("l4-1")
    assert wait_for(lambda: node_of(v1, "l4")) == "l4-1"


def test_taints_without_tolerations_are_respected(v1, cluster):
    v1.create_namespaced_pod("default", gpu_pod("untolerated", {"cpu": "1"}, tolerate=False))
    messages = wait_for(lambda: failed_scheduling(v1, "untolerated"))
    assert messages[0] == (
        "0/3 nodes are available: 3 node(s) had untolerated taint {nvidia.com/gpu: present}."
    )
    cluster.add_node("cpu-1")
    assert wait_for(lambda: node_of(v1, "untolerated")) == "cpu-1"


def test_higher_priority_pod_preempts_a_lower_one(v1, cluster):
    scheduling = kubernetes.client.SchedulingV1Api(v1.api_client)
    scheduling.create_priority_class({"metadata": {"name": "low"}, "value": 10})
    scheduling.create_priority_class({"metadata": {"name": "high"}, "value": 1000})
    v1.create_namespaced_pod(
        "default",
        gpu_pod("student", {"nvidia.com/gpu": "1"}, product="NVIDIA-L4", priorityClassName="low"),
    )
    wait_for(lambda: node_of(v1, "student"))
    wait_for(lambda: v1.read_namespaced_pod("student", "default").status.phase == "Running")
    v1.create_namespaced_pod(
        "default",
        gpu_pod("teacher", {"nvidia.com/gpu": "1"}, product="NVIDIA-L4", priorityClassName="high"),
    )
    assert v1.read_namespaced_pod("teacher", "default").spec.priority == 1000
    assert wait_for(lambda: node_of(v1, "teacher")) == "l4-1"
    preempted = v1.list_namespaced_event("default", field_selector="reason=Preempted").items
    assert [(e.involved_object.name, e.message) for e in preempted] == [
        ("student", "Preempted by default/teacher on node l4-1")
    ]
    # as kube-scheduler does: a condition and a graceful delete, the kubelet stops the
    # container (Killing, which billing dates a vanished pod's end by) and removes the pod
    wait_for(
        lambda: (
            not [p for p in v1.list_namespaced_pod("default").items if p.metadata.name == "student"]
        )
    )
    killing = v1.list_namespaced_event("default", field_selector="reason=Killing").items
    assert [e.involved_object.name for e in killing] == ["student"]
    assert killing[0].last_timestamp >= preempted[0].last_timestamp


def test_a_preempted_pod_terminates_gracefully_with_a_disruption_condition(v1, cluster):
    scheduling = kubernetes.client.SchedulingV1Api(v1.api_client)
    scheduling.create_priority_class({"metadata": {"name": "low"}, "value": 10})
    scheduling.create_priority_class({"metadata": {"name": "high"}, "value": 1000})
    v1.create_namespaced_pod(
        "default",
        gpu_pod("student", {"nvidia.com/gpu": "1"}, product="NVIDIA-L4", priorityClassName="low"),
    )
    wait_for(lambda: v1.read_namespaced_pod("student", "default").status.phase == "Running")
    v1.create_namespaced_pod(
        "default",
        gpu_pod("teacher", {"nvidia.com/gpu": "1"}, product="NVIDIA-L4", priorityClassName="high"),
    )
    seen: list = []

    def terminating():
        pods = [p for p in v1.list_namespaced_pod("default").items if p.metadata.name == "student"]
        seen.extend(pods)
        return pods and pods[0].metadata.deletion_timestamp is not None

    wait_for(terminating)
    victim = seen[-1]
    conditions = {c.type: c for c in victim.status.conditions}
    assert conditions["DisruptionTarget"].reason == "PreemptionByScheduler"
    assert victim.status.phase != "Failed"  # the scheduler leaves the phase to the kubelet
    assert victim.metadata.deletion_grace_period_seconds > 0


def test_unknown_priority_class_is_refused(v1):
    with pytest.raises(kubernetes.client.ApiException) as e:
        v1.create_namespaced_pod("default", gpu_pod("x", {}, priorityClassName="nope"))
    assert e.value.status == 403


def test_a_pod_naming_another_scheduler_waits_for_that_scheduler(v1, cluster):
    """kube-scheduler places only pods whose spec.schedulerName is one of its profiles'."""
    body = gpu_pod("picky", {"nvidia.com/gpu": "1"}, schedulerName="user-scheduler")
    v1.create_namespaced_pod("default", body)
    time.sleep(1.5)  # a scheduling pass (1 s) went by
    assert node_of(v1, "picky") is None and failed_scheduling(v1, "picky") == []
    with SimulatedCluster.run_in_thread(scheduler_names=("user-scheduler",)) as other:
        other.gpu_node("a100-2", gpus=1)
        other_v1 = kubernetes.client.CoreV1Api(
            kubernetes.client.ApiClient(
                kubernetes.client.Configuration(host=other.url, api_key=admin_key(other))
            )
        )
        other_v1.create_namespaced_pod("default", body)
        assert wait_for(lambda: node_of(other_v1, "picky")) == "a100-2"


def test_a_pod_runs_under_a_runtime_class_that_exists_and_on_its_nodes(v1, cluster):
    """The RuntimeClass admission plugin: an unknown class is refused; a class's scheduling
    constraints join the pod's, so it lands only where that runtime is."""
    with pytest.raises(kubernetes.client.ApiException) as refused:
        v1.create_namespaced_pod("default", gpu_pod("nort", {}, runtimeClassName="nvidia"))
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert message == 'pods "nort" is forbidden: pod rejected: RuntimeClass "nvidia" not found'
    node_api = kubernetes.client.NodeV1Api(v1.api_client)
    node_api.create_runtime_class(
        {
            "metadata": {"name": "nvidia"},
            "handler": "nvidia",
            "scheduling": {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}},
        }
    )
    v1.create_namespaced_pod("default", gpu_pod("rt", {}, runtimeClassName="nvidia"))
    pod = v1.read_namespaced_pod("rt", "default")
    assert pod.spec.runtime_class_name == "nvidia"
    assert pod.spec.node_selector == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert wait_for(lambda: node_of(v1, "rt")) == "l4-1"
