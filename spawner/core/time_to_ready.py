"""How long a start took: from the hub's start of a server to the server's first answer, with
the part of it spent waiting in the queue for a GPU, in the one sentence the spawn page, the
hub's home page and Lab show (docs/instant-start.md, "Time to ready"). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: a queue wait shorter than this is not worth a clause of the sentence
QUEUE_SHOWN_FROM_SECONDS = 0.5


def format_start_seconds(seconds: float) -> str:
    """Seconds of a start as "0.52 s", "12.4 s" or "2 min 05 s"."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


@dataclass(frozen=True)
class TimeToReady:
    """One start's time to ready."""

    #: from the hub's start of the server (the click on Start) to its first answer
    seconds: float
    #: of which waiting in the queue for a GPU to free up
    queued_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.seconds < 0 or self.queued_seconds < 0:
            raise ValueError("a start cannot take negative time")

    @property
    def message(self) -> str:
        """ "Ready 0.52 s after Start", with the queue's part when there was one."""
        sentence = f"Ready {format_start_seconds(self.seconds)} after Start"
        if self.queued_seconds >= QUEUE_SHOWN_FROM_SECONDS:
            waited = format_start_seconds(min(self.queued_seconds, self.seconds))
            sentence += f" ({waited} of it waiting in the queue for a GPU)"
        return sentence

    def view(self) -> dict[str, Any]:
        """What the hub's APIs answer (JSON)."""
        return {
            "seconds": round(self.seconds, 3),
            "queued_seconds": round(self.queued_seconds, 3),
            "message": self.message,
        }


def ready_event(event: dict[str, Any], ready: TimeToReady | None) -> dict[str, Any]:
    """JupyterHub's last spawn-progress event ("Server ready at URL") with the time it took,
    for the spawn page (a ``Spawner.progress_ready_hook``)."""
    if ready is None:
        return event
    took = format_start_seconds(ready.seconds)
    event = dict(event)
    for key in ("message", "html_message"):
        if key in event:
            event[key] = f"{event[key]}, {took} after Start"
    return event
