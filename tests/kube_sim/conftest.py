import json
import sys
import uuid

import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException

from tests.kube_sim import SimulatedCluster, admin_key

PY = sys.executable
NOWHERE = {"kubernetes.io/hostname": "no-such-node"}  # keeps a pod Pending, never bound


@pytest.fixture(scope="module")
def kube():
    """A cluster in a background thread, shared by a module: sync clients can block on it."""
    with SimulatedCluster.run_in_thread(crash_backoff=0.2, max_grace_seconds=2) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def core(kube):
    config = kubernetes.client.Configuration(host=kube.url, api_key=admin_key(kube))
    with kubernetes.client.ApiClient(config) as client:
        yield kubernetes.client.CoreV1Api(client)


@pytest.fixture
def v1(cluster):
    """The administrator's client of the module's own ``cluster`` fixture (a ClusterThread)."""
    with kubernetes.client.ApiClient(
        kubernetes.client.Configuration(host=cluster.url, api_key=admin_key(cluster))
    ) as c:
        yield kubernetes.client.CoreV1Api(c)


@pytest.fixture
def ns(core):
    """A fresh namespace per test, so tests sharing a cluster do not see each other's pods."""
    name = "t-" + uuid.uuid4().hex[:8]
    core.create_namespace({"metadata": {"name": name}})
    return name


def pod_body(name, command=None, env=None, resources=None, **spec):
    container = {"name": "notebook", "image": "quay.io/jupyter/base-notebook:latest"}
    if command:
        container["command"] = command
    if env:
        container["env"] = env
    if resources:
        container["resources"] = resources
    return {
        "metadata": {"name": name, "labels": {"app": "jupyterhub"}},
        "spec": {"containers": [container], **spec},
    }


def restricted(body: dict, uid: int = 1000) -> dict:
    """``body`` (a pod) with what Pod Security restricted asks, running as ``uid``."""
    spec = body["spec"]
    spec["securityContext"] = {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "seccompProfile": {"type": "RuntimeDefault"},
        **spec.get("securityContext", {}),
    }
    for container in spec["containers"]:
        container["securityContext"] = {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            **container.get("securityContext", {}),
        }
    return body


def owned_by(*owners, **flags) -> dict:
    """metadata.ownerReferences naming these pods (client models, or dicts with metadata)."""
    refs = []
    for owner in owners:
        meta = owner["metadata"] if isinstance(owner, dict) else owner.metadata.to_dict()
        ref = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
        refs.append({**ref, **flags})
    return {"ownerReferences": refs}


def pending_pod(core, ns, name):
    """A pod no node matches: it stays Pending, and a delete removes it at once."""
    return core.create_namespaced_pod(ns, pod_body(name, nodeSelector=NOWHERE))


def configmap(core, ns, name, *owners, **flags):
    """A ConfigMap owned by these pods (ownerReference ``flags`` such as controller=True)."""
    return core.create_namespaced_config_map(
        ns, {"metadata": {"name": name, **owned_by(*owners, **flags)}, "data": {"k": "v"}}
    )


def exists(read, *args) -> bool:
    """Whether read(*args) finds the object (False on 404)."""
    try:
        read(*args)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def refusal(call, *args, **kwargs) -> tuple[int, dict]:
    """The status code and Status body of a call that must fail."""
    with pytest.raises(ApiException) as caught:
        call(*args, **kwargs)
    return caught.value.status, json.loads(caught.value.body)
