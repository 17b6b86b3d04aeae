"""A server's worker pods and their NetworkPolicy, built from the server's own pod. Pure:
dicts in, manifests out (as kubespawner/objects.py's make_* functions).

A worker runs what its server runs, where the server's files are: the server pod's image,
volumes (its home at the same path), security context and environment (without the hub's
credentials), with ``gputap-worker`` as its command and the GPUs placement chose. It is owned
by the server's pod (``ownerReferences``), so the garbage collector deletes it with the
server even if the hub is gone. The group's NetworkPolicy lets the server and its workers
reach one another (and the hub reach the agents), and adds nothing else.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gputap_common import labels as keys

#: the port every worker's agent listens on (each pod has an address of its own)
AGENT_PORT = 8790
#: the name of a worker's container (billing's pod meter meters it)
WORKER_CONTAINER = keys.WORKER_CONTAINER
#: variables of the server's container a worker does not get (the hub's credentials)
HUB_ONLY = ("JUPYTERHUB_", "JPY_")
ROLE_WORKER = "worker"
#: the label every namespace has with its own name
NAMESPACE_LABEL = "kubernetes.io/metadata.name"


def _container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for container in pod["spec"]["containers"]:
        if container["name"] == keys.SERVER_CONTAINER:
            return container
    return pod["spec"]["containers"][0]


def owner_reference(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A reference to the server's pod: the worker goes when it goes (no blockOwnerDeletion:
    that needs the pods/finalizers permission, and nothing waits for the workers)."""
    meta = pod["metadata"]
    return {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}


def group_selector(server_pod: Mapping[str, Any]) -> dict[str, str]:
    """The labels the server's pod and its workers share (and nothing else has)."""
    labels = server_pod["metadata"].get("labels") or {}
    return {keys.USER: labels[keys.USER], keys.SERVER: labels[keys.SERVER]}


def worker_pod(
    server_pod: Mapping[str, Any],
    settings: Mapping[str, Any],
    *,
    worker: str,
    token: str,
    offering: str,
    count: int,
    simulated: bool = False,
) -> dict[str, Any]:
    """The pod of worker ``worker`` (``w1``…) of the server whose pod is ``server_pod`` (as
    the API returns it), with ``settings`` (what :func:`~.objects.gpu_pod_settings` made for
    the worker's placement: labels, annotations, resources, node selector, tolerations)."""
    if not token:
        raise ValueError("token: a worker's agent answers its group's token only")
    meta, spec = server_pod["metadata"], server_pod["spec"]
    server = _container(server_pod)
    name = f"{meta['name']}-{worker}"
    if len(name) > 63:
        raise ValueError(f"{name!r}: pod names of workers must fit 63 characters")
    env = [dict(e) for e in server.get("env") or [] if not e["name"].startswith(HUB_ONLY)]
    ours = {
        **settings.get("environment", {}),
        "GPUTAP_OFFERING": offering,
        "GPUTAP_GPU_COUNT": str(count if settings.get("extra_resource_limits") else 0),
        "GPUTAP_SIMULATED": "1" if simulated else "0",
        "GPUTAP_WORKER_NAME": worker,
        "GPUTAP_WORKER_TOKEN": token,
    }
    env = [e for e in env if e["name"] not in ours]
    env += [{"name": k, "value": v} for k, v in ours.items()]
    requests = {**settings.get("extra_resource_guarantees", {})}
    for key, trait in (("cpu", "cpu_guarantee"), ("memory", "mem_guarantee")):
        if settings.get(trait) is not None:
            requests[key] = str(settings[trait])
    limits = dict(settings.get("extra_resource_limits", {}))
    if settings.get("mem_limit") is not None:
        limits["memory"] = str(settings["mem_limit"])
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": server["image"],
        "command": ["gputap-worker"],
        "args": ["--host", "0.0.0.0", "--port", str(AGENT_PORT), "--name", worker],
        "env": env,
        "ports": [{"name": "agent", "containerPort": AGENT_PORT}],
        "resources": {
            "requests": requests,
            "limits": limits,
        },
        "volumeMounts": copy.deepcopy(server.get("volumeMounts") or []),
    }
    for key in ("workingDir", "securityContext", "imagePullPolicy"):
        if server.get(key) is not None:
            container[key] = copy.deepcopy(server[key])
    labels = {
        **settings.get("extra_labels", {}),
        **group_selector(server_pod),
        keys.GROUP: meta["name"],
        keys.WORKER: worker,
        keys.ROLE: ROLE_WORKER,
        keys.MANAGED_BY: "gputap",
    }
    annotations = {**settings.get("extra_annotations", {}), keys.WORKER: worker}
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "volumes": copy.deepcopy(spec.get("volumes") or []),
        "nodeSelector": dict(settings.get("node_selector") or {}),
        "tolerations": copy.deepcopy(settings.get("tolerations") or []),
    }
    # what the server's pod runs first runs first here too (z2jh's block-cloud-metadata: user
    # code on a worker reaches the cloud's metadata no more than on the server)
    for key in ("initContainers", "securityContext", "priorityClassName", "schedulerName",
                "imagePullSecrets", "runtimeClassName"):  # fmt: skip
        if spec.get(key) is not None:
            pod_spec[key] = copy.deepcopy(spec[key])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_reference(server_pod)],
        },
        "spec": pod_spec,
    }


def hub_peer(release: str = "", namespace: str = "") -> dict[str, Any]:
    """The hub's pods as z2jh labels them (``component: hub`` of its ``release``), in the
    hub's ``namespace``: a NetworkPolicy peer (the hub knows both from z2jh's
    HELM_RELEASE_NAME and POD_NAMESPACE)."""
    labels = {"component": "hub", **({"release": release} if release else {})}
    peer: dict[str, Any] = {"podSelector": {"matchLabels": labels}}
    if namespace:
        peer["namespaceSelector"] = {"matchLabels": {NAMESPACE_LABEL: namespace}}
    return peer


def group_network_policy(server_pod: Mapping[str, Any], hub: Mapping[str, Any]) -> dict[str, Any]:
    """The group's NetworkPolicy: the server's pod and its workers (selected by their shared
    labels) reach one another on any port, and the ``hub`` peer (:func:`hub_peer`) reaches the
    workers' agents; z2jh's own policies keep what they allow. Its name carries the server
    pod's uid: a policy left by an earlier pod of the same name (the garbage collector deletes
    it with that pod) is never taken for this group's."""
    meta = server_pod["metadata"]
    members = {"podSelector": {"matchLabels": group_selector(server_pod)}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{meta['name']}-group-{meta['uid'][:8]}",
            "namespace": meta["namespace"],
            "labels": {
                **group_selector(server_pod),
                keys.GROUP: meta["name"],
                keys.MANAGED_BY: "gputap",
            },  # fmt: skip
            "ownerReferences": [owner_reference(server_pod)],
        },
        "spec": {
            "podSelector": {"matchLabels": group_selector(server_pod)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {"from": [members]},
                {"from": [dict(hub)], "ports": [{"protocol": "TCP", "port": AGENT_PORT}]},
            ],
            "egress": [{"to": [members]}],
        },
    }
