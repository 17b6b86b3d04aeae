"""Placeholder pods: GPU headroom kept per offering, as z2jh's user placeholders keep CPU headroom.

A placeholder is a pause container sized as one server of its offering (the GPU, slice or
share, and the CPU and memory a server of it gets), at the spot PriorityClass. It holds room
on a GPU node so that a class arriving finds it there: an on-demand server placed on it
preempts the placeholder (its class is above spot), the hub makes the placeholder again, and
the new one, Pending, is what asks the cluster autoscaler for the next node before the next
user does. The spot class never preempts (``preemptionPolicy: Never``), so placeholders take
only free room and never stop a server; spot servers cannot take their room either (the same
priority), which is the point: it is kept for on-demand starts (docs/kubernetes.md,
"Placeholders").

The hub's inventory counts a placeholder's devices as an on-demand server may take them, like a
spot server's, and gives a server placed there the placeholder's CPU and memory
(spawner/kube/inventory.py). Billing meters only pods with a user (``gputap.io/user``):
placeholders bill nobody.

The pod manifests and the reconciliation are pure; :class:`PlaceholderKeeper` is the I/O.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import ApiException

from gputap_common import labels as keys

from ..core.catalog import Catalog
from .inventory import GPU_TOLERATIONS, PRODUCT_LABEL, NodeGPUs
from .objects import gpu_resource, server_size

log = logging.getLogger(__name__)

#: app.kubernetes.io/component of placeholder pods
COMPONENT = "gputap-placeholder"
#: the most placeholders of one offering (a typo of 1000 must not ask for 1000 nodes)
MAX_PER_OFFERING = 64
#: the pause image's own user (z2jh's placeholders and pre-puller run it so)
PAUSE_USER = 65534
#: how often the keeper looks even when no pod event wakes it
EVERY_SECONDS = 10.0


def offering_slug(key: str) -> str:
    """``a100-80gb-1g-10gb`` for ``A100-80GB/1g.10gb``: a label value and part of a pod name
    (catalog keys are letters, digits, ``-``, ``.`` and one ``/``)."""
    return re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-")


def placeholder_name(key: str, index: int) -> str:
    """``gputap-placeholder-a100-80gb-1g-10gb-0`` for the first of ``A100-80GB/1g.10gb``."""
    return f"{COMPONENT}-{offering_slug(key)}-{index}"


def check_wanted(wanted: Mapping[str, int], catalog: Catalog) -> dict[str, int]:
    """The placeholders asked for (offering key -> how many), checked: GPU offerings of the
    catalog, 0 to :data:`MAX_PER_OFFERING` each; ``ValueError`` saying what is wrong."""
    checked = {}
    for key, count in wanted.items():
        try:
            offering = catalog.offering(key)
        except ValueError as e:
            raise ValueError(f"{e}: placeholders are kept per card or slice") from None
        if offering.kind == "cpu":
            raise ValueError(
                "cpu: CPU headroom is z2jh's own scheduling.userPlaceholder; placeholders here "
                "are per card or slice"
            )
        whole = isinstance(count, int) and not isinstance(count, bool)
        if not whole or not 0 <= count <= MAX_PER_OFFERING:
            raise ValueError(f"{key}: {count!r} placeholders; give 0 to {MAX_PER_OFFERING}")
        checked[key] = count
    return checked


@dataclass(frozen=True)
class Shape:
    """How a node offers an offering: the resource asked for, and the product labels of
    nodes that have it."""

    resource: str
    products: tuple[str, ...]


def placeholder_shape(key: str, catalog: Catalog, nodes: Mapping[str, NodeGPUs]) -> Shape:
    """The shape of the nodes that offer ``key`` now (the first by name: under the single
    MIG strategy a slice is ``nvidia.com/gpu`` on a "-MIG-" product), else the catalog's:
    ``nvidia.com/gpu`` for a card, the mixed strategy's ``nvidia.com/mig-<profile>`` for a
    slice, on any of the card's products (a node group scaled to zero)."""
    for name in sorted(nodes):
        node = nodes[name]
        if key in node.resources and node.product:
            return Shape(node.resources[key][0], (node.product,))
    offering = catalog.offering(key)
    return Shape(gpu_resource(offering), catalog.card(offering.card).products)


def make_placeholder_pod(
    *,
    name: str,
    namespace: str,
    key: str,
    catalog: Catalog,
    shape: Shape,
    priority_class: str,
    image: str,
    tolerations: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The placeholder pod (Kubernetes JSON) for one server of offering ``key``: the
    server's GPU resource, CPU and memory, on a node of ``shape``'s products, tolerating the
    GPU taint and ``tolerations`` (those every server carries), at ``priority_class``; a
    pause container under Pod Security "restricted"."""
    cpu, memory = server_size(catalog.offering(key), catalog)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                keys.PLACEHOLDER: offering_slug(key),
                "app.kubernetes.io/component": COMPONENT,
                keys.MANAGED_BY: "gputap",
            },
            "annotations": {keys.OFFERING: key},
        },
        "spec": {
            "priorityClassName": priority_class,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": PRODUCT_LABEL,
                                        "operator": "In",
                                        "values": list(shape.products),
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
            "tolerations": [*GPU_TOLERATIONS, *tolerations],
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": PAUSE_USER,
                "runAsGroup": PAUSE_USER,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "pause",
                    "image": image,
                    "resources": {
                        "requests": {"cpu": f"{cpu:g}", "memory": memory, shape.resource: "1"},
                        "limits": {"memory": memory, shape.resource: "1"},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def reconcile(
    wanted: Mapping[str, int], pods: Iterable[Mapping[str, Any]]
) -> tuple[list[tuple[str, int]], list[str]]:
    """What to make and what to delete so that ``wanted`` placeholders of each offering exist
    among ``pods`` (the placeholders seen, of the keeper's namespace): (offering key, index)
    pairs to create, names to delete (those no longer wanted, and those that ended: a pod
    the kubelet evicted or that failed is made afresh). A pod being deleted is left to go."""
    names = {placeholder_name(key, i): (key, i) for key, n in wanted.items() for i in range(n)}
    seen: set[str] = set()
    delete: list[str] = []
    for pod in pods:
        meta = pod["metadata"]
        name = meta["name"]
        seen.add(name)
        if meta.get("deletionTimestamp"):
            continue
        ended = (pod.get("status") or {}).get("phase") in keys.TERMINAL_PHASES
        if name not in names or ended:
            delete.append(name)
    create = [names[name] for name in sorted(names) if name not in seen]
    return create, sorted(delete)


def placeholders_to_evict(
    pods: Iterable[Mapping[str, Any]], node: str, resource: str, units: int
) -> list[tuple[str, str]]:
    """(namespace, name) of the placeholders on ``node`` holding ``resource`` that must go
    for ``units`` more of it, the newest first; those already going count as gone."""
    found, going = [], 0
    for pod in pods:
        meta = pod["metadata"]
        spec = pod.get("spec") or {}
        if keys.PLACEHOLDER not in (meta.get("labels") or {}) or spec.get("nodeName") != node:
            continue
        requests = [
            (c.get("resources") or {}).get("requests") or {} for c in spec.get("containers") or []
        ]
        if not any(resource in r for r in requests):
            continue
        if meta.get("deletionTimestamp"):
            going += 1
        else:
            found.append((meta.get("creationTimestamp") or "", meta["namespace"], meta["name"]))
    found.sort(reverse=True)
    return [(namespace, name) for _, namespace, name in found[: max(0, units - going)]]


class PlaceholderKeeper:
    """Keeps the wanted placeholders in one namespace, from the hub's cluster watch."""

    def __init__(
        self,
        api: Any,
        *,
        namespace: str,
        wanted: Mapping[str, int],
        catalog: Catalog,
        nodes: Callable[[], Mapping[str, NodeGPUs]],
        pods: Callable[[], Iterable[Mapping[str, Any]]],
        priority_class: str,
        image: str,
        tolerations: Iterable[Mapping[str, Any]] = (),
    ):
        """``api``: a CoreV1Api; ``nodes`` and ``pods``: what the watch last saw (the
        inventory's GPU nodes, every pod)."""
        self.api = api
        self.namespace = namespace
        self.wanted = check_wanted(wanted, catalog)
        self.catalog = catalog
        self.nodes = nodes
        self.pods = pods
        self.priority_class = priority_class
        self.image = image
        self.tolerations = list(tolerations)
        self.changed = asyncio.Event()

    def placeholders(self) -> list[Mapping[str, Any]]:
        """The placeholder pods of the keeper's namespace, as the watch last saw them."""
        return [
            pod
            for pod in self.pods()
            if pod["metadata"].get("namespace") == self.namespace
            and keys.PLACEHOLDER in (pod["metadata"].get("labels") or {})
        ]

    async def once(self) -> tuple[int, int]:
        """One reconciliation; how many pods it made and deleted."""
        create, delete = reconcile(self.wanted, self.placeholders())
        made = 0
        for key, index in create:
            name = placeholder_name(key, index)
            shape = placeholder_shape(key, self.catalog, self.nodes())
            pod = make_placeholder_pod(
                name=name,
                namespace=self.namespace,
                key=key,
                catalog=self.catalog,
                shape=shape,
                priority_class=self.priority_class,
                image=self.image,
                tolerations=self.tolerations,
            )
            try:
                await self.api.create_namespaced_pod(self.namespace, pod)
            except ApiException as e:
                if e.status != 409:  # 409: the watch has not shown it yet
                    log.warning("placeholder %s/%s not made: %s", self.namespace, name, e.reason)
                continue
            made += 1
            log.info("placeholder %s/%s made for %s", self.namespace, name, key)
        for name in delete:
            try:
                await self.api.delete_namespaced_pod(name, self.namespace)
            except ApiException as e:
                if e.status != 404:
                    log.warning("placeholder %s/%s not deleted: %s", self.namespace, name, e.reason)
                continue
            log.info("placeholder %s/%s deleted", self.namespace, name)
        return made, len(delete)

    async def run(self) -> None:
        """Reconcile whenever the watch sees a change, at least every :data:`EVERY_SECONDS`."""
        while True:
            self.changed.clear()
            try:
                await self.once()
            except Exception:
                log.exception("placeholders in %s not reconciled", self.namespace)
            try:
                async with asyncio.timeout(EVERY_SECONDS):
                    await self.changed.wait()
            except TimeoutError:
                pass
            # a burst of pod events is one reconciliation
            await asyncio.sleep(0.5)
