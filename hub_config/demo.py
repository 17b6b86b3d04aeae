"""`make demo`: start gputap on this machine with its embedded defaults and print the URL.

Runs JupyterHub with hub_config/jupyterhub_config.py (which starts the proxy and the billing
service), waits until it answers, then prints where to go. Ctrl-C stops everything; homes,
billing records and running servers' state stay in the data directory (.demo by default).

With ``GPUTAP_DEMO_GITHUB=1`` (and no real GitHub app configured) the login is GitHub login
through the stand-in of GitHub that the tests use (tests/github_sim), labelled as such on the
login page and on the stand-in's own page: pick a test user from
tests/github_sim/demo-users.yaml instead of typing a name.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from gputap_common.settings import load_settings

from .hub import DEV_LOGIN_NOTICE, ROOT

DEMO_GITHUB_USERS = ROOT / "tests" / "github_sim" / "demo-users.yaml"
STAND_IN_NOTICE = (
    "GitHub stand-in: this demo signs in through a simulated GitHub (tests/github_sim). "
    "Pick a test user there; no GitHub account is used."
)


def start_github_stand_in(host: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    """Start the tests' GitHub stand-in with the demo users (its log to `log_path`);
    return it and its URL."""
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.github_sim",
                "--host",
                host,
                "--users",
                str(DEMO_GITHUB_USERS),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("GitHub stand-in at "):
        proc.terminate()
        raise RuntimeError(f"the GitHub stand-in did not start: {line!r}")
    return proc, line.split()[3]


def stand_in_environment(url: str) -> dict[str, str]:
    """Settings overrides that point GitHub login at the stand-in at `url`."""
    values = {
        "GPUTAP__HUB__GITHUB__CLIENT_ID": "gputap-test-client",
        "GPUTAP__HUB__GITHUB__CLIENT_SECRET": "gputap-test-secret",
        "GPUTAP__HUB__GITHUB__URL": url,
        "GPUTAP__HUB__GITHUB__LOGIN_SERVICE": "GitHub stand-in",
        "GPUTAP__HUB__GITHUB__ADMIN_TEAMS": ["demo-uni:hub-admins"],
        "GPUTAP__HUB__LOGIN_NOTICE": STAND_IN_NOTICE,
        # the demo's test users are all the person running it
        "GPUTAP__SPAWNER__ALLOW_SHARED_UNIX_USER": True,
    }
    # override values are read as YAML: JSON keeps "a: b" a string
    return {name: json.dumps(value) for name, value in values.items()}


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 90) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            time.sleep(0.5)
    return False


def main() -> int:
    settings = load_settings()
    hub = settings.hub
    base = "/" + hub["base_url"].strip("/")
    base = base.rstrip("/") + "/"
    host = "127.0.0.1" if hub["ip"] in ("", "0.0.0.0") else hub["ip"]
    url = f"http://{host}:{hub['port']}{base}"
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    log_path = settings.data_dir / "jupyterhub.log"
    config = ROOT / "hub_config" / "jupyterhub_config.py"
    # the hub runs in the data directory: give it that directory as an absolute path
    env = {**os.environ, "GPUTAP__DATA_DIR": str(settings.data_dir)}
    login = "GitHub" if hub["github"]["client_id"] else DEV_LOGIN_NOTICE
    stand_in: subprocess.Popen | None = None
    if os.environ.get("GPUTAP_DEMO_GITHUB") == "1":
        if hub["github"]["client_id"]:
            print("GPUTAP_DEMO_GITHUB ignored: hub.github.client_id is set", file=sys.stderr)
        else:
            stand_in, github_url = start_github_stand_in(
                host, settings.data_dir / "github-stand-in.log"
            )
            env.update(stand_in_environment(github_url))
            login = f"{STAND_IN_NOTICE} ({github_url}; users: {DEMO_GITHUB_USERS})"
    print(f"Starting gputap (logs: {log_path}) ...", flush=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(config)],
            cwd=settings.data_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        if not wait_healthy(url + "hub/health", proc):
            print(f"gputap did not start; see {log_path}", file=sys.stderr)
            proc.terminate()
            return 1
        print(
            f"\n  gputap is running: open {url}\n"
            f"  Login: {login}\n"
            f"  Billing page: {url}services/billing/\n"
            f"  Data (homes, databases): {Path(settings.data_dir)}\n"
            "  Press Ctrl-C to stop.\n",
            flush=True,
        )
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        return proc.wait()
    finally:
        if stand_in is not None:
            stand_in.terminate()
            stand_in.wait(10)


if __name__ == "__main__":
    sys.exit(main())
