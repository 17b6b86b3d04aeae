"""A node's health on its Node object: its Ready condition and the lifecycle taints that go
with it (``node_readiness``), and what GPU health agents write: the NVIDIA device plugin's
allocatable, node conditions (Node Problem Detector's custom plugins, e.g. AKS's
``GPUXIDErrors``), taints (the GPU operator, an admin's ``kubectl taint``). Pure: each
function mutates one node dict in place, as ``Store.update`` hands it (node_readiness returns
the condition and taints); SimulatedCluster's ``set_ready``, ``gpu_fault``,
``set_condition``, ``taint`` and their inverses apply them, so every change is a watch
MODIFIED event.

The shapes are the API's: a condition is ``{type, status, reason, message,
lastHeartbeatTime, lastTransitionTime}`` (the transition time kept while the status stays),
a taint ``{key, value?, effect, timeAdded?}`` (``timeAdded`` only on NoExecute, as kubectl
and the node lifecycle controller write it).
"""

from __future__ import annotations

from datetime import UTC, datetime

from .store import Obj

CONDITION_STATUSES = ("True", "False", "Unknown")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def change_allocatable(node: Obj, resource: str, delta: int) -> None:
    """The device plugin advertising ``delta`` more (or fewer) healthy devices of
    ``resource``: allocatable moves within [0, capacity]; capacity stays (the kubelet keeps
    counting an unhealthy device in capacity)."""
    status = node["status"]
    capacity = int((status.get("capacity") or {}).get(resource, 0))
    allocatable = status.setdefault("allocatable", {})
    now = int(allocatable.get(resource, 0))
    allocatable[resource] = str(max(0, min(capacity, now + delta)))


def set_condition(node: Obj, type_: str, status: str, reason: str = "", message: str = "") -> None:
    """Set the node condition ``type_`` as a health agent posts it."""
    if status not in CONDITION_STATUSES:
        raise ValueError(f"status must be one of {', '.join(CONDITION_STATUSES)}, not {status!r}")
    now = _now()
    conditions = node["status"].setdefault("conditions", [])
    current = next((c for c in conditions if c["type"] == type_), None)
    if current is None:
        current = {"type": type_, "lastTransitionTime": now}
        conditions.append(current)
    elif current.get("status") != status:
        current["lastTransitionTime"] = now
    current.update(status=status, reason=reason, message=message, lastHeartbeatTime=now)


def clear_condition(node: Obj, type_: str) -> None:
    """Remove the condition ``type_`` (its agent was removed, or an admin patched it away)."""
    conditions = node["status"].get("conditions") or []
    node["status"]["conditions"] = [c for c in conditions if c["type"] != type_]


def taint(node: Obj, key: str, effect: str, value: str | None = None) -> None:
    """Add the taint ``key[=value]:effect``, replacing one of the same key and effect."""
    if effect not in TAINT_EFFECTS:
        raise ValueError(f"effect must be one of {', '.join(TAINT_EFFECTS)}, not {effect!r}")
    entry: dict[str, str] = {"key": key, "effect": effect}
    if value is not None:
        entry["value"] = value
    if effect == "NoExecute":
        entry["timeAdded"] = _now()
    spec = node.setdefault("spec", {})
    kept = [t for t in spec.get("taints") or [] if (t["key"], t["effect"]) != (key, effect)]
    spec["taints"] = [*kept, entry]


def untaint(node: Obj, key: str, effect: str | None = None) -> None:
    """Remove the taints of ``key`` (of that ``effect`` only, when given), as
    ``kubectl taint nodes NODE key[:effect]-``."""
    spec = node.setdefault("spec", {})
    kept = [
        t
        for t in spec.get("taints") or []
        if t["key"] != key or (effect is not None and t["effect"] != effect)
    ]
    if kept:
        spec["taints"] = kept
    else:
        spec.pop("taints", None)


def node_readiness(ready: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The Ready condition and the taints of a node whose Ready status is ``ready``.

    A kubelet that reports NotReady gives "False"; one that stopped posting its status is
    marked "Unknown" by the node lifecycle controller. The controller then taints the node
    ``node.kubernetes.io/not-ready`` or ``node.kubernetes.io/unreachable``, NoSchedule (so
    the scheduler's TaintToleration filter keeps new pods off it) and NoExecute (evicting
    pods that do not tolerate it; the API server's DefaultTolerationSeconds admission
    gives every pod 300 s). Kubernetes pkg/controller/nodelifecycle, "Taint Nodes by
    Condition" and "Taint based Evictions"."""
    conditions = {
        "True": ("KubeletReady", "kubelet is posting ready status", None),
        "False": ("KubeletNotReady", "container runtime is down", NOT_READY_TAINT),
        "Unknown": ("NodeStatusUnknown", "Kubelet stopped posting node status.", UNREACHABLE_TAINT),
    }
    if ready not in conditions:
        raise ValueError(f"ready must be True, False or Unknown, not {ready!r}")
    reason, message, taint = conditions[ready]
    condition = {"type": "Ready", "status": ready, "reason": reason, "message": message}
    if taint is None:
        return condition, []
    added = _now()
    return condition, [
        {"key": taint, "effect": "NoSchedule", "timeAdded": added},
        {"key": taint, "effect": "NoExecute", "timeAdded": added},
    ]
