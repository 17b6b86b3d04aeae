"""A server's stop book: why it stopped (spawner/lifecycle/stops.py), kept across hub restarts
in the spawner's state and told to the running server before it goes, and what the next stop
is for (a change, an admin, a GPU fault, which also ends billing at its detection second).

:class:`StopBook` is a collaborator of :class:`~.mixin.GPUSpawnerMixin`: the stop endpoint, a
change and a recovery write the next stop's reason into it; the mixin's ``stop`` and ``poll``
read it.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from . import stops


class StopBook:
    """Why ``who``'s server stopped last (``reason``, shown as ``notice``), and why and until
    when its next stop is billed."""

    def __init__(self, who: str, log: logging.Logger | logging.LoggerAdapter):
        self.who = who
        self.log = log
        self.reason: stops.StopReason | None = None
        #: why the next stop happens, when whoever asks for it said (gputap's stop endpoint)
        self.next: stops.Pending | None = None
        #: where the next stop's billing ends, when earlier than the stop (a GPU fault)
        self.billed_until: datetime | None = None
        #: a notice saved without its reason (a state written before reasons were kept)
        self._notice = ""

    @property
    def notice(self) -> str:
        """Why the last server stopped, with what to do (hub home, spawn form; docs/lab.md)."""
        return self.reason.notice if self.reason else self._notice

    def next_because(
        self, reason: stops.Pending | None, billed_until: datetime | None = None
    ) -> None:
        """Record why the stop about to be asked happens (gputap's stop endpoint, a change);
        ``billed_until``: the session ends there, not when the stop is asked (a GPU fault:
        nothing is billed on a broken GPU)."""
        self.next = reason
        self.billed_until = billed_until

    def take_next(self) -> tuple[stops.Pending, datetime | None]:
        """The next stop's reason (the hub's own when nobody said) and billing's end, once."""
        reason, billed_until = self.next or stops.from_hub, self.billed_until
        self.next = self.billed_until = None
        return reason, billed_until

    def set(self, reason: stops.StopReason | None) -> None:
        """Keep why the server stopped (None: forget it)."""
        self.reason, self._notice = reason, ""

    async def tell(
        self,
        reason: stops.StopReason,
        server: Any,
        token: str,
        wait_seconds: float = stops.ANNOUNCE_TIMEOUT_SECONDS,
    ) -> None:
        """Keep the reason, and tell the running ``server`` before it goes (best effort, at
        most ``wait_seconds``)."""
        self.set(reason)
        self.log.info("%s: stopping (%s): %s", self.who, reason.kind, reason.message)
        if server is not None and token:
            await stops.announce(server.url, token, reason, self.log, wait_seconds)

    def to_state(self, state: dict[str, Any]) -> None:
        if self.notice:
            state["gputap_notice"] = self.notice
        if self.reason is not None:
            state["gputap_stop"] = self.reason.view()

    def load_state(self, state: dict[str, Any]) -> None:
        saved = state.get("gputap_stop")
        self.reason = stops.StopReason.from_view(saved) if saved else None
        self._notice = state.get("gputap_notice", "")
