"""The real kubernetes_asyncio client (the one inside KubeSpawner) against the simulated server."""

import asyncio
import json

import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.rest import ApiException

from tests.kube_sim import SimulatedCluster, admin_key
from tests.kube_sim.conftest import pod_body


@pytest.fixture
async def v1():
    async with SimulatedCluster() as cluster:
        config = client.Configuration(host=cluster.url, api_key=admin_key(cluster))
        async with client.ApiClient(config) as api_client:
            yield client.CoreV1Api(api_client)


async def test_create_read_patch_delete(v1):
    created = await v1.create_namespaced_pod("default", pod_body("jupyter-ada"))
    assert created.status.phase == "Pending"
    patched = await v1.patch_namespaced_pod(
        "jupyter-ada", "default", {"metadata": {"annotations": {"hub/started": "yes"}}}
    )
    assert patched.metadata.annotations == {"hub/started": "yes"}
    pods = await v1.list_namespaced_pod("default", label_selector="app=jupyterhub")
    assert [p.metadata.name for p in pods.items] == ["jupyter-ada"]
    await v1.delete_namespaced_pod("jupyter-ada", "default")
    with pytest.raises(ApiException) as e:
        await v1.read_namespaced_pod("jupyter-ada", "default")
    assert e.value.status == 404
    assert json.loads(e.value.body)["reason"] == "NotFound"


async def test_conflict_and_invalid(v1):
    await v1.create_namespaced_secret("default", {"metadata": {"name": "s"}, "data": {}})
    with pytest.raises(ApiException) as dup:
        await v1.create_namespaced_secret("default", {"metadata": {"name": "s"}})
    assert dup.value.status == 409
    with pytest.raises(ApiException) as bad:
        await v1.create_namespaced_persistent_volume_claim(
            "default", {"metadata": {"name": "claim"}, "spec": {}}
        )
    assert bad.value.status == 422 and json.loads(bad.value.body)["reason"] == "Invalid"


async def test_watch_streams_changes_as_they_happen(v1):
    start = (await v1.list_namespaced_config_map("default")).metadata.resource_version
    seen = []

    async def watcher():
        w = watch.Watch()
        async with w.stream(
            v1.list_namespaced_config_map, "default", resource_version=start, timeout_seconds=5
        ) as stream:
            async for event in stream:
                seen.append((event["type"], event["object"].metadata.name))
                if event["type"] == "DELETED":
                    w.stop()

    task = asyncio.create_task(watcher())
    await asyncio.sleep(0.1)
    await v1.create_namespaced_config_map("default", {"metadata": {"name": "a"}})
    await v1.patch_namespaced_config_map("a", "default", {"data": {"b": "c"}})
    await v1.delete_namespaced_config_map("a", "default")
    await asyncio.wait_for(task, 5)
    assert seen == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a")]


async def test_watch_from_a_compacted_version_gets_410(v1):
    async with SimulatedCluster(history_size=2) as small:
        async with client.ApiClient(
            client.Configuration(host=small.url, api_key=admin_key(small))
        ) as api_client:
            core = client.CoreV1Api(api_client)
            for i in range(4):
                await core.create_namespaced_config_map("default", {"metadata": {"name": f"c{i}"}})
            w = watch.Watch()
            with pytest.raises(ApiException) as e:
                async with w.stream(
                    core.list_namespaced_config_map,
                    "default",
                    resource_version="1",
                    timeout_seconds=2,
                ) as stream:
                    async for _ in stream:
                        pass
            assert e.value.status == 410
