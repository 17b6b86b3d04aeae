"""What GPU health agents write on a Node object: the NVIDIA device plugin's allocatable,
node conditions (Node Problem Detector's custom plugins, e.g. AKS's ``GPUXIDErrors``), taints
(the GPU operator, an admin's ``kubectl taint``). Pure: each function mutates one node dict
in place, as ``Store.update`` hands it; SimulatedCluster's ``gpu_fault``, ``set_condition``,
``taint`` and their inverses apply them, so every change is a watch MODIFIED event.

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
