"""The hub's cluster watch finds GPU faults as the simulated cluster's device plugin, kubelet
and health agents report them, and the inventory keeps the faulty units out."""

import pytest
from kubernetes_asyncio import client

from spawner.core.catalog import Catalog
from spawner.kube.health import KubeHealthWatcher
from spawner.kube.watch import ClusterWatcher
from tests.kube_sim import SimulatedCluster, admin_key
from tests.kube_sim.conftest import PY, pod_body
from tests.waiting import wait_for_async

GPU = "nvidia.com/gpu"


@pytest.fixture
async def watched():
    async with SimulatedCluster(max_grace_seconds=1) as cluster:
        cluster.gpu_node("a100", gpus=4)
        config = client.Configuration(host=cluster.url, api_key=admin_key(cluster))
        async with client.ApiClient(config) as api_client:
            v1 = client.CoreV1Api(api_client)
            watcher = ClusterWatcher(v1, Catalog.load())
            faults = []

            def report(fault):  # what the fault desk does first: isolate
                faults.append(fault)
                watcher.inventory.hold_out(fault.node, fault.resource or GPU, fault.units)

            health = KubeHealthWatcher(report, ["GPUXIDErrors"])
            watcher.on_event.append(health.on_event)
            watcher.start()
            await watcher.ready()
            try:
                yield cluster, v1, watcher, faults
            finally:
                watcher.stop()


async def test_a_fault_on_a_running_servers_gpu_is_found_once_and_held_out(watched):
    cluster, v1, watcher, faults = watched
    body = pod_body("jupyter-ada", command=[PY, "-c", "import time; time.sleep(60)"],
                    resources={"limits": {GPU: "1"}},
                    tolerations=[{"key": GPU, "operator": "Exists"}])  # fmt: skip
    await v1.create_namespaced_pod("default", body)
    await wait_for_async(lambda: cluster.visible_gpus("default", "jupyter-ada"))
    [device] = cluster.visible_gpus("default", "jupyter-ada")
    cluster.gpu_fault("a100", int(device.rsplit("-", 1)[1]))
    told = await wait_for_async(lambda: [f for f in faults if f.source == "pod"])
    await wait_for_async(lambda: watcher.inventory.view.total("A100-80GB") == 3)
    assert [(f.devices, f.pods) for f in told] == [((f"a100/{device}",), ("default/jupyter-ada",))]
    assert sum(f.units for f in faults) == 1
    # the plugin restarts and offers the device again: it stays out; then an agent's
    # condition (a later event: when it is seen, the restart's is applied)
    cluster.gpu_heal("a100", int(device.rsplit("-", 1)[1]))
    cluster.set_condition("a100", "GPUXIDErrors", "True", "XID79")
    [node_fault] = await wait_for_async(lambda: [f for f in faults if f.kind == "node"])
    assert node_fault.detail == "condition GPUXIDErrors is True (XID79)"
    assert (await v1.read_node("a100")).status.allocatable[GPU] == "4"
    assert watcher.inventory.view.total("A100-80GB") == 3
    assert sum(f.units for f in faults) == 1
