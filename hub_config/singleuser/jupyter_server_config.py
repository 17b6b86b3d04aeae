# The apps this server opens from JupyterLab's launcher, as the hub hands them over in
# $GPUTAP_APPS: jupyter-server-proxy's servers (spawner/core/apps.py makes them from the
# `apps` settings, docs/lab.md "Apps"). Jupyter reads this file from the server's config path
# (hub_config/singleuser on one machine, /opt/venv/etc/jupyter in images/singleuser).
# Self-contained: the single-user image has no gputap package to import.
import json
import os
from pathlib import Path

c = get_config()  # noqa: F821 (Jupyter's config loader provides it)

ICONS = Path(__file__).resolve().parent / "icons"


def _registered(servers: dict) -> dict:
    """The servers with icons found (a relative path is one of ICONS) and a leading ``~/``
    of a command's arguments made the user's home (no shell runs the command)."""
    for server in servers.values():
        server["command"] = [
            os.path.expanduser(arg) if arg.startswith("~/") else arg for arg in server["command"]
        ]
        entry = server.get("launcher_entry", {})
        if entry.get("icon_path"):
            entry["icon_path"] = str(ICONS / os.path.expanduser(entry["icon_path"]))
    return servers


c.ServerProxy.servers = _registered(json.loads(os.environ.get("GPUTAP_APPS") or "{}"))
