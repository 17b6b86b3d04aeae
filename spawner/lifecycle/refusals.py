"""Refused starts: each user's last one, kept until their next spawn form shows it, and a
start from a link, which is always refused.

JupyterHub renders the form again after a refused start from the default spawner, whichever
server was refused, so the refusal is kept per user, in the hub's memory, for a short while.
"""

from __future__ import annotations

import time

from ..core.asking import Refused

#: seconds a refusal waits for its form (the page renders it at once)
SHOWN_SECONDS = 120
_refusals: dict[str, tuple[float, Refused]] = {}


def remember(username: str, refused: Refused) -> None:
    _refusals[username] = (time.monotonic(), refused)


def take(username: str) -> Refused | None:
    """The user's refusal if it is recent, once: the next form no longer shows it."""
    at, refused = _refusals.pop(username, (0.0, None))
    return refused if time.monotonic() - at <= SHOWN_SECONDS else None


class SpawnFromLink(Exception):
    """A GET of the spawn page with options in its query: nothing starts from a link.

    JupyterHub's spawn page starts a server from ``GET /hub/spawn/...?choice=...`` when
    the spawner reads the query; a cross-site link or image would then start (and bill) a
    server. Refusing sends JupyterHub back to the form, which shows this message."""

    jupyterhub_message = (
        "Nothing was started: a link cannot start a server. "
        "Press Start to start this server with the options below."
    )

    def __str__(self) -> str:
        return self.jupyterhub_message
