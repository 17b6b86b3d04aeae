"""What the shared lifecycle knows of a backend's devices: typed interfaces, no backend code.

A backend's *machine* (spawner/local/machine.py: this host's device pool; spawner/kube/machine.py:
the cluster watch and its reservations) is one object per hub that every start, worker and the
fault desk share; a spawner holds no device state of its own. The start pipeline
(:mod:`.starting`) takes and gives back devices through :class:`Machine`; the fault desk
(:mod:`.faults`) isolates devices through :class:`LocalDevices` and :class:`ClusterDevices`,
and stops the watchers it was given through :class:`HealthWatch`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, Protocol

from ..core.placement import FreeView, Placement
from ..core.record import ServerRecord


class Machine(Protocol):
    """Where starts take their devices: by holder ("user/server", or "user/server#wK" for a
    worker), synchronously, so that no other start decides between a placement and its take."""

    def take(self, placement: Placement, record: ServerRecord, holder: str) -> None:
        """Take what ``placement`` chose for ``holder``; note it on ``record``."""

    def release(self, record: ServerRecord, holder: str) -> None:
        """Give back what ``holder`` took for ``record``."""

    def claim(self, record: ServerRecord, holder: str) -> None:
        """A server or worker found running after a hub restart holds its devices again."""

    def queue_view(self) -> FreeView:
        """What spawns waiting in the queue may take now."""


class LocalDevices(Protocol):
    """One machine's device pool as the fault desk keeps it in step with the health book
    (spawner/local/inventory.py: DevicePool)."""

    node: str
    simulated: bool
    devices: Mapping[str, Any]
    out: Mapping[str, str]
    holder: Mapping[str, str]

    def set_out(self, uuids: Iterable[str], why: str) -> None: ...

    def set_in(self, uuids: Iterable[str]) -> None: ...

    def free_view(self, as_free: str | None = None) -> FreeView: ...


class ClusterInventoryView(Protocol):
    """The cluster's GPUs as the fault desk holds them out (spawner/kube/inventory.py)."""

    nodes: Mapping[str, Any]
    held_out: Mapping[str, Mapping[str, int]]
    closed: set[str]

    @property
    def preemptible_view(self) -> FreeView: ...

    def hold_out(self, node: str, resource: str, units: int) -> None: ...

    def give_back(self, node: str, resource: str, units: int | None = None) -> None: ...

    def close(self, node: str) -> None: ...

    def reopen(self, node: str) -> None: ...

    def resource_of(self, node: str, key: str) -> str: ...


class ClusterDevices(Protocol):
    """The hub's view of the cluster as the fault desk reads it (spawner/kube/watch.py)."""

    @property
    def inventory(self) -> ClusterInventoryView: ...

    @property
    def pods(self) -> list[Mapping[str, Any]]: ...


class HealthWatch(Protocol):
    """A watcher of GPU health the desk was given (spawner/local/health.py: async, with
    ``forget`` and ``stop``; spawner/kube/health.py: fed the cluster watcher's events)."""

    def still_broken(self, device: str) -> str | None | Awaitable[str | None]:
        """Why an admin may not return ``device`` yet (its cause still shows), or None."""


class ReportingServer(Protocol):
    """A Kubernetes server reporting its own failing GPU (the fault desk's server_report)."""

    record: ServerRecord | None
    pod_key: str

    def node_of_pod(self) -> str | None: ...
