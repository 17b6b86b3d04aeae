"""The server record: what one start of a server was placed on and how it is billed.

The spawner makes one :class:`ServerRecord` per start, once placement has chosen; the backend
fills in what it took (device UUIDs on one machine, the node on Kubernetes), billing's
admission its hold, the start its ``started_at`` and ``time_to_ready``. The record is saved in
the hub's spawner state (:meth:`to_state`), so a hub restart knows what a running server holds
and which billing session to close. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .time_to_ready import TimeToReady

PRICE_CLASSES = ("on-demand", "spot")


@dataclass
class ServerRecord:
    """One start of one server. Mutable in three places only: ``hold_id`` is dropped once the
    hold has become the billing session (or was released), ``started_at`` is set when
    metering may have begun, ``time_to_ready`` when the server answered."""

    #: the billing session's id, one per start (also the id of admission's hold)
    session_id: str
    #: what was placed: an offering key ("A100-80GB", "A100-80GB/1g.10gb", "cpu")
    offering: str
    #: GPUs (or slices) of that offering
    count: int
    #: the course paying for it ("" when the user's own credit pays)
    course: str = ""
    #: the environment the server runs ("" for the backend's default)
    environment: str = ""
    #: "on-demand", or "spot" (interruptible, Kubernetes only)
    price_class: str = "on-demand"
    #: a worker of the server's group ("w1", "w2", …), "" for the server itself
    worker: str = ""
    #: one machine: the UUIDs of its GPUs or MIG devices (CUDA_VISIBLE_DEVICES)
    devices: tuple[str, ...] = field(default_factory=tuple)
    #: one machine: whether those devices are simulated cards
    simulated: bool = False
    #: Kubernetes: the node its GPUs were reserved on (None for CPU only)
    node: str | None = None
    #: admission's hold while it has not become the billing session
    hold_id: str | None = None
    #: when metering may have begun (billing's session start)
    started_at: datetime | None = None
    #: how long the start took, once the server answered
    time_to_ready: TimeToReady | None = None

    def __post_init__(self) -> None:
        if not self.session_id:
            raise ValueError("session_id: every server start names its billing session")
        if self.count < 1:
            raise ValueError(f"count must be at least 1, not {self.count}")
        if self.price_class not in PRICE_CLASSES:
            raise ValueError(f"price_class must be on-demand or spot, not {self.price_class!r}")
        self.devices = tuple(self.devices)

    def to_state(self) -> dict[str, Any]:
        """The record as the hub's spawner state keeps it (JSON)."""
        state: dict[str, Any] = {
            "session_id": self.session_id,
            "offering": self.offering,
            "count": self.count,
            "course": self.course,
            "price_class": self.price_class,
        }
        if self.environment:
            state["environment"] = self.environment
        if self.worker:
            state["worker"] = self.worker
        if self.devices or self.simulated:
            state["devices"] = list(self.devices)
            state["simulated"] = self.simulated
        if self.node is not None:
            state["node"] = self.node
        if self.hold_id is not None:
            state["hold_id"] = self.hold_id
        if self.started_at is not None:
            state["started_at"] = self.started_at.isoformat()
        if self.time_to_ready is not None:
            state["time_to_ready"] = {
                "seconds": self.time_to_ready.seconds,
                "queued_seconds": self.time_to_ready.queued_seconds,
            }
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ServerRecord:
        """A record saved by :meth:`to_state`, or by gputap before the record was typed
        (the same keys; ``devices`` absent on Kubernetes, ``price_class`` on one machine)."""
        started = state.get("started_at")
        ready = state.get("time_to_ready")
        return cls(
            session_id=str(state["session_id"]),
            offering=str(state["offering"]),
            count=int(state["count"]),
            course=str(state.get("course") or ""),
            environment=str(state.get("environment") or ""),
            price_class=str(state.get("price_class") or "on-demand"),
            worker=str(state.get("worker") or ""),
            devices=tuple(state.get("devices") or ()),
            simulated=bool(state.get("simulated", False)),
            node=state.get("node"),
            hold_id=state.get("hold_id"),
            started_at=datetime.fromisoformat(started) if started else None,
            time_to_ready=TimeToReady(
                float(ready["seconds"]), float(ready.get("queued_seconds") or 0)
            )
            if ready
            else None,
        )
