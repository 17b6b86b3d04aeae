"""GPU health, pure: what counts as a fault, and the book of each device's state and faults.

A :class:`Fault` is one finding that devices (GPUs, MIG devices) or a whole node are broken;
watchers make them (spawner/local/health.py, spawner/kube/health.py) and the fault desk
(spawner/lifecycle/faults.py) acts on them. The :class:`HealthBook` keeps each device's state
(healthy, faulty, drained) and the fault history; it is saved as JSON by the desk
(docs/gpu-faults.md).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gputap_common.names import user_of

#: XIDs of the user's own program failing, not the GPU (graphics engine exception, GPU page
#: fault, GPU stopped processing, preemptive cleanup, video processor exception, context
#: switch timeout): logged and ignored, as the NVIDIA device plugin does
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

#: what some XIDs mean, for the messages users and admins read
XID_NAMES = {
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping",
    64: "ECC page retirement or row remapper failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}

HEALTHY, FAULTY, DRAINED = "healthy", "faulty", "drained"


def new_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass(frozen=True)
class Fault:
    """One finding: ``devices`` (their ids: UUIDs on one machine, ``<node>/<resourceID>`` on
    Kubernetes; empty for a whole node) are broken, as ``detail`` says, seen by ``source``
    (nvml, simulated, node, pod, lab) at ``detected_at``, the second the hub learned it."""

    kind: str
    detail: str
    source: str
    node: str
    devices: tuple[str, ...]
    detected_at: datetime
    #: the physical GPU (one machine: its UUID), when one is named
    gpu: str | None = None
    #: Kubernetes: the extended resource (``nvidia.com/gpu``) and how many units it lost
    resource: str | None = None
    units: int = 0
    #: Kubernetes: pods named as affected ("namespace/name")
    pods: tuple[str, ...] = ()
    id: str = field(default_factory=new_id)

    @property
    def whole_node(self) -> bool:
        return not self.devices and not self.resource

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "detail": self.detail,
            "source": self.source,
            "node": self.node,
            "devices": list(self.devices),
            "gpu": self.gpu,
            "resource": self.resource,
            "units": self.units,
            "pods": list(self.pods),
            "detected_at": self.detected_at.isoformat(),
        }

    @classmethod
    def from_view(cls, data: dict[str, Any]) -> Fault:
        return cls(
            kind=data["kind"],
            detail=data["detail"],
            source=data["source"],
            node=data["node"],
            devices=tuple(data.get("devices") or ()),
            detected_at=datetime.fromisoformat(data["detected_at"]),
            gpu=data.get("gpu"),
            resource=data.get("resource"),
            units=int(data.get("units") or 0),
            pods=tuple(data.get("pods") or ()),
            id=data["id"],
        )


def xid_detail(xid: int) -> str:
    name = XID_NAMES.get(xid)
    return f"XID {xid} ({name})" if name else f"XID {xid}"


def is_critical_xid(xid: int, ignored: frozenset[int] | set[int] = frozenset()) -> bool:
    """False for the application XIDs and those the operator ignores (``faults.ignore_xids``)."""
    return xid not in APPLICATION_XIDS and xid not in ignored


@dataclass
class DeviceHealth:
    """One device's or node's state in the book."""

    state: str
    since: datetime
    fault: str | None = None  # the fault's id
    note: str = ""

    def view(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "since": self.since.isoformat(),
            "fault": self.fault,
            "note": self.note,
        }


class BookError(ValueError):
    """A drain or return that cannot be done; the message says why and what to do."""


class HealthBook:
    """Each device's (or ``node:<name>``'s) state and the fault history, newest last.

    Devices not in the book are healthy. Only :meth:`give_back` makes a faulty or drained
    device healthy again: a fault never clears by itself."""

    def __init__(self, history: int = 1000):
        self.history = history
        self.devices: dict[str, DeviceHealth] = {}
        self.faults: list[Fault] = []
        #: fault id -> the servers it hit and what became of each
        self.outcomes: dict[str, list[dict[str, Any]]] = {}

    def state(self, device: str) -> str:
        entry = self.devices.get(device)
        return entry.state if entry else HEALTHY

    def out(self) -> dict[str, str]:
        """Devices out of the pool: id -> state (faulty or drained)."""
        return {d: e.state for d, e in self.devices.items() if e.state != HEALTHY}

    def fault(self, fault: Fault) -> list[str]:
        """Record ``fault``; returns the ids newly out (a device already faulty stays with
        its first fault; a drained one becomes faulty)."""
        self.faults.append(fault)
        self.outcomes.setdefault(fault.id, [])
        ids = list(fault.devices) or [self.id_of(fault)]
        newly = []
        for device in ids:
            entry = self.devices.get(device)
            if entry is not None and entry.state == FAULTY:
                continue
            self.devices[device] = DeviceHealth(FAULTY, fault.detected_at, fault.id)
            newly.append(device)
        self._trim()
        return newly

    def _trim(self) -> None:
        """Keep the newest ``history`` faults, and every fault a device is still out for
        (its entry's units and the admin's return need it)."""
        excess = len(self.faults) - self.history
        if excess <= 0:
            return
        held = {entry.fault for entry in self.devices.values()}
        kept = []
        for fault in self.faults:
            if excess > 0 and fault.id not in held:
                excess -= 1
                continue
            kept.append(fault)
        self.faults = kept

    @staticmethod
    def id_of(fault: Fault) -> str:
        """The book's id for a fault that names no device: the node (``node:<name>``), or
        the units of a resource a node lost (``<node>/<resource>@<fault id>``)."""
        if fault.resource:
            return f"{fault.node}/{fault.resource}@{fault.id}"
        return f"node:{fault.node}"

    def drain(self, device: str, at: datetime, note: str = "") -> DeviceHealth:
        entry = self.devices.get(device)
        if entry is not None and entry.state == FAULTY:
            raise BookError(f"{device} is already out of service for a fault; return it instead")
        self.devices[device] = DeviceHealth(DRAINED, at, None, note)
        return self.devices[device]

    def give_back(self, device: str) -> DeviceHealth | None:
        """Return a device to service; the entry it had (None: it was healthy)."""
        return self.devices.pop(device, None)

    def find(self, fault_id: str) -> Fault | None:
        return next((f for f in self.faults if f.id == fault_id), None)

    def note_outcome(self, fault_id: str, server: str, **facts: Any) -> None:
        """Record (or update) what became of ``server`` ("user/name") after ``fault_id``."""
        entries = self.outcomes.setdefault(fault_id, [])
        for entry in entries:
            if entry["server"] == server:
                entry.update(facts)
                return
        entries.append({"server": server, **facts})

    def restarts_within(self, server: str, window: timedelta, now: datetime) -> int:
        """Restarts after faults of ``server`` within ``window`` before ``now``."""
        count = 0
        for fault in self.faults:
            if now - fault.detected_at > window:
                continue
            for entry in self.outcomes.get(fault.id, []):
                if entry["server"] == server and entry.get("restarted"):
                    count += 1
        return count

    def reports_by(self, user: str, now: datetime, window: timedelta) -> int:
        """The devices ``user``'s servers reported failing themselves (Lab's report, noted
        ``reported``) within ``window`` before ``now``."""
        count = 0
        for fault in self.faults:
            if fault.source != "lab" or now - fault.detected_at >= window:
                continue
            for entry in self.outcomes.get(fault.id, []):
                if entry.get("reported") and user_of(entry["server"]) == user:
                    count += 1
                    break
        return count

    def to_json(self) -> dict[str, Any]:
        kept = {f.id for f in self.faults}
        return {
            "version": 1,
            "devices": {d: e.view() for d, e in self.devices.items()},
            "faults": [f.view() for f in self.faults],
            "outcomes": {k: v for k, v in self.outcomes.items() if k in kept},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], history: int = 1000) -> HealthBook:
        book = cls(history)
        if data.get("version") != 1:
            raise ValueError(f"unknown GPU health file version {data.get('version')!r}")
        for device, entry in (data.get("devices") or {}).items():
            book.devices[device] = DeviceHealth(
                entry["state"],
                datetime.fromisoformat(entry["since"]),
                entry.get("fault"),
                entry.get("note") or "",
            )
        book.faults = [Fault.from_view(f) for f in data.get("faults") or []]
        book.outcomes = {k: list(v) for k, v in (data.get("outcomes") or {}).items()}
        return book
