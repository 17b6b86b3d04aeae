"""Start the whole platform for tests: the real hub (hub_config/jupyterhub_config.py), the real
configurable-http-proxy, the real billing service and real single-user servers.

A `Platform` owns a temporary data directory and free ports, and offers small helpers over
the hub's REST API (with an automation token declared in the settings, as an operator would)
and over billing's API.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import requests
import yaml

from tests.waiting import wait_for

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "hub_config" / "jupyterhub_config.py"
OPS_SCOPES = [
    "admin:users",
    "admin:servers",
    "admin:server_state",
    "tokens",
    "list:users",
    "read:users",
    "custom:gputap-billing:admin",
    "access:services",
]
#: spawner.poll_interval_seconds of the tests' hubs: a server that dies is found gone within a
#: second, not the default 10 s, so a test waits for that only as long as it takes
POLL_SECONDS = 1


def _ephemeral_ports() -> range:
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port() -> int:
    """A port nothing listens on, for a server this test starts a moment later.

    Never one of the kernel's ephemeral ports: between this check and the server's bind, any
    outgoing connection of the machine (there are many while the tests run) may take an
    ephemeral port as its own end, and the server then fails with EADDRINUSE while whatever
    else answers there looks like it (seen: a test's proxy port taken, its requests
    answered by another test's hub)."""
    ephemeral = _ephemeral_ports()
    candidates = [p for p in range(20000, 32768) if p not in ephemeral]
    while True:
        port = random.choice(candidates)
        if not _claim(port):
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


#: ports handed out lately, across the test processes running at once (pytest-xdist's): a
#: port free now is not handed to a second test in another process before the first binds it
#: (seen: billing's port taken by another test's server a moment before billing started)
PORT_CLAIMS = Path(tempfile.gettempdir()) / "gputap-test-ports"
PORT_CLAIM_SECONDS = 600


def _claim(port: int) -> bool:
    """Whether ``port`` is ours to use: not handed out by any test process in the last
    PORT_CLAIM_SECONDS."""
    PORT_CLAIMS.mkdir(exist_ok=True)
    claim = PORT_CLAIMS / str(port)
    try:
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        with contextlib.suppress(FileNotFoundError):
            if time.time() - claim.stat().st_mtime > PORT_CLAIM_SECONDS:
                claim.unlink()  # an old claim: the next look may take it
        return False


class Platform:
    def __init__(
        self,
        root: Path,
        extra: dict[str, Any] | None = None,
        services: list[dict[str, Any]] | None = None,
        env: dict[str, str] | None = None,
        config: Path = CONFIG,
        external_billing: bool = False,
    ):
        """``external_billing``: run billing as an external service (``billing.managed:
        false``) that this object starts and stops, so it outlives hub restarts and can be
        down while the hub runs (start_billing / stop_billing)."""
        self.root = root
        self.ops_token = secrets.token_hex(16)
        self.billing_token = secrets.token_hex(32) if external_billing else None
        self.port, self.hub_port, self.billing_port = free_port(), free_port(), free_port()
        self._billing_port_hold: socket.socket | None = None
        self.proxy_api_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        settings: dict[str, Any] = {
            "data_dir": str(root / "data"),
            "hub": {
                "port": self.port,
                "hub_port": self.hub_port,
                "proxy_api_port": self.proxy_api_port,
                # one origin for every server, so tests reach them at 127.0.0.1; the servers
                # on subdomains have tests of their own (tests/integration/test_origins.py)
                "subdomain_host": "",
                "all_users_trusted": True,
                "services": [
                    {"name": "ops", "api_token": self.ops_token, "scopes": OPS_SCOPES},
                    *(services or []),
                ],
            },
            "spawner": {"start_timeout": 60, "poll_interval_seconds": POLL_SECONDS},
            "billing": {
                "port": self.billing_port,
                "min_billable_seconds": 5,
                "enforce_interval_seconds": 1,
            },
        }
        if external_billing:
            settings["billing"].update(managed=False, api_token=self.billing_token)
        for section, values in (extra or {}).items():
            if isinstance(values, dict):
                settings.setdefault(section, {}).update(values)
            else:  # a list (shared_data) or a value
                settings[section] = values
        self.settings_path = root / "gputap.yaml"
        self.settings_path.write_text(yaml.safe_dump(settings))
        self.env = dict(env or {})
        self.config = config
        self.log_path = root / "hub.log"
        self.proc: subprocess.Popen | None = None
        self.billing_proc: subprocess.Popen | None = None
        self.api = requests.Session()
        # tests spawn up to 20 servers at once through this one session
        self.api.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=32))
        self.api.headers["Authorization"] = f"token {self.ops_token}"

    # -- process ------------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUTAP")}
        env["GPUTAP_SETTINGS"] = str(self.settings_path)
        env.update(self.env)
        return env

    def start(self, timeout: float = 60) -> None:
        (self.root / "data").mkdir(exist_ok=True)
        if self.billing_token and self.billing_proc is None:
            self.start_billing()
        log = open(self.log_path, "ab")  # noqa: SIM115 (kept open for the hub's life)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(self.config)],
            cwd=self.root / "data",
            env=self._env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hub exited:\n{self.log_tail()}")
            try:
                if requests.get(f"{self.url}/hub/health", timeout=2).ok and self.billing_up():
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"hub did not come up:\n{self.log_tail()}")

    def billing_up(self) -> bool:
        try:
            return requests.get(f"{self.url}/services/billing/health", timeout=2).ok
        except requests.RequestException:
            return False

    def start_billing(self, timeout: float = 30) -> None:
        """Start the external billing service with the environment JupyterHub would give a
        managed one (docs/billing.md, "Running billing outside the hub")."""
        assert self.billing_token, "start_billing needs Platform(external_billing=True)"
        if self._billing_port_hold is not None:
            self._billing_port_hold.close()
            self._billing_port_hold = None
        env = self._env()
        env.update(
            JUPYTERHUB_SERVICE_NAME="billing",
            JUPYTERHUB_API_TOKEN=self.billing_token,
            JUPYTERHUB_API_URL=f"http://127.0.0.1:{self.hub_port}/hub/api",
            JUPYTERHUB_BASE_URL="/",
            JUPYTERHUB_CLIENT_ID="service-billing",
            JUPYTERHUB_SERVICE_URL=f"http://127.0.0.1:{self.billing_port}",
            JUPYTERHUB_SERVICE_PREFIX="/services/billing/",
        )
        log = open(self.root / "billing.log", "ab")  # noqa: SIM115 (kept open for its life)
        self.billing_proc = subprocess.Popen(
            [sys.executable, "-m", "billing_service"],
            cwd=self.root / "data",
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        health = f"http://127.0.0.1:{self.billing_port}/services/billing/health"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.billing_proc.poll() is not None:
                raise RuntimeError(f"billing exited:\n{self.billing_log_tail()}")
            try:
                if requests.get(health, timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"billing did not come up:\n{self.billing_log_tail()}")

    def stop_billing(self, hold_port: bool = True) -> None:
        """Kill the external billing service, as a crash would. Its port stays bound here
        (never listening) until it starts again: connections are refused, as after a crash,
        and another test's free_port() cannot hand the port out meanwhile."""
        if self.billing_proc is not None:
            self.billing_proc.kill()
            self.billing_proc.wait()
            self.billing_proc = None
        if hold_port and self._billing_port_hold is None:
            hold = socket.socket()
            # the dead service's connections linger in TIME_WAIT on the port
            hold.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            hold.bind(("127.0.0.1", self.billing_port))
            self._billing_port_hold = hold

    def billing_log_tail(self, lines: int = 40) -> str:
        try:
            text = (self.root / "billing.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop_hub(self) -> None:
        """Stop the hub as an operator would (SIGTERM); servers keep running."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def shutdown(self) -> None:
        """Stop every server, then the hub; then (g): the billing ledger must balance."""
        problems: list[str] = []
        if self.proc and self.proc.poll() is None:
            try:
                for user in self.get("/users").json():
                    for name in user.get("servers", {}):
                        self.stop_server(user["name"], name, wait=False)
            except (requests.RequestException, ValueError):
                pass
            problems = self.ledger_problems()
        self.stop_hub()
        self.stop_billing(hold_port=False)
        if self._billing_port_hold is not None:
            self._billing_port_hold.close()
        # servers outlive the hub (cleanup_servers = False): end any left in our homes
        homes = str(self.root / "data" / "homes")
        for proc in psutil.process_iter(["cwd"]):
            if (proc.info.get("cwd") or "").startswith(homes):
                proc.kill()
        assert problems == [], f"the billing ledger does not balance: {problems}"

    def ledger_problems(self) -> list[str]:
        """Billing's ledger check (GET api/ledger/check); [] when billing cannot be asked."""
        try:
            r = self.billing("api/ledger/check")
        except requests.RequestException:
            return []
        return r.json()["problems"] if r.ok else []

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def wait_for(
        self,
        predicate: Callable[[], T],
        what: str = "the condition",
        timeout: float = 60,
        step: float = 0.25,
    ) -> T:
        """tests/waiting.py's wait_for with the hub's log tail in its failure, for what the
        hub, its services or its servers bring about."""
        return wait_for(predicate, lambda: f"{what}\n{self.log_tail(80)}", timeout, step)

    # -- hub API ------------------------------------------------------------------------

    def get(self, path: str, **kw) -> requests.Response:
        return self.api.get(f"{self.url}/hub/api{path}", timeout=30, **kw)

    def post(self, path: str, body: Any = None) -> requests.Response:
        return self.api.post(f"{self.url}/hub/api{path}", json=body, timeout=90)

    def create_user(self, name: str) -> None:
        r = self.post(f"/users/{name}")
        assert r.status_code in (201, 409), r.text

    def user_token(self, name: str) -> str:
        r = self.post(f"/users/{name}/tokens", {"note": "test", "expires_in": 3600})
        assert r.status_code == 201, r.text
        return r.json()["token"]

    def login(self, name: str) -> requests.Session:
        """A browser-like session logged in with the development login."""
        s = requests.Session()
        s.get(f"{self.url}/hub/login", timeout=10)
        r = s.post(
            f"{self.url}/hub/login",
            data={"username": name, "password": "x", "_xsrf": s.cookies.get("_xsrf")},
            timeout=30,
        )
        assert r.ok, r.text
        return s

    @staticmethod
    def server_path(name: str, server_name: str = "") -> str:
        """The REST path of a user's default server ("") or of a named one."""
        return f"/users/{name}/servers/{server_name}" if server_name else f"/users/{name}/server"

    def spawn(
        self, name: str, options: dict[str, Any] | None, server_name: str = ""
    ) -> requests.Response:
        return self.post(self.server_path(name, server_name), {"user_options": options})

    def server(self, name: str, server_name: str = "") -> dict[str, Any] | None:
        return self.get(f"/users/{name}").json().get("servers", {}).get(server_name)

    def wait_ready(self, name: str, timeout: float = 90, server_name: str = "") -> dict[str, Any]:
        who = f"{name}/{server_name}" if server_name else name
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            server = self.server(name, server_name)
            if server and server.get("ready"):
                return server
            if server is None:
                raise AssertionError(f"{who}'s server is gone:\n{self.log_tail()}")
            time.sleep(0.2)
        raise AssertionError(f"{who}'s server did not become ready:\n{self.log_tail()}")

    def stop_server(self, name: str, server_name: str = "", wait: bool = True) -> None:
        r = self.api.delete(f"{self.url}/hub/api{self.server_path(name, server_name)}", timeout=90)
        assert r.status_code in (202, 204, 400, 404), r.text
        if wait:
            self.wait_stopped(name, server_name=server_name)

    def wait_stopped(self, name: str, timeout: float = 60, server_name: str = "") -> None:
        self.wait_for(
            lambda: self.server(name, server_name) is None,
            f"{name}/{server_name}'s server stopped",
            timeout,
            step=0.2,
        )

    def follow_progress(
        self, name: str, into: list[str], server_name: str = ""
    ) -> threading.Thread:
        """Collect the messages of a user's spawn progress stream in a thread, until the
        spawn is ready or failed."""

        def read() -> None:
            url = f"{self.url}/hub/api{self.server_path(name, server_name)}/progress"
            with self.api.get(url, stream=True, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith(b"data:"):
                        event = json.loads(line[5:])
                        into.append(event.get("message", ""))
                        if event.get("ready") or event.get("failed"):
                            return

        thread = threading.Thread(target=read, daemon=True)
        thread.start()
        return thread

    def server_env(self, name: str, server_name: str = "") -> dict[str, str]:
        """The environment of the user's running server process, read from /proc."""
        pid = self.server(name, server_name)["state"]["pid"]
        raw = Path(f"/proc/{pid}/environ").read_bytes()
        return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)

    # -- billing ------------------------------------------------------------------------

    def billing(self, path: str, method: str = "GET", body: Any = None) -> requests.Response:
        return self.api.request(
            method,
            f"{self.url}/services/billing/{path}",
            data=None if body is None else json.dumps(body),
            timeout=30,
        )

    def account(self, name: str) -> dict[str, Any]:
        r = self.billing(f"api/accounts/{name}")
        assert r.ok, r.text
        return r.json()

    def sessions(self, name: str) -> list[dict[str, Any]]:
        r = self.billing(f"api/sessions?username={name}")
        assert r.ok, r.text
        return r.json()["sessions"]

    def adjust(self, name: str, amount: str) -> None:
        r = self.billing(
            f"api/accounts/{name}/adjustments",
            "POST",
            {"amount": amount, "reason": "test", "idempotency_key": secrets.token_hex(8)},
        )
        assert r.status_code in (200, 201), r.text


def billing_process(platform: Platform) -> psutil.Process:
    """The managed billing service of this platform (by the port it serves)."""
    for proc in psutil.process_iter(["cmdline"]):
        if "billing_service" in (proc.info["cmdline"] or []):
            with contextlib.suppress(psutil.Error):
                if any(c.laddr.port == platform.billing_port for c in proc.net_connections()):
                    return proc
    raise AssertionError("no billing process serves this platform")
