"""The apps a server opens from JupyterLab's launcher, handed to it as it starts: the apps of
the server's environment, from the ``apps`` settings, as ``$GPUTAP_APPS`` (read by
hub_config/singleuser/jupyter_server_config.py), on every backend."""

from __future__ import annotations

import json
from typing import Any

from ..core.apps import ENV_VAR, proxy_servers


def apps_env(apps: dict[str, Any], environment: str) -> dict[str, str]:
    """The variable that hands a server of ``environment`` its apps (jupyter-server-proxy's
    servers, spawner/core/apps.py)."""
    return {ENV_VAR: json.dumps(proxy_servers(apps, environment))}
