"""Where a user's home volume can attach, so that their servers are placed there.

A ReadWriteOnce volume (block storage: every cloud's default class) attaches to one node at a
time; a pod on another node waits in ContainerCreating with "Multi-Attach error" until the
first pod is gone. All of a user's servers share one home (``home-{username}``), so while one
of them runs, the others are placed on its node; ReadWriteMany homes (a shared file system)
attach anywhere. A zonal volume reaches only nodes of its zone: with WaitForFirstConsumer it
was made in the zone of the node its first pod was scheduled to, which the claim names in
``volume.kubernetes.io/selected-node`` (docs/kubernetes.md, "Storage").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gputap_common import labels

#: where the single-user image's user has their home, and each user's home volume is mounted
KUBE_HOME = "/home/jovyan"

#: access modes of volumes that many nodes mount at once
SHARED_MODES = ("ReadWriteMany", "ReadOnlyMany")
_FINISHED = ("Succeeded", "Failed")


def attaches_to_one_node(access_modes: Iterable[str]) -> bool:
    return not any(mode in SHARED_MODES for mode in access_modes)


@dataclass(frozen=True)
class HomeHolder:
    """The pod holding a home on a node: the node's name and the server it runs."""

    node: str
    server: str


def home_holder(
    pods: Iterable[Mapping[str, Any]], namespace: str, claim: str, own_pod: str
) -> HomeHolder | None:
    """The first pod, other than ``own_pod``, that holds ``claim`` on a node: bound to it and
    not finished (a Terminating pod still holds it until it is gone)."""
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if meta.get("namespace") != namespace or meta.get("name") == own_pod:
            continue
        node = spec.get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in _FINISHED:
            continue
        claims = [
            (v.get("persistentVolumeClaim") or {}).get("claimName")
            for v in spec.get("volumes") or []
        ]
        if claim in claims:
            server = (meta.get("labels") or {}).get(labels.SERVER, "")
            return HomeHolder(node, server)
    return None


def home_note(holder: HomeHolder) -> str:
    """What a refusal adds when the home's node could not serve the request."""
    return (
        f" Your home is attached to node {holder.node}, where your server "
        f'"{holder.server}" runs: a ReadWriteOnce home attaches to one node at a time, so '
        "your other servers run on that node; stop it to choose from every node."
    )


ZONE_LABEL = "topology.kubernetes.io/zone"
SELECTED_NODE = "volume.kubernetes.io/selected-node"


def claim_zone(annotations: Mapping[str, str], node_zones: Mapping[str, str]) -> str | None:
    """The zone of a claim's volume (from the claim's annotations): that of the node the
    scheduler selected for it, if the node is known and zoned."""
    node = annotations.get(SELECTED_NODE)
    return node_zones.get(node) if node else None


def zone_note(zone: str) -> str:
    """What a refusal adds when the home's zone could not serve the request."""
    return (
        f" Your home is a volume in zone {zone}, which reaches only that zone's nodes, so "
        "your servers run there; ask an operator if you need what another zone has."
    )
