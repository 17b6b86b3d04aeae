"""Worker groups, pure: what a running server asks for when it scales out, and how a group is
shown (docs/scale-out.md).

A server's group is N workers, each placed like a spawn of the same request: the server's own
offering by default (``gpus`` whole GPUs each for a card, one slice or share each otherwise),
or ``options`` naming another card, a slice or a spec, as a spawn's options do. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from gputap_common.bodies import shown

from .catalog import Catalog, Offering
from .placement import (
    CardRequest,
    CpuRequest,
    Placement,
    Request,
    RequestError,
    SpecRequest,
    parse_request,
    request_for,
)
from .record import ServerRecord

#: the fields of ``POST {server}/workers``
REQUEST_FIELDS = ("count", "gpus", "options", "queue")

PLACING, WAITING, STARTING, READY = "placing", "waiting", "starting", "ready"
FAILED, STOPPING, STOPPED = "failed", "stopping", "stopped"
#: states in which a worker is part of the group (the hub has it; billing counts it present)
ACTIVE = frozenset({PLACING, WAITING, STARTING, READY, STOPPING})
#: states whose worker holds (or is about to hold) devices and a billing session
LIVE = frozenset({STARTING, READY})


@dataclass(frozen=True)
class WorkerRequest:
    """A valid ``POST {server}/workers``: ``count`` workers, each placed by ``request``."""

    count: int
    request: Request
    queue: bool = False


def _whole(value: Any, key: str, lowest: int, highest: int, meaning: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{key} must be a whole number ({meaning}), not {shown(value)}")
    if not lowest <= value <= highest:
        raise RequestError(f"{key} must be {lowest} to {highest} ({meaning}), not {value}")
    return value


def parse_worker_request(
    body: Mapping[str, Any],
    server_offering: Offering,
    server_count: int,
    catalog: Catalog,
    max_workers: int,
) -> WorkerRequest:
    """``body`` as a WorkerRequest, or RequestError saying what is wrong and what is allowed.

    Without ``options`` each worker gets what the server has: ``gpus`` of its card (default:
    as many as the server), or one of its slice or share. ``options`` (a spawn's options)
    asks for something else; its ``count`` and ``gpus`` must then agree."""
    if "count" not in body:
        raise RequestError(f"count is missing: how many workers (1 to {max_workers})")
    count = _whole(body["count"], "count", 1, max_workers, "workers in the group")
    queue = body.get("queue", False)
    if not isinstance(queue, bool):
        raise RequestError(f"queue must be true or false, not {shown(queue)}")
    gpus = body.get("gpus")
    if gpus is not None:
        gpus = _whole(gpus, "gpus", 1, 64, "GPUs per worker")
    options = body.get("options")
    if options is not None:
        if not isinstance(options, Mapping) or not options:
            raise RequestError('options must be a spawn\'s options, such as {"kind": "card", …}')
        request = parse_request(options, catalog)
        units = getattr(request, "count", 1)
        if gpus is not None and gpus != units:
            raise RequestError(f"gpus ({gpus}) and the options' count ({units}) disagree")
        return WorkerRequest(count, request, queue)
    request = request_for(server_offering, server_count)
    if isinstance(request, CardRequest):
        request = replace(request, count=gpus or server_count)
    elif gpus not in (None, 1):
        what = server_offering.label
        raise RequestError(
            f"a worker of {what} has one of it; for {gpus} GPUs per worker send options "
            'for whole cards, such as {"kind": "card", "card": "A100-80GB", "count": '
            f"{gpus}}}"
        )
    return WorkerRequest(count, request, queue)


def request_view(request: Request) -> dict[str, Any]:
    """What a worker asks for, as the group view shows it."""
    if isinstance(request, CpuRequest):
        return {"kind": "cpu"}
    if isinstance(request, SpecRequest):
        return {
            "kind": "spec",
            "min_memory_gb": request.min_memory_gb,
            "min_tflops": request.min_tflops,
            "count": request.count,
        }
    view: dict[str, Any] = {"card": request.card}
    if isinstance(request, CardRequest):
        view.update(kind="card", count=request.count)
    elif hasattr(request, "profile"):
        view.update(kind="slice", mig_profile=request.profile)
    else:
        view.update(kind="shared")
    return view


@dataclass
class Worker:
    """One worker of a group, as the hub keeps it (and saves it in the spawner's state)."""

    index: int
    state: str = PLACING
    reason: str = ""
    record: ServerRecord | None = None
    label: str = ""
    host: str = ""
    port: int = 0
    #: what the backend needs to find it again (a pid, a pod's name)
    handle: dict[str, Any] = field(default_factory=dict)
    started_at: datetime | None = None
    ended_at: datetime | None = None
    #: when its stop was asked (billing ends there)
    stop_asked: datetime | None = None
    #: what its agent said last
    busy: bool = False
    idle_since: datetime | None = None
    gpus: list[dict[str, Any]] | None = None
    gpu_note: str = ""
    seen_at: datetime | None = None
    #: where it was placed (this hub's memory only: a re-attached worker runs already)
    placement: Placement | None = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        return worker_name(self.index)

    def set(self, state: str, reason: str = "") -> None:
        self.state, self.reason = state, reason

    def view(self) -> dict[str, Any]:
        record = self.record
        return {
            "name": self.name,
            "state": self.state,
            "reason": self.reason,
            "offering": record.offering if record else None,
            "label": self.label,
            "count": record.count if record else None,
            "price_per_hour_micro": self.handle.get("price_per_hour_micro"),
            "host": self.host,
            "port": self.port,
            "session_id": record.session_id if record and record.started_at else None,
            "started_at": _iso(self.started_at),
            "ended_at": _iso(self.ended_at),
            "busy": self.busy,
            "gpus": self.gpus,
            "gpu_note": self.gpu_note,
        }

    def to_state(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "state": self.state,
            "reason": self.reason,
            "record": self.record.to_state() if self.record else None,
            "label": self.label,
            "host": self.host,
            "port": self.port,
            "handle": self.handle,
            "started_at": _iso(self.started_at),
            "seen_at": _iso(self.seen_at),
        }

    @classmethod
    def from_state(cls, data: dict[str, Any]) -> Worker:
        record = data.get("record")
        return cls(
            index=int(data["index"]),
            state=str(data["state"]),
            reason=str(data.get("reason") or ""),
            record=ServerRecord.from_state(record) if record else None,
            label=str(data.get("label") or ""),
            host=str(data.get("host") or ""),
            port=int(data.get("port") or 0),
            handle=dict(data.get("handle") or {}),
            started_at=parse_time(data.get("started_at")),
            seen_at=parse_time(data.get("seen_at")),
        )


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


def parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def worker_name(index: int) -> str:
    """``w1``, ``w2``, …: a worker's name in its group, in billing and in labels."""
    return f"w{index}"


def worker_holder(server: str, worker: str) -> str:
    """``user/server#wK``: the name a worker holds its devices under (the fault desk finds
    the server and the worker in it)."""
    return f"{server}#{worker}"
