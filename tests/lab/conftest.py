"""A real Jupyter server with the gputap_lab extension, started as its own process.

The server runs the extension from this checkout (``PYTHONPATH``), enabled as the installed
package's config file enables it, with a GPU reader from tests/lab/fake_gpu.py and the
environment a hub gives a single-user server. Tests call it over HTTP as the browser does.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.lab.fake_hub import HubState, running_hub
from tests.platform import free_port

ROOT = Path(__file__).resolve().parents[2]
EXTENSION = ROOT / "extensions" / "gputap-lab"


class LabServer:
    """One ``jupyter server`` process; ``get``/``post``/… carry its token unless told not to."""

    def __init__(self, root: Path, env: dict[str, str], config: dict[str, Any]) -> None:
        self.root = root
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log_path = root / "server.log"
        self.env = env
        self.config = {
            "ServerApp": {"jpserver_extensions": {"gputap_lab": True}},
            "IdentityProvider": {"token": self.token},
            **config,
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        (self.root / "config").mkdir(parents=True, exist_ok=True)
        (self.root / "work").mkdir(exist_ok=True)
        (self.root / "config" / "jupyter_server_config.json").write_text(json.dumps(self.config))
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root),
            "LANG": "C.UTF-8",
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(EXTENSION)]),
            "JUPYTER_CONFIG_DIR": str(self.root / "config"),
            "JUPYTER_DATA_DIR": str(self.root / "data"),
            "JUPYTER_RUNTIME_DIR": str(self.root / "runtime"),
            "JUPYTER_PLATFORM_DIRS": "1",
            **self.env,
        }
        command = [
            sys.executable,
            "-m",
            "jupyter_server",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={self.root / 'work'}",
            "--ServerApp.log_level=DEBUG",
        ]
        if os.geteuid() == 0:
            command.append("--allow-root")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter server exited:\n{self.log()}")
            try:
                if self.get("api/status").status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"jupyter server did not answer in 60 s:\n{self.log()}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def request(self, method: str, path: str, *, auth: bool = True, **kwargs: Any):
        headers = kwargs.pop("headers", {})
        if auth:
            headers.setdefault("Authorization", f"token {self.token}")
        return requests.request(
            method, self.url + path, headers=headers, timeout=30, allow_redirects=False, **kwargs
        )

    def get(self, path: str, **kwargs: Any):
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any):
        return self.request("POST", path, **kwargs)

    def delete(self, path: str, **kwargs: Any):
        return self.request("DELETE", path, **kwargs)

    def last_activity(self) -> str:
        """What jupyterhub-singleuser would report to the hub (``/api/status``)."""
        return self.get("api/status").json()["last_activity"]


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory) -> Iterator:
    """``lab_server(reader=..., env=..., config=..., **GPUTapLab settings)`` → a started
    LabServer; ``config`` adds other classes' settings (``{"LabApp": {...}}``).

    ``reader`` names a class in tests/lab/fake_gpu.py (None: the real NvmlReader). Samples
    every 0.2 s unless ``sample_interval_seconds`` says otherwise. Stopped at module end.
    """
    servers: list[LabServer] = []

    def start(
        reader: str | None = "BusyGPU",
        env: dict[str, str] | None = None,
        config: dict[str, Any] | None = None,
        **settings: Any,
    ) -> LabServer:
        lab = {"sample_interval_seconds": 0.2, **settings}
        if reader is not None:
            lab["gpu_reader_class"] = f"tests.lab.fake_gpu.{reader}"
        server = LabServer(
            tmp_path_factory.mktemp("lab"),
            {"CUDA_VISIBLE_DEVICES": "GPU-4a1c0000-aaaa-bbbb-cccc-000000000001", **(env or {})},
            {"GPUTapLab": lab, **(config or {})},
        )
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def hub() -> Iterator[tuple[HubState, str]]:
    """The fake hub's state and API URL (``…/hub/api``), for user alice."""
    state = HubState(user="alice", token=secrets.token_hex(20))
    with running_hub(state) as url:
        yield state, url


def hub_env(state: HubState, url: str, server_name: str = "") -> dict[str, str]:
    """What JupyterHub puts in a single-user server's environment."""
    return {
        "JUPYTERHUB_API_URL": url,
        "JUPYTERHUB_API_TOKEN": state.token,
        "JUPYTERHUB_USER": state.user,
        "JUPYTERHUB_SERVER_NAME": server_name,
        "GPUTAP_SIMULATED": "1",
    }


def wait_for_samples(server, count: int = 3) -> dict:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        answer = server.get("gputap/gpu").json()
        if len(answer["history"]) >= count:
            return answer
        time.sleep(0.1)
    raise AssertionError(f"fewer than {count} samples in 15 s: {answer}\n{server.log()}")


def activity_moves(server, seconds: float = 1.2) -> bool:
    """Whether last_activity moves while nobody uses the server but the panel's polling."""
    before = server.last_activity()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        server.get("gputap/gpu")
        time.sleep(0.1)
    return server.last_activity() != before
