"""What exists and what is free on a Kubernetes cluster, from nodes and pods.

GPU nodes are recognised by their GPU Feature Discovery labels and the NVIDIA device plugin's
allocatable extended resources, in each shape the device plugin has (k8s-device-plugin,
internal/lm): ``nvidia.com/gpu`` whole cards; MIG slices as ``nvidia.com/mig-<profile>``
(mixed strategy), or as ``nvidia.com/gpu`` on a node whose product label ends
``-MIG-<profile>`` (single strategy); time-sliced shares as ``nvidia.com/gpu.shared``
(``renameByDefault``), or as ``nvidia.com/gpu`` on a node whose product label ends
``-SHARED``. Free = allocatable (the device plugin leaves unhealthy GPUs out) minus the
requests of non-terminal pods bound to the node. A node that takes no new pods offers
nothing: cordoned, not Ready, tainted by Kubernetes itself (``node.kubernetes.io/``
not-ready, unreachable, ... with NoSchedule or NoExecute), tainted NoSchedule or NoExecute by
anything else (the cluster autoscaler's ``ToBeDeletedByClusterAutoscaler``, a health agent)
where the servers' tolerations do not match the taint, or closed by gputap for a fault.

GPU faults (spawner/kube/health.py, docs/design-gpu-faults.md): the fault desk holds units of
faulty devices out (:meth:`ClusterInventory.hold_out`) and closes faulty nodes
(:meth:`ClusterInventory.close`) until an admin returns them. :class:`ClusterInventory` is pure:
it takes node and pod objects (Kubernetes JSON) one event at a time, each an O(1) update of
its :class:`FreeView`.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from gputap_common import labels

from ..core.catalog import SHARED, Catalog, offering_key
from ..core.placement import FreeView

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_RESOURCE = "nvidia.com/gpu.shared"
MIG_PREFIX = "nvidia.com/mig-"
PRODUCT_LABEL = "nvidia.com/gpu.product"
HOSTNAME_LABEL = "kubernetes.io/hostname"
#: GFD's product label under the single MIG strategy: "<card>-MIG-<profile>"
_SINGLE_MIG = re.compile(r"(?P<card>.+)-MIG-(?P<profile>[1-7]g\.\d+gb)")
#: GFD's suffix on the product label of time-sliced GPUs not renamed to nvidia.com/gpu.shared
SHARED_SUFFIX = "-SHARED"
#: taints the node lifecycle controller and the kubelet set (not-ready, unreachable,
#: memory-pressure, unschedulable, ...): no gputap pod tolerates them
KUBERNETES_TAINTS = "node.kubernetes.io/"
#: taint effects that keep a new pod off a node (PreferNoSchedule only discourages)
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
#: what every GPU server and worker tolerates: the GPU nodes' taint (spawner.kube.objects)
GPU_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


_QUANTITY = re.compile(
    r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:[eE](?P<exponent>[+-]?[0-9]+)|(?P<suffix>[numkMGTPE]|[KMGTPE]i))?"
)
_SCALE = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1,
          **{s: 1000**i for i, s in enumerate("kMGTPE", 1)},
          **{f"{s}i": 1024**i for i, s in enumerate("KMGTPE", 1)}}  # fmt: skip


def parse_quantity(value: Any) -> Fraction:
    """A Kubernetes quantity ("3920m", "13621Mi", "4G", 2.5) as an exact number; 0 for what
    is not one (a node or pod object with a bad quantity counts as none)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Fraction(value)
    m = _QUANTITY.fullmatch(str(value).strip())
    if not m:
        return Fraction(0)
    scale = Fraction(10) ** int(m["exponent"]) if m["exponent"] else _SCALE[m["suffix"] or ""]
    return Fraction(m["number"]) * scale


def quantity(value: Any) -> int:
    """An extended-resource quantity ("2", 2) as an int; GPUs are never fractional."""
    try:
        return int(str(value))
    except ValueError:
        return 0


@dataclass
class NodeGPUs:
    """The GPU offerings of one node: offering key -> (resource name, allocatable)."""

    name: str
    resources: dict[str, tuple[str, int]] = field(default_factory=dict)
    schedulable: bool = True
    product: str | None = None
    hostname: str | None = None
    #: allocatable CPU (millicores) and memory (bytes)
    cpu_milli: int = 0
    memory_bytes: int = 0
    #: resource -> capacity (unhealthy devices included), for the resources offered
    capacity: dict[str, int] = field(default_factory=dict)


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Whether one of a pod's ``tolerations`` matches ``taint``, as Kubernetes matches them
    (``Toleration.ToleratesTaint``): the same effect or none named, the same key or none
    named, and operator ``Exists``, or ``Equal`` (the default) with the same value."""
    for toleration in tolerations:
        effect, key = toleration.get("effect"), toleration.get("key")
        if effect and effect != taint.get("effect"):
            continue
        if key and key != taint.get("key"):
            continue
        if toleration.get("operator") == "Exists":
            return True
        if (toleration.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def toleration_list(tolerations: Sequence[Any] | Mapping[str, Any]) -> list[Any]:
    """KubeSpawner's ``tolerations`` as the list it puts on pods: a list as it is, a dict's
    values in the order of their keys."""
    if isinstance(tolerations, Mapping):
        return [tolerations[key] for key in sorted(tolerations)]
    return list(tolerations)


def takes_pods(
    node: Mapping[str, Any], tolerations: Sequence[Mapping[str, Any]] = GPU_TOLERATIONS
) -> bool:
    """Whether the scheduler would place a new gputap pod, one with ``tolerations``, on the
    node: not cordoned, Ready, without a NoSchedule or NoExecute taint of Kubernetes' own
    (never tolerated here, whatever the pods carry), and without another such taint the
    tolerations do not match (kube-scheduler's TaintToleration filter). (kube-scheduler
    keeps pods off NotReady nodes through the taints alone; a Ready condition that is not
    True counts too, for the moments before the controller taints the node.)"""
    spec, status = node.get("spec") or {}, node.get("status") or {}
    if spec.get("unschedulable", False):
        return False
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    if ready is not None and ready.get("status") != "True":
        return False
    return not any(
        t.get("effect") in BLOCKING_EFFECTS
        and (str(t.get("key", "")).startswith(KUBERNETES_TAINTS) or not tolerates(tolerations, t))
        for t in spec.get("taints") or []
    )


def node_gpus(
    node: Mapping[str, Any],
    catalog: Catalog,
    tolerations: Sequence[Mapping[str, Any]] = GPU_TOLERATIONS,
) -> NodeGPUs:
    """Offerings of a node object from its GFD product label and allocatable resources; a
    node that takes no pod with ``tolerations`` is marked not schedulable (:func:`takes_pods`)."""
    meta, status = node.get("metadata", {}), node.get("status") or {}
    product = (meta.get("labels") or {}).get(PRODUCT_LABEL)
    result = NodeGPUs(
        meta["name"],
        schedulable=takes_pods(node, tolerations),
        product=product,
        hostname=(meta.get("labels") or {}).get(HOSTNAME_LABEL),
        cpu_milli=int(parse_quantity((status.get("allocatable") or {}).get("cpu", 0)) * 1000),
        memory_bytes=int(parse_quantity((status.get("allocatable") or {}).get("memory", 0))),
    )
    if not product:
        return result
    # what nvidia.com/gpu is on this node: whole cards, a MIG profile, or time-sliced shares
    gpu_kind: str | None = None
    name = product
    if name.endswith(SHARED_SUFFIX):
        name, gpu_kind = name.removesuffix(SHARED_SUFFIX), SHARED
    single = _SINGLE_MIG.fullmatch(name)
    if single and gpu_kind is None:
        name, gpu_kind = single["card"], single["profile"]
    card = catalog.card_for_product(name)
    # "-MIG-INVALID" (GFD: the single strategy with mixed profiles), or MIG slices shared
    odd_mig = "-MIG-" in name and (not single or gpu_kind == SHARED)
    if card is None or odd_mig:
        why = "is no MIG layout gputap sells" if card else "is not in the catalog"
        log.warning("node %s: GPU %s %s; not offered", meta["name"], product, why)
        return result
    if gpu_kind not in (None, SHARED) and card.profile(gpu_kind) is None:
        log.warning("node %s: %s has no MIG profile %s; not offered", meta["name"], card.sku,
                    gpu_kind)  # fmt: skip
        return result
    allocatable = status.get("allocatable") or {}
    for resource, value in allocatable.items():
        count = quantity(value)
        if count <= 0:
            continue
        if resource == GPU_RESOURCE:
            result.resources[offering_key(card.sku, gpu_kind)] = (resource, count)
        elif resource == SHARED_RESOURCE:
            result.resources[offering_key(card.sku, SHARED)] = (resource, count)
        elif resource.startswith(MIG_PREFIX):
            profile = resource[len(MIG_PREFIX) :]
            if card.profile(profile) is not None:
                result.resources[offering_key(card.sku, profile)] = (resource, count)
    capacity = status.get("capacity") or {}
    for resource, count in result.resources.values():
        result.capacity[resource] = max(count, quantity(capacity.get(resource, count)))
    return result


def pod_requests(pod: Mapping[str, Any]) -> Counter[str]:
    """GPU and MIG units a pod asks for (limits, or requests when no limit is set)."""
    wanted: Counter[str] = Counter()
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for resource, value in asked.items():
            if resource in (GPU_RESOURCE, SHARED_RESOURCE) or resource.startswith(MIG_PREFIX):
                wanted[resource] += quantity(value)
    return wanted


def host_requests(pod: Mapping[str, Any]) -> Counter[str]:
    """CPU (``cpu``, millicores) and memory (``memory``, bytes) a pod holds on its node, as
    the scheduler counts them: requests, or limits where no request is given."""
    wanted: Counter[str] = Counter()
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        wanted["cpu"] += int(parse_quantity(asked.get("cpu", 0)) * 1000)
        wanted["memory"] += int(parse_quantity(asked.get("memory", 0)))
    return +wanted


class ClusterInventory:
    """Nodes and pods → free GPUs and slices per node, kept current event by event."""

    def __init__(
        self, catalog: Catalog, tolerations: Sequence[Any] | Mapping[str, Any] = ()
    ) -> None:
        """``tolerations``: those the operator gives every server (KubeSpawner's
        ``tolerations``, a list or a dict; on the chart z2jh's ``singleuser.extraTolerations``
        and ``scheduling.userPods.tolerations``); GPU servers carry :data:`GPU_TOLERATIONS`
        besides. A node tainted against them offers nothing."""
        self.catalog = catalog
        self.configured_tolerations = toleration_list(tolerations)
        #: what a GPU server's pod tolerates
        self.tolerations = [*GPU_TOLERATIONS, *self.configured_tolerations]
        self.nodes: dict[str, NodeGPUs] = {}
        self.view = FreeView()
        #: what an on-demand server may take: free units plus those held by spot servers
        self.preemptible_view = FreeView()
        self._used: dict[str, Counter[str]] = {}
        self._spot_used: dict[str, Counter[str]] = {}
        #: what placeholder pods hold (spawner/kube/placeholders.py), part of _spot_used
        self._placeholder_used: dict[str, Counter[str]] = {}
        # pod uid -> (node, requests, spot, placeholder) for pods that hold resources
        self._holding: dict[str, tuple[str, Counter[str], bool, bool]] = {}
        # placements made but whose pod is not yet seen bound: holder -> (node, requests)
        self._reserved: dict[str, tuple[str, Counter[str]]] = {}
        #: node -> resource -> units of faulty devices kept out (hold_out), nodes not (yet)
        #: seen included: the fault book is read before the first list
        self.held_out: dict[str, Counter[str]] = {}
        #: nodes that offer nothing for a fault or an admin's drain (close)
        self.closed: set[str] = set()

    def _usable(self, node: NodeGPUs, resource: str, allocatable: int) -> int:
        """Units of ``resource`` the node may give: allocatable, but never more than its
        capacity less the units held out. Not allocatable minus held: while the device
        plugin still reports a held device Unhealthy, allocatable has left it out already;
        after the plugin restarts and reports it Healthy (its check starts afresh), capacity
        less held still keeps it out."""
        if not node.schedulable or node.name in self.closed:
            return 0
        held = self.held_out.get(node.name, Counter())[resource]
        capacity = node.capacity.get(resource, allocatable)
        return max(0, min(allocatable, capacity - held))

    def _refresh(self, node_name: str) -> None:
        node = self.nodes.get(node_name)
        if node is None:
            return
        used = self._used.get(node_name, Counter())
        spot = self._spot_used.get(node_name, Counter())
        for key, (resource, allocatable) in node.resources.items():
            usable = self._usable(node, resource, allocatable)
            free = max(0, usable - used[resource])
            self.view.set(key, node_name, free, usable)
            preemptible = min(usable, max(0, usable - used[resource] + spot[resource]))
            self.preemptible_view.set(key, node_name, preemptible, usable)

    def hold_out(self, node: str, resource: str, units: int) -> None:
        """Keep ``units`` more of ``resource`` on ``node`` out of what is offered: faulty
        devices, out until :meth:`give_back`, even when the device plugin reports them
        allocatable again (see ``_usable``). A node not seen yet gets them when it is."""
        if units < 0:
            raise ValueError(f"units to hold out must be 0 or more, not {units}")
        if units:
            self.held_out.setdefault(node, Counter())[resource] += units
            self._refresh(node)

    def give_back(self, node: str, resource: str, units: int | None = None) -> None:
        """Offer again ``units`` (None: all) of ``resource`` held out on ``node``."""
        if units is not None and units < 0:
            raise ValueError(f"units to give back must be 0 or more, not {units}")
        held = self.held_out.get(node)
        if not held or not held[resource]:
            return
        left = 0 if units is None else max(0, held[resource] - units)
        if left:
            held[resource] = left
        else:
            del held[resource]
            if not held:
                del self.held_out[node]
        self._refresh(node)

    def close(self, node: str) -> None:
        """Offer nothing on ``node`` (its capacity counts 0, as a cordoned node's) until
        :meth:`reopen`; its pods run on and are counted as before."""
        self.closed.add(node)
        self._refresh(node)

    def reopen(self, node: str) -> None:
        self.closed.discard(node)
        self._refresh(node)

    def apply_node(self, event: str, node: Mapping[str, Any]) -> None:
        """A node was ADDED, MODIFIED or DELETED."""
        name = node["metadata"]["name"]
        old = self.nodes.pop(name, None)
        if old is not None:
            for key in old.resources:
                self.view.set(key, name, 0, 0)
                self.preemptible_view.set(key, name, 0, 0)
        if event != "DELETED":
            self.nodes[name] = node_gpus(node, self.catalog, self.tolerations)
            self._refresh(name)

    def resource_of(self, node: str, key: str) -> str:
        """The extended resource offering ``key`` is on ``node`` (``nvidia.com/gpu`` when
        the node does not offer it)."""
        gpus = self.nodes.get(node)
        return gpus.resources[key][0] if gpus and key in gpus.resources else "nvidia.com/gpu"

    def reserve(self, holder: str, key: str, node: str, count: int) -> None:
        """Hold ``count`` units of ``key`` on ``node`` for a pod about to be created, so the
        next placement does not count them free before the watch shows the pod bound."""
        self.release(holder)
        resource = self.nodes[node].resources[key][0]
        wanted = Counter({resource: count})
        self._reserved[holder] = (node, wanted)
        self._used.setdefault(node, Counter()).update(wanted)
        self._refresh(node)

    def release(self, holder: str) -> None:
        """Drop a reservation (its pod is bound and counted, or the spawn failed)."""
        reserved = self._reserved.pop(holder, None)
        if reserved is not None:
            node, wanted = reserved
            self._used[node].subtract(wanted)
            self._refresh(node)

    def apply_pod(self, event: str, pod: Mapping[str, Any]) -> None:
        """A pod was ADDED, MODIFIED or DELETED."""
        meta = pod["metadata"]
        holder = (meta.get("annotations") or {}).get(labels.RESERVATION)
        uid = meta.get("uid") or meta["name"]
        node_name = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        holds = event != "DELETED" and node_name and phase not in labels.TERMINAL_PHASES
        wanted = pod_requests(pod) + host_requests(pod) if holds else Counter()
        # interruptible pods, which on-demand pods may preempt: spot servers and placeholders
        pod_labels = meta.get("labels") or {}
        placeholder = labels.PLACEHOLDER in pod_labels
        spot = placeholder or pod_labels.get(labels.PRICE_CLASS) == "spot"
        previous = self._holding.pop(uid, None)
        if previous is not None:
            old_node, old_wanted, was_spot, was_placeholder = previous
            self._used[old_node].subtract(old_wanted)
            if was_spot:
                self._spot_used[old_node].subtract(old_wanted)
            if was_placeholder:
                self._placeholder_used[old_node].subtract(old_wanted)
            if old_node != node_name:
                self._refresh(old_node)
        if holder and (holds or event == "DELETED" or phase in labels.TERMINAL_PHASES):
            self.release(holder)  # the pod itself is counted from now on
        if holds and wanted:
            self._holding[uid] = (node_name, wanted, spot, placeholder)
            self._used.setdefault(node_name, Counter()).update(wanted)
            if spot:
                self._spot_used.setdefault(node_name, Counter()).update(wanted)
            if placeholder:
                self._placeholder_used.setdefault(node_name, Counter()).update(wanted)
        if node_name:
            self._refresh(node_name)

    def shortfall(self, node_name: str, key: str) -> int:
        """Units of offering ``key`` that pods bound to ``node_name`` and reservations on it
        ask beyond what it gives: a start placed on room that spot servers or placeholders
        hold, which one of them must leave."""
        node = self.nodes.get(node_name)
        if node is None or key not in node.resources:
            return 0
        resource, allocatable = node.resources[key]
        used = self._used.get(node_name, Counter())[resource]
        return max(0, used - self._usable(node, resource, allocatable))

    def room(self, node_name: str) -> tuple[int, int] | None:
        """CPU (millicores) and memory (bytes) of a node that no pod bound to it requests,
        placeholders apart (a server takes their room); None for a node not known."""
        node = self.nodes.get(node_name)
        if node is None:
            return None
        used = self._used.get(node_name, Counter()) - self._placeholder_used.get(
            node_name, Counter()
        )
        return node.cpu_milli - used["cpu"], node.memory_bytes - used["memory"]

    def reset(self) -> None:
        """Forget what the cluster said (before a full relist); holds and closed nodes,
        gputap's own, stay."""
        held, closed = self.held_out, self.closed
        self.__init__(self.catalog, self.configured_tolerations)
        self.held_out, self.closed = held, closed
