"""How a user's server is named in logs, messages and queues: ``user`` for the default
server, ``user/server`` for a named one (JupyterHub's REST API paths read the same way); and
the one rule for a scale-out worker's name (``w1`` to ``w999``), which the hub gives and
billing checks."""

from __future__ import annotations

import re

#: a worker of a server's group: "w" and its number K = 1..999, no leading zero
WORKER_RULE = "w1 to w999 (w and a number from 1, no leading zero)"
WORKER_NAME = re.compile(r"^w[1-9][0-9]{0,2}$")


def server_label(user: str, server: str = "") -> str:
    return f"{user}/{server}" if server else user


def user_of(label: str) -> str:
    """The user of a server's or worker's label (``user``, ``user/server``, ``...#wK``)."""
    return label.partition("#")[0].partition("/")[0]


def is_worker_name(name: object) -> bool:
    """Whether ``name`` is a worker's name, matched whole (no trailing newline)."""
    return isinstance(name, str) and WORKER_NAME.fullmatch(name) is not None


def worker_label(user: str, server: str, worker: str) -> str:
    """A worker as logs name it: ``user/server#wK`` (the holder name placement uses)."""
    return f"{server_label(user, server)}#{worker}" if worker else server_label(user, server)
