"""KubeDiskStore against the simulated cluster, through the real kubernetes_asyncio client, as
the hub runs it: with the token of ServiceAccount `hub` and the chart's RBAC (tests/kube/
conftest.py); the tests look at and make what they check as the cluster's administrator."""

import asyncio

import pytest
from kubernetes_asyncio import client

from spawner.core.disks import DiskConflict, DiskNotFound, DiskUnavailable
from spawner.kube.disks import KubeDiskStore
from tests.kube.conftest import HUB_ACCOUNT, NAMESPACE, gputap_cluster
from tests.kube_sim import admin_key


@pytest.fixture
def cluster(chart_rbac):
    with gputap_cluster(chart_rbac) as c:
        yield c


async def core_v1(cluster, api_key: dict[str, str]):
    async with client.ApiClient(client.Configuration(host=cluster.url, api_key=api_key)) as api:
        yield client.CoreV1Api(api)


@pytest.fixture
async def v1(cluster):
    """The cluster's administrator."""
    async for v1 in core_v1(cluster, admin_key(cluster)):
        yield v1


@pytest.fixture
async def hub_v1(cluster):
    """The hub, by its ServiceAccount's token."""
    token = cluster.service_account_token(NAMESPACE, HUB_ACCOUNT)
    async for v1 in core_v1(cluster, {"BearerToken": f"Bearer {token}"}):
        yield v1


@pytest.fixture
def store(hub_v1):
    return KubeDiskStore(hub_v1, NAMESPACE, "fast-ssd", max_size_gb=50, max_disks=2)


async def claims(v1):
    return (await v1.list_namespaced_persistent_volume_claim(NAMESPACE)).items


async def test_a_disk_is_a_labelled_claim_with_its_record(store, v1):
    disk = await store.create("alice", "data", 10, "session-1")
    assert (disk.name, disk.size_gb, disk.attached_to, disk.billing_session_id) == (
        "data",
        10,
        None,
        "session-1",
    )
    [claim] = await claims(v1)
    assert claim.metadata.name == "disk-alice--data"
    assert claim.metadata.labels == {
        "app.kubernetes.io/managed-by": "gputap",
        "gputap.io/disk": "true",
        "hub.jupyter.org/username": "alice",
    }
    assert claim.metadata.annotations == {
        "hub.jupyter.org/username": "alice",
        "gputap.io/disk-name": "data",
        "gputap.io/created-at": disk.created_at.isoformat(),
        "gputap.io/billing-session": "session-1",
    }
    assert claim.spec.resources.requests == {"storage": "10Gi"}
    assert claim.spec.storage_class_name == "fast-ssd"
    assert claim.spec.access_modes == ["ReadWriteOnce"]
    assert await store.get("alice", "data") == disk
    assert await store.list("alice") == [disk]


async def test_attach_detach_and_delete(store, v1):
    await store.create("alice", "data", 10)
    attached = await store.attach("alice", "data", "")
    assert attached.attached_to == ""  # the default server, not "detached"
    [claim] = await claims(v1)
    assert claim.metadata.annotations["gputap.io/attached-to"] == ""
    assert [d.name for d in await store.attached("alice", "")] == ["data"]
    assert (await store.attach("alice", "data", "gpu")).attached_to == "gpu"
    assert await store.attached("alice", "") == []
    with pytest.raises(DiskConflict, match="detach it first"):
        await store.delete("alice", "data")
    assert len(await claims(v1)) == 1

    assert (await store.detach("alice", "data")).attached_to is None
    [claim] = await claims(v1)
    assert "gputap.io/attached-to" not in claim.metadata.annotations
    await store.delete("alice", "data")
    assert await claims(v1) == []
    with pytest.raises(DiskNotFound):
        await store.get("alice", "data")
    with pytest.raises(DiskNotFound):
        await store.attach("alice", "data", "")


async def test_users_see_only_their_own_disks(store, v1):
    await store.create("alice", "data", 1)
    await store.create("alice-x", "data", 1)
    await store.create("Ada@Lovelace", "data", 1)
    assert [d.name for d in await store.list("alice")] == ["data"]
    assert [d.name for d in await store.list("Ada@Lovelace")] == ["data"]
    assert await store.list("bob") == []
    with pytest.raises(DiskNotFound):
        await store.get("bob", "data")
    # a claim of someone else's, labelled like alice's, is not hers
    await v1.create_namespaced_persistent_volume_claim(
        "gputap",
        {
            "metadata": {
                "name": "home-alice",
                "labels": {"gputap.io/disk": "true", "hub.jupyter.org/username": "alice"},
                "annotations": {"hub.jupyter.org/username": "mallory"},
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    assert [d.name for d in await store.list("alice")] == ["data"]


async def test_limits_and_bad_input_change_nothing(store, v1):
    await store.create("alice", "data", 10)
    with pytest.raises(DiskConflict, match="already have"):
        await store.create("alice", "data", 10)
    with pytest.raises(ValueError, match="size_gb"):
        await store.create("alice", "big", 51)
    with pytest.raises(ValueError, match="name"):
        await store.create("alice", "no--pe", 1)
    results = await asyncio.gather(
        *(store.create("alice", f"d{i}", 1) for i in range(4)), return_exceptions=True
    )
    assert sum(not isinstance(r, Exception) for r in results) == 1
    assert len(await claims(v1)) == 2


async def test_an_unreachable_api_is_said_plainly(store, cluster):
    cluster.faults.fail_requests(1.0, code=503)
    with pytest.raises(DiskUnavailable, match="cannot be read or changed"):
        await store.list("alice")
    with pytest.raises(DiskUnavailable):
        await store.create("alice", "data", 1)
    cluster.faults.clear()
    assert await store.list("alice") == []


async def test_a_missing_namespace_is_the_operators_to_fix(v1):
    # as an administrator: the hub's own Role holds in the servers' namespace only
    store = KubeDiskStore(v1, "nowhere")
    assert await store.list("alice") == []  # as the real API lists a missing namespace
    with pytest.raises(DiskUnavailable, match="cannot be read or changed"):
        await store.create("alice", "data", 1)
