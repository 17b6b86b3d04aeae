"""`make demo`: start gputap on this machine with its embedded defaults and print the URL.

Runs JupyterHub with hub_config/jupyterhub_config.py (which starts the proxy and the billing
service), waits until it answers, then prints where to go. Ctrl-C stops everything; homes,
billing records and running servers' state stay in the data directory (.demo by default).

The login is GitHub when ``hub.github`` is configured, else the development login. (``make
demo`` with ``GPUTAP_DEMO_GITHUB=1`` runs a development tool, tests/github_sim/demo.py, which
starts the tests' stand-in of GitHub and then this, configured to log in through it.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from gputap_common.settings import load_settings

from .hub import DEV_LOGIN_NOTICE, ROOT


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
    github = hub["github"]
    login = DEV_LOGIN_NOTICE
    if github["client_id"]:
        where = github["url"] or "github.com"
        login = f"{github['login_service']} ({where}) {hub['login_notice']}".strip()
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


if __name__ == "__main__":
    sys.exit(main())
