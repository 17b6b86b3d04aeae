"""A real JupyterHub (with configurable-http-proxy) running the billing service, for tests."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import requests

WORKTREE = Path(__file__).resolve().parents[2]
CHP_CANDIDATES = [
    os.environ.get("GPUTAP_CHP", ""),
    str(WORKTREE / "node_modules/.bin/configurable-http-proxy"),
    "/work/main/node_modules/.bin/configurable-http-proxy",
    "/tmp/chp/node_modules/.bin/configurable-http-proxy",
]


def find_chp() -> str | None:
    return next((c for c in CHP_CANDIDATES if c and os.access(c, os.X_OK)), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CONFIG = """
import sys
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.ConfigurableHTTPProxy.pid_file = {tmp!r} + "/proxy.pid"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.JupyterHub.db_url = "sqlite:///" + {tmp!r} + "/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = {tmp!r} + "/cookie_secret"
c.JupyterHub.custom_scopes = {{
    "custom:gputap-billing:hub": {{"description": "Open accounts, admit and meter sessions"}},
    "custom:gputap-billing:admin": {{"description": "Read all billing, adjust credit"}},
}}
c.JupyterHub.services = [
    {{
        "name": "billing",
        "url": "http://127.0.0.1:{billing_port}",
        "command": [sys.executable, "-m", "billing_service"],
        "environment": {{"GPUTAP_SETTINGS": {settings!r}, "PYTHONPATH": {worktree!r}}},
        "oauth_no_confirm": True,
        "oauth_client_allowed_scopes": ["custom:gputap-billing:admin"],
    }},
    {{"name": "gputap-hub", "api_token": {hub_token!r}}},
    {{"name": "ops", "api_token": {ops_token!r}}},
]
c.JupyterHub.load_roles = [
    {{"name": "user", "scopes": ["self", "access:services!service=billing"]}},
    {{
        "name": "billing-hub",
        "scopes": ["custom:gputap-billing:hub", "access:services!service=billing"],
        "services": ["gputap-hub"],
    }},
    {{
        "name": "billing-admin",
        "scopes": ["custom:gputap-billing:admin", "admin:users", "tokens", "access:services"],
        "services": ["ops"],
    }},
    {{
        "name": "billing-service",
        "scopes": ["list:users", "read:servers", "delete:servers"],
        "services": ["billing"],
    }},
]
"""

SETTINGS = """
data_dir: {tmp}
billing:
  trial_credit: "10.00"
  min_billable_seconds: 300
  enforce_interval_seconds: 1
"""


@dataclass
class Hub:
    url: str
    hub_token: str
    ops_token: str
    log_path: Path
    process: subprocess.Popen

    @property
    def billing(self) -> str:
        return f"{self.url}/services/billing/"

    @property
    def api(self) -> str:
        return f"{self.url}/hub/api"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def user_token(self, username: str) -> str:
        """Create ``username`` on the hub and a token for them (as the ops service)."""
        ops = {"Authorization": f"token {self.ops_token}"}
        r = requests.post(f"{self.api}/users/{username}", headers=ops, timeout=10)
        assert r.status_code in (201, 409), r.text
        r = requests.post(f"{self.api}/users/{username}/tokens", headers=ops, json={}, timeout=10)
        assert r.status_code == 201, r.text
        return r.json()["token"]


def start_hub(tmp: Path, chp: str) -> Hub:
    settings = tmp / "gputap.yaml"
    settings.write_text(SETTINGS.format(tmp=tmp))
    port = free_port()
    values = dict(
        port=port,
        hub_port=free_port(),
        proxy_api_port=free_port(),
        billing_port=free_port(),
        chp=chp,
        tmp=str(tmp),
        settings=str(settings),
        worktree=str(WORKTREE),
        hub_token=secrets.token_hex(16),
        ops_token=secrets.token_hex(16),
    )
    config = tmp / "jupyterhub_config.py"
    config.write_text(CONFIG.format(**values))
    log_path = tmp / "hub.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(config)],
            cwd=tmp,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    hub = Hub(
        f"http://127.0.0.1:{port}", values["hub_token"], values["ops_token"], log_path, process
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"jupyterhub exited:\n{hub.log()[-3000:]}")
        try:
            if requests.get(hub.billing + "health", timeout=2).status_code == 200:
                return hub
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    stop_hub(hub)
    raise RuntimeError(f"billing did not come up through the hub:\n{hub.log()[-3000:]}")


def stop_hub(hub: Hub) -> None:
    hub.process.terminate()
    try:
        hub.process.wait(15)
    except subprocess.TimeoutExpired:
        hub.process.kill()
        hub.process.wait(5)
