"""The hub's watches when they go silent: a connection a NAT or load balancer forgot stays
open and sends nothing, and the hub's cluster inventory and KubeSpawner's pod reflector (how
the hub learns that a server stopped) must still follow the cluster."""

import time

import pytest
from kubernetes_asyncio import client
from kubespawner.spawner import PodReflector
from traitlets.config import Config

from gputap_common.settings import load_settings
from hub_config.hub import apply
from spawner.core.catalog import Catalog
from spawner.kube.watch import ClusterWatcher
from tests.kube.conftest import HUB_ACCOUNT, NAMESPACE, gputap_cluster
from tests.kube_sim import admin_key
from tests.kube_sim.conftest import pod_body, restricted
from tests.waiting import wait_for_async

#: how soon a change must show although every watch went silent (the hub's watches last 10 s
#: and are given up 5 s after they should have ended: docs/kubernetes.md, "Watches";
#: KubeSpawner's own default gives a watch 60 s)
NOTICED_WITHIN = 25


@pytest.fixture
def cluster(chart_rbac):
    with gputap_cluster(chart_rbac) as c:
        c.gpu_node("gpu-l40s", product="NVIDIA-L40S", gpus=4, memory_mib=46068)
        c.gpu_node("gpu-a100", product="NVIDIA-A100-SXM4-80GB", gpus=8)
        yield c


def hub_key(cluster) -> dict[str, str]:
    """The `api_key` of the hub's client: ServiceAccount `hub`'s token, the chart's RBAC."""
    return {"BearerToken": f"Bearer {cluster.service_account_token(NAMESPACE, HUB_ACCOUNT)}"}


@pytest.fixture
async def v1(cluster):
    """The cluster's administrator, who makes and ends the pods the hub must see."""
    async with client.ApiClient(
        client.Configuration(host=cluster.url, api_key=admin_key(cluster))
    ) as api_client:
        yield client.CoreV1Api(api_client)


@pytest.fixture
async def hub_v1(cluster):
    async with client.ApiClient(
        client.Configuration(host=cluster.url, api_key=hub_key(cluster))
    ) as api_client:
        yield client.CoreV1Api(api_client)


async def until(predicate, seconds: float) -> float:
    """Seconds until predicate() holds; fails after ``seconds``."""
    t0 = time.monotonic()
    await wait_for_async(predicate, "seen through the silent watch", seconds, step=0.1)
    return time.monotonic() - t0


async def test_a_pods_end_and_a_cordon_are_seen_through_silent_watches(cluster, v1, hub_v1):
    watcher = ClusterWatcher(hub_v1, Catalog.load())
    watcher.start()
    try:
        await watcher.ready()
        view = watcher.inventory
        body = restricted(pod_body("busy", resources={"limits": {"nvidia.com/gpu": "2"}}))
        body["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
        await v1.create_namespaced_pod("gputap", body)
        await until(lambda: view.view.free("L40S") == 2, 10)

        cluster.faults.silence_watches()  # the open watches too: nothing more arrives
        await v1.delete_namespaced_pod("busy", "gputap", grace_period_seconds=0)
        cluster.cordon("gpu-a100")
        await until(lambda: not cluster.pods("gputap"), 10)
        await until(lambda: view.view.free("L40S") == 4, NOTICED_WITHIN)
        assert "gputap/busy" in watcher.ended  # the server's end is known, for billing
        await until(lambda: view.view.free("A100-80GB") == 0, NOTICED_WITHIN)
    finally:
        watcher.stop()


async def test_the_pod_reflector_as_the_hub_configures_it_sees_a_server_end(cluster, v1, tmp_path):
    settings = tmp_path / "gputap.yaml"
    settings.write_text(
        f"data_dir: {tmp_path}\n"
        f"spawner: {{backend: kubernetes, kubernetes: {{hub_ip: {cluster.host_ip}}}}}\n"
    )
    config = Config()
    apply(config, load_settings(settings, environ={}))
    previous = client.Configuration.get_default_copy()
    client.Configuration.set_default(
        client.Configuration(host=cluster.url, api_key=hub_key(cluster))
    )
    # as KubeSpawner makes it, with the hub's configuration (its parent's)
    pods = PodReflector(config=config, namespace="gputap", labels={"app": "jupyterhub"})
    try:
        await pods.start()
        await v1.create_namespaced_pod("gputap", restricted(pod_body("jupyter-ada")))
        await until(lambda: "gputap/jupyter-ada" in pods.pods, 10)
        cluster.faults.silence_watches()
        await v1.delete_namespaced_pod("jupyter-ada", "gputap", grace_period_seconds=0)
        await until(lambda: "gputap/jupyter-ada" not in pods.pods, NOTICED_WITHIN)
    finally:
        await pods.stop()
        client.Configuration.set_default(previous)
