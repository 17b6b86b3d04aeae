"""GPU faults on Kubernetes, from the node and pod objects the hub already watches.

What the cluster says is broken (docs/design-gpu-faults.md): a node condition of a health
agent (Node Problem Detector's ``GPUXIDErrors``) with status True; a taint under
``nvidia.com/`` (the GPU operator's, an admin's) with effect NoSchedule or NoExecute, but for
the GPU-presence taint ``nvidia.com/gpu`` GKE and the simulated cluster set on every GPU node;
a ``nvidia.com/`` resource whose allocatable is below its capacity (the NVIDIA device plugin
leaves an Unhealthy device out of allocatable; the kubelet keeps it in capacity); a pod's
``status.containerStatuses[].allocatedResourcesStatus`` naming a device Unhealthy (feature
gate ResourceHealthStatus: alpha from Kubernetes 1.31, beta and on from 1.36).

:func:`node_faults` and :func:`pod_unhealthy` read one object each (pure).
:class:`KubeHealthWatcher` turns the events the ClusterWatcher sees into :class:`Fault` s, new
findings only, and hands each to its ``report`` callable.

Counting units (``Fault.units``, what the fault desk holds out of the inventory): one faulty
device is one unit, whichever report shows it first. The device plugin's one change shows
twice, as an allocatable drop on the node and as the pod's Unhealthy device, in either order:

- a pod's device newly Unhealthy accounts for one unit of drop: one the node already showed
  and counted (then the pod's fault has ``units=0``: it names the device and the pod to
  recover, the unit is held already), or one still to come (the pod's fault has ``units=1``
  and the coming drop is that much smaller);
- a drop counts what the pods have not already counted (a drop of 1 after a pod's report of
  that device makes no fault); a drop no pod explains is a fault of the node's ``units``, no
  device named (which pod it hit is unknown: the desk asks the servers on that node);
- a device a pod names again, after the plugin reported it Healthy (restarted) and then
  Unhealthy once more, has ``units=0``: the hold of its first fault still stands. The one
  case counted twice: the plugin restarts, the drop of a device held before shows before any
  pod names it again (the drop cannot say which device it is); an admin's return of the
  extra unit corrects it. Holding one too many keeps a GPU idle; one too few would hand a
  broken GPU to the next user.

Only nodes with GPUs are watched (a ``nvidia.com/`` resource in capacity). A relist repeats
nothing: findings are new against what this watcher saw last of the same node or pod (a
condition that went False and comes back True is new). A new watcher (a hub restart) reports
what it finds once more; the health book keeps the first fault of a device already faulty.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gputap_common import clock, labels

from ..core.health import Fault
from .inventory import quantity

log = logging.getLogger(__name__)

NVIDIA = "nvidia.com/"
#: the taint marking a node as having GPUs (GKE, the simulated cluster): not a fault
GPU_PRESENCE_TAINT = "nvidia.com/gpu"
FAULT_EFFECTS = ("NoSchedule", "NoExecute")
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class NodeHealth:
    """What one node object says of its GPUs' health."""

    name: str
    #: why the whole node is faulty: "condition GPUXIDErrors is True",
    #: "taint nvidia.com/gpu-unhealthy:NoSchedule"
    reasons: tuple[str, ...] = ()
    #: the agents' words for some reasons (a condition's reason and message, a taint's value)
    notes: dict[str, str] = field(default_factory=dict)
    #: ``nvidia.com/`` resource -> units in capacity that are not allocatable
    gpus_out: dict[str, int] = field(default_factory=dict)
    #: ``nvidia.com/`` resource -> capacity, for the resources the node has
    capacity: dict[str, int] = field(default_factory=dict)

    @property
    def has_gpus(self) -> bool:
        return bool(self.capacity)

    def detail(self, reason: str) -> str:
        note = self.notes.get(reason)
        return f"{reason} ({note})" if note else reason


def node_faults(node: Mapping[str, Any], conditions: Iterable[str]) -> NodeHealth:
    """The faults ``node`` (a Node as the API returns it) shows: its conditions among
    ``conditions`` whose status is "True", its ``nvidia.com/`` taints but the GPU-presence
    one with effect NoSchedule or NoExecute, and per ``nvidia.com/`` resource how many
    units of capacity are not allocatable."""
    meta, spec, status = node["metadata"], node.get("spec") or {}, node.get("status") or {}
    bad = set(conditions)
    reasons: list[str] = []
    notes: dict[str, str] = {}
    for condition in status.get("conditions") or []:
        kind = condition.get("type")
        if kind in bad and condition.get("status") == "True":
            reason = f"condition {kind} is True"
            reasons.append(reason)
            words = ": ".join(w for w in (condition.get("reason"), condition.get("message")) if w)
            if words:
                notes[reason] = words
    for taint in spec.get("taints") or []:
        key, effect = str(taint.get("key", "")), taint.get("effect")
        if key.startswith(NVIDIA) and key != GPU_PRESENCE_TAINT and effect in FAULT_EFFECTS:
            reason = f"taint {key}:{effect}"
            reasons.append(reason)
            if taint.get("value"):
                notes[reason] = f"value {taint['value']}"
    capacity = {
        resource: quantity(value)
        for resource, value in (status.get("capacity") or {}).items()
        if resource.startswith(NVIDIA) and quantity(value) > 0
    }
    allocatable = status.get("allocatable") or {}
    gpus_out = {
        resource: count - quantity(allocatable.get(resource, 0))
        for resource, count in capacity.items()
        if count > quantity(allocatable.get(resource, 0))
    }
    return NodeHealth(meta["name"], tuple(reasons), notes, gpus_out, capacity)


def pod_unhealthy(pod: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """``(container, resource, resourceID, message)`` for each device the kubelet reports
    Unhealthy in the pod's ``allocatedResourcesStatus`` (containers and init containers;
    ``message`` is "" unless the plugin gave one, which only DRA drivers do today)."""
    status = pod.get("status") or {}
    found = []
    for group in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(group) or []:
            for allocated in container.get("allocatedResourcesStatus") or []:
                for device in allocated.get("resources") or []:
                    if device.get("health") == UNHEALTHY:
                        found.append(
                            (
                                container.get("name", ""),
                                allocated.get("name", ""),
                                device.get("resourceID", ""),
                                device.get("message") or "",
                            )
                        )
    return found


@dataclass
class _NodeState:
    """What the watcher saw last of one node, and the units it counted there."""

    reasons: set[str] = field(default_factory=set)
    #: resource -> capacity − allocatable at the last event
    out: Counter[str] = field(default_factory=Counter)
    #: resource -> units a drop counted that no pod has named yet
    unnamed: Counter[str] = field(default_factory=Counter)
    #: resource -> units pods named that no drop has shown yet
    ahead: Counter[str] = field(default_factory=Counter)
    #: resource -> devices pods named, whose units are counted
    named: dict[str, set[str]] = field(default_factory=dict)


class KubeHealthWatcher:
    """Makes a :class:`Fault` of each new finding in the node and pod events it is given
    (``on_event``, one of ClusterWatcher's ``on_event`` hooks) and calls ``report`` with it,
    in the same loop step. ``conditions``: the node condition types that mean a fault when
    True (``faults.node_conditions``)."""

    def __init__(self, report: Callable[[Fault], None], conditions: Iterable[str]):
        self.report = report
        self.conditions = frozenset(conditions)
        self._nodes: dict[str, _NodeState] = {}
        #: pod uid -> (node, resource, resourceID) it reports Unhealthy
        self._pods: dict[str, set[tuple[str, str, str]]] = {}

    def still_broken(self, device: str) -> str | None:
        """Why an admin may not return ``device`` (a book id) yet: its node still has a
        condition or taint that means its GPUs fail; None otherwise."""
        node = device.removeprefix("node:") if device.startswith("node:") else None
        if node is None:
            node = device.partition("/")[0]
        state = self._nodes.get(node)
        if state is None or not state.reasons:
            return None
        reasons = ", ".join(sorted(state.reasons))
        return f"node {node} still shows {reasons}; clear that on the node first"

    def on_event(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """A ``kind`` ("node" or "pod") was ADDED, MODIFIED or DELETED."""
        if kind == "node":
            self._on_node(event, obj)
        elif kind == "pod":
            self._on_pod(event, obj)

    def _on_node(self, event: str, node: Mapping[str, Any]) -> None:
        name = node["metadata"]["name"]
        health = node_faults(node, self.conditions)
        if event == "DELETED" or not health.has_gpus:
            self._nodes.pop(name, None)
            return
        state = self._nodes.setdefault(name, _NodeState())
        new = [r for r in health.reasons if r not in state.reasons]
        state.reasons = set(health.reasons)
        if new:
            detail = "; ".join(health.detail(r) for r in new)
            self._report(Fault(kind="node", detail=detail, source="node", node=name,
                               devices=(), detected_at=clock.utcnow()))  # fmt: skip
        for resource in sorted(set(health.gpus_out) | set(state.out)):
            out = health.gpus_out.get(resource, 0)
            rise = out - state.out[resource]
            state.out[resource] = out
            if rise <= 0:
                # back in allocatable (a plugin restart): a drop counted there is no longer
                # waiting for its pod
                state.unnamed[resource] = min(state.unnamed[resource], out)
                continue
            explained = min(rise, state.ahead[resource])
            state.ahead[resource] -= explained
            units = rise - explained
            if units <= 0:
                continue
            state.unnamed[resource] += units
            them = "it" if units == 1 else "them"
            self._report(Fault(
                kind="unhealthy",
                detail=f"{units} of {health.capacity[resource]} {resource} no longer "
                f"allocatable (the device plugin marked {them} unhealthy)",
                source="node", node=name, devices=(), detected_at=clock.utcnow(),
                resource=resource, units=units,
            ))  # fmt: skip

    def _on_pod(self, event: str, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        uid = meta.get("uid") or f"{meta.get('namespace', '')}/{meta['name']}"
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if event == "DELETED" or not node or phase in labels.TERMINAL_PHASES:
            # a finished pod holds no device and needs no recovery; a drop still counts
            self._pods.pop(uid, None)
            return
        found = {
            (node, resource, device): (container, message)
            for container, resource, device, message in pod_unhealthy(pod)
            if resource.startswith(NVIDIA)
        }
        seen = self._pods.pop(uid, set())
        if found:
            self._pods[uid] = set(found)
        for key in [k for k in found if k not in seen]:
            container, message = found[key]
            self._pod_device(uid, pod, key[1], key[2], container, message)

    def _pod_device(
        self,
        uid: str,
        pod: Mapping[str, Any],
        resource: str,
        device: str,
        container: str,
        message: str,
    ) -> None:
        meta = pod["metadata"]
        name = f"{meta.get('namespace', '')}/{meta['name']}"
        node = pod["spec"]["nodeName"]
        state = self._nodes.setdefault(node, _NodeState())
        named = state.named.setdefault(resource, set())
        # another live pod reporting the same device: its unit is accounted for already
        shared = any(
            (node, resource, device) in devices
            for other, devices in self._pods.items()
            if other != uid
        )
        units = 0
        if not shared:
            if state.unnamed[resource] > 0:
                state.unnamed[resource] -= 1  # the drop showed it first, and counted it
            else:
                state.ahead[resource] += 1  # its drop is still to come
                units = 0 if device in named else 1
            named.add(device)
        detail = f"{resource} {device} of pod {name} (container {container}) is Unhealthy"
        self._report(Fault(
            kind="unhealthy", detail=f"{detail}: {message}" if message else detail,
            source="pod", node=node, devices=(f"{node}/{device}",),
            detected_at=clock.utcnow(), resource=resource, units=units, pods=(name,),
        ))  # fmt: skip

    def _report(self, fault: Fault) -> None:
        log.warning("GPU fault on node %s: %s", fault.node, fault.detail)
        self.report(fault)
