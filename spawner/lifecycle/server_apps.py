"""The apps a server opens from JupyterLab's launcher, handed to it as it starts.

:class:`AppsMixin` is one of :class:`~.mixin.GPUSpawnerMixin`'s bases: it holds the ``apps``
settings and puts the apps of the server's environment in its environment
(``$GPUTAP_APPS``, read by hub_config/singleuser/jupyter_server_config.py), on every backend.
"""

from __future__ import annotations

import json

from traitlets import Dict
from traitlets.config import LoggingConfigurable

from ..core.apps import ENV_VAR, proxy_servers


class AppsMixin(LoggingConfigurable):
    apps = Dict(
        {"tensorboard": {"enabled": False}, "custom": {}},
        config=True,
        help="""The apps servers open from JupyterLab's launcher: the ``apps`` settings as
        loaded (hub_config/hub.py checks them at start-up). Each server gets those of its
        environment as $GPUTAP_APPS, jupyter-server-proxy's servers (spawner/core/apps.py).

        c.GPUSpawnerMixin.apps = {"tensorboard": {"enabled": True, "log_dir": "~/runs",
                                  "launcher": True, "environments": ["all"]}, "custom": {}}
        """,
    )

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        record = getattr(self, "record", None)
        environment = record.environment if record is not None else ""
        env[ENV_VAR] = json.dumps(proxy_servers(self.apps, environment))
        return env
