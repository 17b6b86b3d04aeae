"""ScaleOutMixin: a server's worker group as part of its spawner (docs/scale-out.md).

The group lives on the spawner (``workers``), is saved in its state beside the server's record
(``gputap_workers``) and picked up again after a hub restart at the first poll, and stops
before the server does. Backends provide ``worker_backend()``, a
:class:`~.workers.WorkerBackend`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import inspect
from traitlets import Integer
from traitlets.config import LoggingConfigurable

from ..core.placement import parse_request
from .workers import WorkerGroup

STATE_KEY = "gputap_workers"


class ScaleOutMixin(LoggingConfigurable):
    """The worker-group part of :class:`~.mixin.GPUSpawnerMixin`."""

    max_workers = Integer(
        8,
        config=True,
        help="""Most workers one server's group may have (scale_out.max_workers); 0: no
        scale-out.

        c.GPUSpawnerMixin.max_workers = 16
        """,
    )

    worker_idle_seconds = Integer(
        600,
        config=True,
        help="""A group on which no job ran for this long is stopped, billing with it
        (scale_out.idle_seconds); 0: never.

        c.GPUSpawnerMixin.worker_idle_seconds = 900
        """,
    )

    _group: WorkerGroup | None = None
    #: the group as saved, until the first poll after a hub restart picks it up
    _saved_group: dict[str, Any] | None = None

    @property
    def workers(self) -> WorkerGroup:
        if self._group is None:
            self._group = WorkerGroup(self, self.user.name)
        return self._group

    def save_state_now(self) -> None:
        """Write the spawner's state (the group's with it) to the hub's database now: a
        worker started or ended between the hub's own saves is not forgotten by a restart."""
        orm = getattr(self, "orm_spawner", None)
        if orm is None:
            return
        orm.state = self.get_state()
        session = inspect(orm).session
        if session is not None:
            session.commit()

    def group_state(self, state: dict[str, Any]) -> None:
        """Add the group to the state the spawner saves."""
        saved = self._group.to_state() if self._group is not None else self._saved_group
        if saved:
            state[STATE_KEY] = saved

    def load_group_state(self, state: dict[str, Any]) -> None:
        self._saved_group = state.get(STATE_KEY) or None

    def resume_group(self) -> None:
        """The saved group, watched again (called from the first poll after a restart)."""
        saved, self._saved_group = self._saved_group, None
        if saved:
            self.workers.load_state(saved, lambda options: parse_request(options, self.catalog))

    async def stop_group(self, reason: str) -> None:
        """Stop every worker before the server goes (their sessions end at this moment)."""
        if self._group is not None and self._group.active:
            await self._group.stop(reason)
