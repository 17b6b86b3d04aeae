"""Refused starts: each user's last one, kept until their next spawn form shows it, and a
start from a link, which is always refused.

JupyterHub renders the form again after a refused start from the default spawner, whichever
server was refused, so the refusal is kept per user, in the hub's memory, for a short while.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

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


def new_named(spawner: Any) -> bool:
    """Whether ``spawner`` is a named server the hub made for this start: nothing of it was
    ever saved (a server that ran keeps at least why it stopped)."""
    return bool(spawner.name) and not spawner.orm_spawner.state


async def remove_refused(spawner: Any, settle_seconds: float = 30) -> None:
    """Remove a new named server whose first start was refused, once JupyterHub is done
    with the failed start: JupyterHub makes the server before the start is asked, and it
    stayed, empty, counting against ``named_server_limit_per_user``. As JupyterHub's own
    DELETE with ``remove`` does; it never ran, so it holds nothing to delete."""
    # JupyterHub's own clean-up of the failed start runs first (it awaits nothing of ours)
    for _ in range(round(settle_seconds / 0.1)):
        await asyncio.sleep(0.1)
        if not spawner.pending:
            break
    user = spawner.user
    if spawner.active or user.spawners.get(spawner.name) is not spawner:
        return  # started again meanwhile, or already removed
    spawner.log.info("%s: refused at its first start; removed", spawner._log_name)
    user.db.delete(spawner.orm_spawner)
    user.spawners.pop(spawner.name, None)
    user.db.commit()


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
