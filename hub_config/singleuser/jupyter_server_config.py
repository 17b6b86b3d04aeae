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

# /proxy/PORT/ reaches only ports this server's own processes listen on: on one machine all
# servers share loopback, and another user's app must never answer (gputap_lab/ports.py).
# Without gputap-lab in the environment no arbitrary port is proxied at all (apps the
# server starts itself still are).
try:
    from gputap_lab.ports import own_listener
except ImportError:
    own_listener = None
c.ServerProxy.host_allowlist = own_listener or (
    lambda handler, host: isinstance(getattr(handler, "port", None), int)
)

# Lab's terminals: a login shell first, as Jupyter's own default (the system's /etc/profile and
# the user's ~/.profile run), then an interactive one with the server's own PATH in front again:
# Debian's /etc/profile resets PATH, which dropped the environment's python from terminals
# (the README's `python -m http.server 8080` found none, or the system's, without torch).
_SHELL = os.environ.get("SHELL") or ""
if os.path.basename(_SHELL) == "bash":
    os.environ["GPUTAP_SERVER_PATH"] = os.environ.get("PATH", "")
    c.ServerApp.terminado_settings = {
        "shell_command": [
            _SHELL,
            "-l",
            "-c",
            'PATH="$GPUTAP_SERVER_PATH:$PATH"; export PATH; exec "$0" -i',
            _SHELL,
        ]
    }

# JupyterLab's extension manager installs nothing here: environments are the operator's (a
# server's account cannot write them), and a server reaches no package index; "readonly" also
# spares each start the PyPI manager's set-up (docs/instant-start.md)
c.LabApp.extension_manager = "readonly"
