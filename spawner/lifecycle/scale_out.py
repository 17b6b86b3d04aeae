"""A server's scale-out: its worker group as a collaborator of its spawner (docs/scale-out.md).

The group (:class:`~.workers.WorkerGroup`) is made on first use, saved in the spawner's state
beside the server's record (``gputap_workers``), picked up again after a hub restart at the
first poll, and stopped before the server is. The spawner is the group's owner
(:class:`~.workers.GroupOwner`): its machine, billing, catalog and backend for workers.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import inspect

from ..core.placement import parse_request
from .workers import GroupOwner, WorkerGroup

STATE_KEY = "gputap_workers"


class ScaleOut:
    """The worker group of ``owner``'s server (``user``'s), and its saved state."""

    def __init__(self, owner: GroupOwner, user: str):
        self.owner = owner
        self.user = user
        self._group: WorkerGroup | None = None
        #: the group as saved, until the first poll after a hub restart picks it up
        self._saved: dict[str, Any] | None = None

    @property
    def group(self) -> WorkerGroup:
        if self._group is None:
            self._group = WorkerGroup(self.owner, self.user)
            if self._saved:
                self._group.keep_ended(self._saved)
        return self._group

    def to_state(self, state: dict[str, Any]) -> None:
        """Add the group to the state the spawner saves."""
        saved = self._group.to_state() if self._group is not None else self._saved
        if saved:
            state[STATE_KEY] = saved

    def load_state(self, state: dict[str, Any]) -> None:
        self._saved = state.get(STATE_KEY) or None

    def resume(self) -> None:
        """The saved group, watched again (called from the first poll after a restart)."""
        saved, self._saved = self._saved, None
        if saved:
            catalog = self.owner.catalog
            self.group.load_state(saved, lambda options: parse_request(options, catalog))

    async def stop(self, reason: str) -> None:
        """Stop every worker before the server goes (their sessions end at this moment)."""
        if self._group is not None and self._group.active:
            await self._group.stop(reason)


def save_spawner_state(spawner: Any) -> None:
    """Write ``spawner``'s state (its group's with it) to the hub's database now: a worker
    started or ended between the hub's own saves is not forgotten by a restart."""
    orm = getattr(spawner, "orm_spawner", None)
    if orm is None:
        return
    orm.state = spawner.get_state()
    session = inspect(orm).session
    if session is not None:
        session.commit()
