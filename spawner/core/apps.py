"""Apps in users' servers, pure: the ``apps`` settings checked, and turned into what
jupyter-server-proxy registers (``c.ServerProxy.servers``) for a server of one environment.

The hub hands each server its apps as ``$GPUTAP_APPS`` (JSON, :func:`proxy_servers`); the
server's own config (hub_config/singleuser/jupyter_server_config.py) registers them, so each
opens as a launcher tile at ``/user/NAME/APP/``. A user's own program on a port answers at
``/user/NAME/proxy/PORT/`` without any of this: jupyter-server-proxy serves every local port,
behind the server's login.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gputap_common.settings import SettingsError

#: the environment key that stands for every environment
ALL = "all"
#: the variable a server reads its apps from
ENV_VAR = "GPUTAP_APPS"
#: paths a server answers itself below its prefix (Jupyter Server's, JupyterLab's, the
#: extensions'): an app of that name would hide them
RESERVED_NAMES = frozenset(
    {
        "api",
        "custom",
        "doc",
        "edit",
        "extensions",
        "files",
        "gputap",
        "kernelspecs",
        "lab",
        "login",
        "logout",
        "lsp",
        "metrics",
        "nbconvert",
        "nbextensions",
        "notebooks",
        "proxy",
        "server-proxy",
        "static",
        "terminals",
        "tree",
        "view",
    }
)
TENSORBOARD = "tensorboard"
TENSORBOARD_TIMEOUT_SECONDS = 60.0


def tensorboard_app(tensorboard: Mapping[str, Any]) -> dict[str, Any]:
    """The built-in TensorBoard as an app like the operator's: it listens on the loopback
    only (the server's proxy is its one way in) and sees its URL prefix as ``/``."""
    return {
        "title": "TensorBoard",
        "command": [
            "tensorboard",
            "--logdir",
            tensorboard["log_dir"],
            "--port",
            "{port}",
            "--host",
            "127.0.0.1",
        ],
        "port": None,
        "icon": "tensorboard.svg",
        "launcher": tensorboard["launcher"],
        "environments": list(tensorboard["environments"]),
        # its first start reads every run under log_dir before it answers
        "timeout_seconds": TENSORBOARD_TIMEOUT_SECONDS,
        # its page asks for new data every 30 s: an open tab is no sign of a user
        "activity": False,
        "absolute_url": False,
    }


def all_apps(apps: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every app the settings declare (``apps`` as loaded), TensorBoard first when enabled."""
    declared: dict[str, dict[str, Any]] = {}
    if apps["tensorboard"]["enabled"]:
        declared[TENSORBOARD] = tensorboard_app(apps["tensorboard"])
    declared.update((name, dict(app)) for name, app in apps["custom"].items())
    return declared


def check_apps(apps: Mapping[str, Any], environments: set[str] | None = None) -> None:
    """Refuse, naming the key, what the schema alone cannot: a name a server answers itself,
    an app that neither starts nor names a port, a command that is never told its port, an
    environment list mixing ``all`` with keys, or (given the known ``environments``) one
    that names no environment."""
    custom = apps["custom"]
    if apps["tensorboard"]["enabled"] and TENSORBOARD in custom:
        raise SettingsError(
            f"apps.custom.{TENSORBOARD} is the built-in TensorBoard's name: give the app "
            f"another, or set apps.tensorboard.enabled: false to replace it"
        )
    _check_environments("apps.tensorboard.environments", apps["tensorboard"], environments)
    for name, app in custom.items():
        where = f"apps.custom.{name}"
        if name in RESERVED_NAMES:
            raise SettingsError(
                f"{where}: {name!r} is a path the server answers itself "
                f"({', '.join(sorted(RESERVED_NAMES))}); give the app another name"
            )
        command, port = app["command"], app["port"]
        if not command and port is None:
            raise SettingsError(
                f"{where} needs a command to start, or the port of what already listens"
            )
        if command and port is None and not any("{port}" in arg for arg in command):
            raise SettingsError(
                f"{where}.command never names {{port}}, and port is null: the app would not "
                "know the port it is proxied at; put {port} in the command (e.g. --port "
                "{port}) or set port"
            )
        _check_environments(f"{where}.environments", app, environments)


def _check_environments(where: str, app: Mapping[str, Any], environments: set[str] | None) -> None:
    keys = list(app["environments"])
    if not keys:
        raise SettingsError(f"{where} is empty: name environments, or [all]")
    if ALL in keys and len(keys) > 1:
        raise SettingsError(f"{where}: {ALL} already means every environment; give it alone")
    if environments is not None and ALL not in keys:
        unknown = [k for k in keys if k not in environments]
        if unknown:
            raise SettingsError(
                f"{where}: {', '.join(unknown)} is no environment; "
                f"environments are: {', '.join(sorted(environments))}"
            )


def has_app(app: Mapping[str, Any], environment: str) -> bool:
    """Whether a server of ``environment`` ("" for the backend's default) has ``app``."""
    keys = app["environments"]
    return ALL in keys or (bool(environment) and environment in keys)


def proxy_servers(apps: Mapping[str, Any], environment: str = "") -> dict[str, dict[str, Any]]:
    """jupyter-server-proxy's ``c.ServerProxy.servers`` for a server of ``environment``
    (JSON-ready): the enabled apps that environment has. A relative ``icon_path`` is left
    for the server to resolve against its icons folder."""
    servers: dict[str, dict[str, Any]] = {}
    for name, app in all_apps(apps).items():
        if not has_app(app, environment):
            continue
        entry: dict[str, Any] = {"enabled": bool(app["launcher"]), "title": app["title"] or name}
        if app["icon"]:
            entry["icon_path"] = app["icon"]
        server: dict[str, Any] = {
            "command": list(app["command"]),
            "timeout": float(app["timeout_seconds"]),
            "absolute_url": bool(app["absolute_url"]),
            "update_last_activity": bool(app["activity"]),
            "launcher_entry": entry,
        }
        if app["port"] is not None:
            server["port"] = int(app["port"])
        servers[name] = server
    return servers
