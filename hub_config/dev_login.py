"""The development login (any name, no password): JupyterHub's DummyAuthenticator, whose
login page answers only on the hub's own host (hub_config/origins.py)."""

from __future__ import annotations

from typing import Any

from jupyterhub.auth import DummyAuthenticator

from .origins import hub_host_only


class DevLoginAuthenticator(DummyAuthenticator):
    """DummyAuthenticator with its login page kept on the hub's host."""

    def get_handlers(self, app: Any) -> list[tuple]:
        return hub_host_only(super().get_handlers(app))
