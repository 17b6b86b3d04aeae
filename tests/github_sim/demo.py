"""`GPUTAP_DEMO_GITHUB=1 make demo`: the demo with GitHub login through the stand-in.

A development tool, not part of gputap: it starts the stand-in of GitHub that the tests use
with the demo users (demo-users.yaml beside this file), then runs `make demo`'s own
``python -m hub_config.demo`` with settings overrides pointing GitHub login at the stand-in,
labelled as such on the login page and on the stand-in's own page (pick a test user there
instead of typing a name). gputap's shipped code never imports or starts test code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gputap_common.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
DEMO_GITHUB_USERS = Path(__file__).with_name("demo-users.yaml")
STAND_IN_NOTICE = (
    "GitHub stand-in: this demo signs in through a simulated GitHub (tests/github_sim). "
    "Pick a test user there; no GitHub account is used."
)


def start_github_stand_in(host: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    """Start the stand-in with the demo users (its log to `log_path`); it and its URL."""
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
        # Bob maintains demo-uni:ml-staff (demo-users.yaml): the demo's instructor
        "GPUTAP__COURSES__INSTRUCTOR_TEAMS": ["demo-uni:ml-staff"],
        "GPUTAP__HUB__LOGIN_NOTICE": STAND_IN_NOTICE,
        # the demo's test users are all the person running it
        "GPUTAP__SPAWNER__ALLOW_SHARED_UNIX_USER": True,
    }
    # override values are read as YAML: JSON keeps "a: b" a string
    return {name: json.dumps(value) for name, value in values.items()}


def main() -> int:
    settings = load_settings()
    demo = [sys.executable, "-m", "hub_config.demo"]
    if settings.hub.get("github", {}).get("client_id"):
        print("GPUTAP_DEMO_GITHUB ignored: hub.github.client_id is set", file=sys.stderr)
        return subprocess.call(demo, cwd=ROOT)
    ip = settings.hub["ip"]
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    stand_in, url = start_github_stand_in(
        "127.0.0.1" if ip in ("", "0.0.0.0") else ip, settings.data_dir / "github-stand-in.log"
    )
    print(f"GitHub stand-in at {url} (users: {DEMO_GITHUB_USERS})", flush=True)
    demo_env = {**os.environ, **stand_in_environment(url)}
    try:
        return subprocess.call(demo, cwd=ROOT, env=demo_env)
    except KeyboardInterrupt:
        return 130
    finally:
        stand_in.terminate()
        stand_in.wait(10)


if __name__ == "__main__":
    sys.exit(main())
