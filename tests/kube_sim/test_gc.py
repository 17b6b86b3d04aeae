"""The simulated cluster's garbage collector, through the real sync client: it deletes what a
removed owner owned (pods gracefully, by their kubelet), keeps what another owner still holds,
collects objects whose references dangle, and orphans dependents when asked."""

import time

import kubernetes.client
import pytest
from kubernetes import watch

from tests.kube_sim.conftest import (
    NOWHERE,
    PY,
    configmap,
    exists,
    owned_by,
    pending_pod,
    pod_body,
    refusal,
)
from tests.waiting import wait_for


@pytest.fixture(scope="module", autouse=True)
def node(kube):
    kube.add_node("cpu-gc", allocatable={"cpu": "64"})


def pod_events(core, ns, since: str) -> list[tuple[str, str]]:
    """(type, pod name) of every pod watch event in ns after resourceVersion ``since``."""
    stream = watch.Watch().stream(
        core.list_namespaced_pod, ns, resource_version=since, timeout_seconds=1
    )
    return [(e["type"], e["object"].metadata.name) for e in stream]


def stubborn(ready) -> str:
    """A program that ignores SIGTERM (the kubelet waits out the grace period, then
    SIGKILLs it) and says so in the file ``ready`` once it does."""
    return (
        "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open({str(ready)!r}, 'w').write('x'); time.sleep(120)"
    )


# -- the collector -----------------------------------------------------------------------------


def test_a_worker_pod_goes_with_its_server_pod_terminated_by_its_kubelet(core, ns, tmp_path):
    ready = tmp_path / "ready"
    server = core.create_namespaced_pod(ns, pod_body("server", command=[PY, "-c", stubborn(ready)]))
    termed = tmp_path / "termed"
    worker_script = (
        "import signal,sys,time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (open({str(termed)!r}, 'w').write('x'), "
        "sys.exit(0)))\n"
        f"open({str(ready)!r} + '-worker', 'w').write('x')\n"
        "time.sleep(120)\n"
    )
    body = pod_body("worker", command=[PY, "-c", worker_script])
    body["metadata"].update(owned_by(server))
    core.create_namespaced_pod(ns, body)
    wait_for(lambda: ready.exists() and (tmp_path / "ready-worker").exists())
    since = core.list_namespaced_pod(ns).metadata.resource_version

    core.delete_namespaced_pod("server", ns)
    # while its owner is Terminating (the kubelet waits out its grace period) the worker is
    # left alone: the owner still exists
    time.sleep(1)
    assert exists(core.read_namespaced_pod, "server", ns)
    assert core.read_namespaced_pod("worker", ns).metadata.deletion_timestamp is None

    wait_for(lambda: not exists(core.read_namespaced_pod, "worker", ns), timeout=15)
    assert termed.exists()  # SIGTERM, as the kubelet stops a pod deleted gracefully
    killing = [e for e in core.list_namespaced_event(ns).items if e.reason == "Killing"]
    assert {e.involved_object.name for e in killing} == {"server", "worker"}
    events = pod_events(core, ns, since)
    assert events.index(("DELETED", "server")) < events.index(("DELETED", "worker"))
    # Terminating first (MODIFIED with a deletionTimestamp), then gone
    assert ("MODIFIED", "worker") in events[events.index(("DELETED", "server")) :]


def test_what_a_pod_owns_goes_with_it_whatever_its_kind(kube, core, ns):
    owner = pending_pod(core, ns, "owner")
    refs = owned_by(owner)
    net = kubernetes.client.NetworkingV1Api(core.api_client)
    net.create_namespaced_network_policy(
        ns, {"metadata": {"name": "group", **refs}, "spec": {"podSelector": {}}}
    )
    configmap(core, ns, "settings", owner)
    core.create_namespaced_secret(ns, {"metadata": {"name": "token", **refs}})
    core.create_namespaced_service(
        ns, {"metadata": {"name": "agent", **refs}, "spec": {"ports": [{"port": 80}]}}
    )
    claim = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    core.create_namespaced_persistent_volume_claim(
        ns, {"metadata": {"name": "scratch", **refs}, "spec": claim}
    )
    worker = pod_body("worker", nodeSelector=NOWHERE)
    worker["metadata"].update(refs)
    core.create_namespaced_pod(ns, worker)
    unrelated = configmap(core, ns, "unrelated")
    since = net.list_namespaced_network_policy(ns).metadata.resource_version
    time.sleep(0.5)  # the collector leaves an owned object alone while its owner exists
    assert exists(core.read_namespaced_config_map, "settings", ns)

    core.delete_namespaced_pod("owner", ns)  # Pending: removed at once

    reads = {
        "networkpolicy": (net.read_namespaced_network_policy, "group"),
        "configmap": (core.read_namespaced_config_map, "settings"),
        "secret": (core.read_namespaced_secret, "token"),
        "service": (core.read_namespaced_service, "agent"),
        "claim": (core.read_namespaced_persistent_volume_claim, "scratch"),
        "pod": (core.read_namespaced_pod, "worker"),
    }
    wait_for(lambda: not any(exists(read, name, ns) for read, name in reads.values()), timeout=5)
    assert core.read_namespaced_config_map("unrelated", ns).metadata.uid == unrelated.metadata.uid
    stream = watch.Watch().stream(
        net.list_namespaced_network_policy, ns, resource_version=since, timeout_seconds=1
    )
    assert [(e["type"], e["object"].metadata.name) for e in stream] == [("DELETED", "group")]


def test_an_object_with_two_owners_stays_until_both_are_gone(core, ns):
    first, second = pending_pod(core, ns, "first"), pending_pod(core, ns, "second")
    configmap(core, ns, "shared", first, second)

    core.delete_namespaced_pod("first", ns)

    # the reference to the owner that went is dropped; the object stays for the other
    def references():
        return core.read_namespaced_config_map("shared", ns).metadata.owner_references

    wait_for(lambda: len(references()) == 1)
    [ref] = references()
    assert (ref.name, ref.uid) == ("second", second.metadata.uid)
    time.sleep(0.3)
    assert exists(core.read_namespaced_config_map, "shared", ns)

    core.delete_namespaced_pod("second", ns)
    wait_for(lambda: not exists(core.read_namespaced_config_map, "shared", ns), timeout=5)


def test_dangling_references_are_collected(kube, core, ns):
    never = {"metadata": {"name": "ghost", "uid": "0b7c0000-0000-4000-8000-000000000000"}}
    configmap(core, ns, "of-a-ghost", never)
    # an owner deleted before its dependent was written: the uid names nothing any more
    owner = pending_pod(core, ns, "gone")
    core.delete_namespaced_pod("gone", ns)
    configmap(core, ns, "too-late", owner)
    # same name, another object: the uid does not match, so the reference dangles
    pending_pod(core, ns, "gone")
    configmap(core, ns, "stale-uid", owner)
    kept = configmap(core, ns, "kept", core.read_namespaced_pod("gone", ns))

    names = ("of-a-ghost", "too-late", "stale-uid")
    wait_for(
        lambda: not any(exists(core.read_namespaced_config_map, n, ns) for n in names), timeout=5
    )
    assert core.read_namespaced_config_map("kept", ns).metadata.uid == kept.metadata.uid


def test_an_owner_in_another_namespace_does_not_own(kube, core, ns):
    other = f"{ns}-b"
    core.create_namespace({"metadata": {"name": other}})
    owner = pending_pod(core, other, "elsewhere")
    configmap(core, ns, "cross", owner)
    wait_for(lambda: not exists(core.read_namespaced_config_map, "cross", ns), timeout=5)
    [warning] = wait_for(
        lambda: [
            e
            for e in core.list_namespaced_event(ns).items
            if e.reason == "OwnerRefInvalidNamespace"
        ]
    )
    assert warning.type == "Warning"
    assert warning.involved_object.name == "cross"
    assert warning.message == (
        f"ownerRef [v1/Pod, namespace: {ns}, name: elsewhere, uid: {owner.metadata.uid}] "
        f'does not exist in namespace "{ns}"'
    )
    assert exists(core.read_namespaced_pod, "elsewhere", other)
    core.delete_namespace(other)


def test_a_cluster_scoped_owner_owns_namespaced_objects(kube, core, ns):
    node = kube.add_node(f"gc-owner-{ns}")
    ref = {"apiVersion": "v1", "kind": "Node", "name": node["metadata"]["name"]}
    ref["uid"] = node["metadata"]["uid"]
    core.create_namespaced_config_map(
        ns, {"metadata": {"name": "per-node", "ownerReferences": [ref]}}
    )
    time.sleep(0.4)
    assert exists(core.read_namespaced_config_map, "per-node", ns)
    core.delete_node(ref["name"])
    wait_for(lambda: not exists(core.read_namespaced_config_map, "per-node", ns), timeout=5)


def test_an_owner_of_a_kind_the_cluster_does_not_serve_never_lets_go(core, ns):
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "d-1"}
    core.create_namespaced_config_map(
        ns, {"metadata": {"name": "of-web", "ownerReferences": [ref]}}
    )
    time.sleep(0.5)  # the real collector cannot look the owner up, and retries forever
    assert exists(core.read_namespaced_config_map, "of-web", ns)


def test_orphan_keeps_the_dependents_without_the_reference(core, ns):
    owner, other = pending_pod(core, ns, "owner"), pending_pod(core, ns, "other")
    configmap(core, ns, "mine", owner)
    configmap(core, ns, "ours", owner, other)

    core.delete_namespaced_pod("owner", ns, propagation_policy="Orphan")

    time.sleep(0.5)
    assert core.read_namespaced_config_map("mine", ns).metadata.owner_references is None
    [ref] = core.read_namespaced_config_map("ours", ns).metadata.owner_references
    assert ref.uid == other.metadata.uid
    assert not exists(core.read_namespaced_pod, "owner", ns)


def test_foreground_and_the_legacy_orphan_flag_are_accepted(core, ns):
    owner = pending_pod(core, ns, "owner")
    configmap(core, ns, "dependent", owner)
    core.delete_namespaced_pod(
        "owner", ns, body=kubernetes.client.V1DeleteOptions(propagation_policy="Foreground")
    )
    wait_for(lambda: not exists(core.read_namespaced_config_map, "dependent", ns), timeout=5)

    owner = pending_pod(core, ns, "legacy")
    configmap(core, ns, "kept", owner)
    core.delete_namespaced_pod("legacy", ns, orphan_dependents=True)
    time.sleep(0.4)
    assert core.read_namespaced_config_map("kept", ns).metadata.owner_references is None

    pending_pod(core, ns, "p")
    code, body = refusal(core.delete_namespaced_pod, "p", ns, propagation_policy="Cascade")
    assert code == 422
    assert body["message"] == (
        'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Unsupported value: '
        '"Cascade": supported values: "Foreground", "Background", "Orphan", "nil"'
    )
    code, body = refusal(
        core.delete_namespaced_pod, "p", ns, propagation_policy="Orphan", orphan_dependents=True
    )
    assert code == 422
    assert body["message"].endswith("orphanDependents and deletionPropagation cannot be both set")
