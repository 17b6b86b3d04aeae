"""GPU faults in the simulated cluster, as the real kubernetes_asyncio client sees them: the
device plugin's allocatable drop and Unhealthy device, the kubelet's allocatedResourcesStatus
(ResourceHealthStatus), node conditions and taints of health agents, each a watch event."""

import asyncio
import contextlib

import pytest
from kubernetes_asyncio import client, watch

from tests.kube_sim import SimulatedCluster, admin_key
from tests.kube_sim.conftest import PY, pod_body
from tests.waiting import wait_for_async

GPU = "nvidia.com/gpu"
GPU_TOLERATION = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}
SLEEP = [PY, "-c", "import time; time.sleep(60)"]


@pytest.fixture
async def sim():
    async with SimulatedCluster(max_grace_seconds=1) as cluster:
        config = client.Configuration(host=cluster.url, api_key=admin_key(cluster))
        async with client.ApiClient(config) as api_client:
            yield cluster, client.CoreV1Api(api_client)


async def gpu_pod(v1, name, gpus=1):
    body = pod_body(name, command=SLEEP, resources={"limits": {GPU: str(gpus)}},
                    tolerations=[GPU_TOLERATION])  # fmt: skip
    await v1.create_namespaced_pod("default", body)

    async def running():
        pod = await v1.read_namespaced_pod(name, "default")
        return pod if pod.status.phase == "Running" else None

    return await wait_for_async(running)


@contextlib.asynccontextmanager
async def node_events(v1):
    """(type, node object) of every node watch event from now on, as they arrive."""
    seen: list = []
    start = (await v1.list_node()).metadata.resource_version

    async def follow():
        async with watch.Watch().stream(
            v1.list_node, resource_version=start, timeout_seconds=10
        ) as stream:
            async for event in stream:
                seen.append((event["type"], event["object"]))

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.1)
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_faulty_gpu_leaves_allocatable_and_its_pod_is_told_but_runs_on(sim):
    cluster, v1 = sim
    cluster.gpu_node("a100", gpus=4)
    pod = await gpu_pod(v1, "ada")
    [device] = cluster.visible_gpus("default", "ada")
    index = int(device.rsplit("-", 1)[1])
    async with node_events(v1) as events:
        assert cluster.gpu_fault("a100", index) == device
        await wait_for_async(lambda: events)
    [(kind, node)] = events
    assert kind == "MODIFIED"
    assert (node.status.capacity[GPU], node.status.allocatable[GPU]) == ("4", "3")

    after = await v1.read_namespaced_pod("ada", "default")
    [status] = after.status.container_statuses
    [health] = status.allocated_resources_status
    assert health.name == GPU
    assert [(r.resource_id, r.health) for r in health.resources] == [(device, "Unhealthy")]
    # nothing else: still Running, not restarted, not evicted (kubernetes#60388)
    assert after.status.phase == "Running" and status.restart_count == 0
    started = pod.status.container_statuses[0].state.running.started_at
    assert status.state.running.started_at == started
    assert after.metadata.deletion_timestamp is None
    # the raw JSON is the API's shape
    raw = await v1.read_namespaced_pod("ada", "default", _preload_content=False)
    body = await raw.json()
    assert body["status"]["containerStatuses"][0]["allocatedResourcesStatus"] == [
        {"name": GPU, "resources": [{"resourceID": device, "health": "Unhealthy"}]}
    ]


async def test_a_pod_with_two_gpus_lists_both_with_their_health(sim):
    cluster, v1 = sim
    cluster.gpu_node("a100", gpus=2)
    await gpu_pod(v1, "two", gpus=2)
    devices = cluster.visible_gpus("default", "two")
    cluster.gpu_fault("a100", 1)
    pod = await v1.read_namespaced_pod("two", "default")
    [health] = pod.status.container_statuses[0].allocated_resources_status
    assert {r.resource_id: r.health for r in health.resources} == {
        devices[0]: "Healthy",
        devices[1]: "Unhealthy",
    }


async def test_before_1_36_the_pod_status_says_nothing(sim):
    cluster, v1 = sim
    cluster.gpu_node("a100", gpus=1)
    await gpu_pod(v1, "ada")
    cluster.gpu_fault("a100", 0, report=False)
    node = await v1.read_node("a100")
    assert node.status.allocatable[GPU] == "0" and node.status.capacity[GPU] == "1"
    pod = await v1.read_namespaced_pod("ada", "default")
    assert pod.status.container_statuses[0].allocated_resources_status is None
    assert pod.status.phase == "Running"


async def test_an_unhealthy_device_is_given_to_no_new_pod_until_healed(sim):
    cluster, v1 = sim
    cluster.gpu_node("a100", gpus=2)
    assert cluster.gpu_fault("a100", 0) == "GPU-a100-0"
    assert cluster.gpu_fault("a100", 0) == "GPU-a100-0"  # already Unhealthy: no further drop
    assert (await v1.read_node("a100")).status.allocatable[GPU] == "1"
    await gpu_pod(v1, "first")
    assert cluster.visible_gpus("default", "first") == ["GPU-a100-1"]
    body = pod_body("second", command=SLEEP, resources={"limits": {GPU: "1"}},
                    tolerations=[GPU_TOLERATION])  # fmt: skip
    await v1.create_namespaced_pod("default", body)
    await asyncio.sleep(1.5)
    assert (await v1.read_namespaced_pod("second", "default")).spec.node_name is None
    # the plugin restarts and reports it Healthy: the waiting pod gets it
    cluster.gpu_heal("a100", 0)
    assert (await v1.read_node("a100")).status.allocatable[GPU] == "2"
    await wait_for_async(lambda: _phase(v1, "second", "Running"))
    assert cluster.visible_gpus("default", "second") == ["GPU-a100-0"]
    with pytest.raises(ValueError, match="has 2 nvidia.com/gpu; no device 2"):
        cluster.gpu_fault("a100", 2)


async def _phase(v1, name, phase):
    return (await v1.read_namespaced_pod(name, "default")).status.phase == phase


async def test_mig_devices_fail_one_by_one(sim):
    cluster, v1 = sim
    cluster.gpu_node("mig", mig="all-1g.10gb", gpus=1)
    resource = "nvidia.com/mig-1g.10gb"
    assert cluster.gpu_fault("mig", 3, resource) == "mig-1g.10gb-mig-3"
    node = await v1.read_node("mig")
    assert (node.status.capacity[resource], node.status.allocatable[resource]) == ("7", "6")


async def test_conditions_and_taints_of_health_agents_are_watch_events(sim):
    cluster, v1 = sim
    cluster.gpu_node("a100", gpus=1)
    async with node_events(v1) as events:
        cluster.set_condition("a100", "GPUXIDErrors", "True", "XID79", "GPU fell off the bus")
        cluster.set_condition("a100", "GPUXIDErrors", "True", "XID79", "seen again")
        cluster.taint("a100", "nvidia.com/gpu-unhealthy", "NoSchedule", "xid79")
        cluster.taint("a100", "nvidia.com/gpu-unhealthy", "NoExecute")
        cluster.set_condition("a100", "GPUXIDErrors", "False", "NoXIDErrors")
        cluster.untaint("a100", "nvidia.com/gpu-unhealthy", "NoExecute")
        cluster.clear_condition("a100", "GPUXIDErrors")
        cluster.untaint("a100", "nvidia.com/gpu-unhealthy")
        await wait_for_async(lambda: len(events) == 8)
    assert [kind for kind, _ in events] == ["MODIFIED"] * 8
    nodes = [node for _, node in events]

    def condition(node):
        return next((c for c in node.status.conditions if c.type == "GPUXIDErrors"), None)

    first, again = condition(nodes[0]), condition(nodes[1])
    assert (first.status, first.reason, first.message) == ("True", "XID79", "GPU fell off the bus")
    assert first.last_heartbeat_time is not None
    assert again.message == "seen again"
    assert again.last_transition_time == first.last_transition_time  # same status: kept
    taints = {(t.key, t.value, t.effect) for t in nodes[3].spec.taints}
    assert taints >= {
        ("nvidia.com/gpu-unhealthy", "xid79", "NoSchedule"),
        ("nvidia.com/gpu-unhealthy", None, "NoExecute"),
        (GPU, "present", "NoSchedule"),  # the GPU-presence taint stays
    }
    [no_execute] = [t for t in nodes[3].spec.taints if t.effect == "NoExecute"]
    assert no_execute.time_added is not None
    assert condition(nodes[4]).status == "False"
    assert {t.key for t in nodes[5].spec.taints} == {GPU, "nvidia.com/gpu-unhealthy"}
    assert condition(nodes[6]) is None
    assert {t.key for t in nodes[7].spec.taints} == {GPU}
    with pytest.raises(ValueError, match="effect must be one of"):
        cluster.taint("a100", "nvidia.com/x", "Sometimes")
    with pytest.raises(ValueError, match="status must be one of"):
        cluster.set_condition("a100", "GPUMissing", "Yes")
