"""How a user's server is named in logs, messages and queues: ``user`` for the default
server, ``user/server`` for a named one (JupyterHub's REST API paths read the same way)."""

from __future__ import annotations


def server_label(user: str, server: str = "") -> str:
    return f"{user}/{server}" if server else user
