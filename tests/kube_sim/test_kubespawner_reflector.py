"""KubeSpawner's own pod and event reflectors (kubernetes_asyncio) follow the simulated cluster."""

import pytest
from kubernetes_asyncio.client import Configuration
from kubespawner.reflector import ResourceReflector

from tests.kube_sim import SimulatedCluster, admin_key
from tests.kube_sim.api import POD
from tests.kube_sim.conftest import PY, pod_body
from tests.waiting import wait_for_async


class Pods(ResourceReflector):
    kind = "pods"


class Events(ResourceReflector):
    kind = "events"


@pytest.fixture
async def cluster():
    previous = Configuration.get_default_copy()
    async with SimulatedCluster() as c:
        Configuration.set_default(Configuration(host=c.url, api_key=admin_key(c)))
        try:
            yield c
        finally:
            Configuration.set_default(previous)


async def test_reflectors_see_a_pod_start_and_its_events(cluster):
    cluster.add_node("cpu-1")
    pods = Pods(namespace="default", labels={"app": "jupyterhub"})
    events = Events(namespace="default", fields={"involvedObject.kind": "Pod"})
    await pods.start()
    await events.start()
    try:
        cluster.api.create(
            POD,
            "default",
            pod_body("jupyter-ada", command=[PY, "-c", "import time; time.sleep(30)"]),
        )
        await wait_for_async(
            lambda: (
                pods.resources.get("default/jupyter-ada", {}).get("status", {}).get("phase")
                == "Running"
            )
        )
        await wait_for_async(
            lambda: any(e["reason"] == "Started" for e in events.resources.values())
        )
    finally:
        await pods.stop()
        await events.stop()
