"""StopReasons: why a spawner's server stops, kept and told (spawner/lifecycle/stops.py), and
what a GPU fault changes about the next stop (docs/gpu-faults.md): a part of
:class:`~.mixin.GPUSpawnerMixin`."""

from __future__ import annotations

from datetime import datetime

from traitlets import Unicode
from traitlets.config import LoggingConfigurable

from . import faults, stops


class StopReasons(LoggingConfigurable):
    """Why the server stopped (``stop_reason``, the hub's ``notice``), and the fault desk's
    link to the hub."""

    #: why the next stop happens, when whoever asks for it said (gputap's stop endpoint)
    _next_stop: stops.Pending | None = None
    #: where the next stop's billing ends, when earlier than the stop (a GPU fault)
    _billed_until: datetime | None = None

    fault_restart = Unicode(
        "same",
        config=True,
        help="""After a GPU fault (faults.restart; docs/gpu-faults.md): "same" starts the
        server again on the same request, "allowed" also offers users the choice of a
        similar free GPU in advance (the spawn form's on_fault), "off" does not restart.

        c.GPUSpawnerMixin.fault_restart = "allowed"
        """,
    )

    def _tell_desk(self) -> None:
        """The fault desk posts its recoveries to the hub's API, which spawners know."""
        desk = faults.desk()
        if desk is not None and self.hub is not None and self.hub.api_url:
            desk.api_url = self.hub.api_url

    def stop_next_because(
        self, reason: stops.Pending | None, billed_until: datetime | None = None
    ) -> None:
        """Record why the stop about to be asked happens (gputap's stop endpoint, a change);
        ``billed_until``: the session ends there, not when the stop is asked (a GPU fault:
        nothing is billed on a broken GPU)."""
        self._next_stop = reason
        self._billed_until = billed_until

    def set_stop_reason(self, reason: stops.StopReason | None) -> None:
        """Keep why the server stopped (None: forget it) and the notice the hub shows."""
        self.stop_reason = reason
        self.notice = reason.notice if reason else ""

    async def _tell_why(
        self, reason: stops.StopReason, wait_seconds: float = stops.ANNOUNCE_TIMEOUT_SECONDS
    ) -> None:
        """Keep the reason, and tell the running server before it goes (best effort, at
        most ``wait_seconds``)."""
        self.set_stop_reason(reason)
        self.log.info("%s: stopping (%s): %s", self.who, reason.kind, reason.message)
        server = getattr(self, "server", None)
        if server is not None and self.api_token:
            await stops.announce(server.url, self.api_token, reason, self.log, wait_seconds)
