"""`make demo`: start gputap on this machine with its embedded defaults and print the URL.

Runs JupyterHub with hub_config/jupyterhub_config.py (which starts the proxy and the billing
service), waits until it answers, then prints where to go. Ctrl-C stops everything; homes,
billing records and running servers' state stay in the data directory (.demo by default).

The login is GitHub when ``hub.github`` is configured, else the development login. (``make
demo`` with ``GPUTAP_DEMO_GITHUB=1`` runs a development tool, tests/github_sim/demo.py, which
starts the tests' stand-in of GitHub and then this, configured to log in through it.)
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

from gputap_common.settings import Settings, load_settings

from .environments import demo_environments
from .hub import DEV_LOGIN_NOTICE, ROOT
from .origins import subdomain_host
from .server_users import servers_run_as
from .with_hub import with_hub

#: who the demo makes admin and instructor when nobody is (the development login only)
DEMO_ADMIN = "admin"
DEMO_INSTRUCTOR = "teacher"


def role_environment(settings: Settings) -> dict[str, str]:
    """Settings overrides naming the demo's admin and instructor, so one person can play
    every role. Only with the development login (any name signs in, nothing is at stake)
    and only for roles the settings leave empty: roles an operator named are theirs."""
    if settings.hub["github"]["client_id"]:
        return {}
    values: dict[str, list[str]] = {}
    if not settings.hub["admin_users"]:
        values["GPUTAP__HUB__ADMIN_USERS"] = [DEMO_ADMIN]
    if not settings.courses["instructors"] and not settings.courses["instructor_teams"]:
        values["GPUTAP__COURSES__INSTRUCTORS"] = [DEMO_INSTRUCTOR]
    # override values are read as YAML: JSON keeps them lists of strings
    return {name: json.dumps(value) for name, value in values.items()}


def _who(users: list[str], teams: list[str]) -> str:
    parts = [f"sign in as {', '.join(users)}"] if users else []
    parts += [f"a member of {', '.join(teams)}"] if teams else []
    return " or ".join(parts) or "nobody (set it in the settings)"


def roles_text(settings: Settings) -> str:
    """How to play each role, as the demo prints it at start."""
    hub, courses = settings.hub, settings.courses
    admin = _who(hub["admin_users"], hub["github"]["admin_teams"])
    instructor = _who(courses["instructors"], courses["instructor_teams"])
    return (
        f"  Roles: admin: {admin} (hub admin page, every billing account)\n"
        f"         instructor: {instructor} (Courses: create one, see its roster)\n"
        "         student: anyone else who signs in (trial credit; join a course by its code)\n"
    )


def environments_text(settings: Settings) -> str:
    """The environments the spawn form offers, as the demo prints them at start."""
    names = [f"{entry['name']} ({key})" for key, entry in settings.environments.items()]
    return f"  Environments: {'; '.join(names)}\n"


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


def servers_text(settings: Settings) -> str:
    """Who the servers run as (docs/security.md, "Servers' Unix users")."""
    mode = servers_run_as(settings.spawner)
    if mode == "per_user":
        return "an account of each user's own (gputap-NAME), never root"
    if mode == "system":
        return "the system account of each user's name"
    if os.geteuid() == 0:
        return "root, the hub's own user (spawner.server_user: hub): every user is trusted"
    return "the hub's own Unix user (yours)"


def main() -> int:
    given = load_settings()
    # the demo's admin and instructor, and the data-science environment `make setup` built
    roles = {**role_environment(given), **demo_environments(given.environments)}
    settings = load_settings(environ={**os.environ, **roles})
    hub = settings.hub
    base = "/" + hub["base_url"].strip("/")
    base = base.rstrip("/") + "/"
    host = "127.0.0.1" if hub["ip"] in ("", "0.0.0.0") else hub["ip"]
    # with servers on users' subdomains the hub is theirs' parent host (hub_config/origins.py)
    url = (subdomain_host(hub) or f"http://{host}:{hub['port']}") + base
    os.umask(0o077)  # the data directory and its log are the hub's user's (docs/security.md)
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    log_path = settings.data_dir / "jupyterhub.log"
    config = ROOT / "hub_config" / "jupyterhub_config.py"
    # the hub runs in the data directory: give it that directory as an absolute path
    env = {**os.environ, **roles, "GPUTAP__DATA_DIR": str(settings.data_dir)}
    github = hub["github"]
    login = DEV_LOGIN_NOTICE
    if github["client_id"]:
        where = github["url"] or "github.com"
        login = f"{github['login_service']} ({where}) {hub['login_notice']}".strip()
    print(f"Starting gputap (logs: {log_path}) ...", flush=True)
    with open(log_path, "ab") as log:
        # the hub ends with the demo, however the demo ends (it then stops what it started)
        proc = subprocess.Popen(
            [*with_hub(), sys.executable, "-m", "jupyterhub", "-f", str(config)],
            cwd=settings.data_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    # Ctrl-C ends the demo even where it started with SIGINT ignored (a script's background
    # job): Python raises KeyboardInterrupt only for a SIGINT it found not ignored
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if not wait_healthy(url + "hub/health", proc):
            print(f"gputap did not start; see {log_path}", file=sys.stderr)
            proc.terminate()
            return 1
        print(
            f"\n  gputap is running: open {url}\n"
            f"  Login: {login}\n"
            f"{roles_text(settings)}"
            f"{environments_text(settings)}"
            f"  Billing page: {url}services/billing/\n"
            f"  Data (homes, databases): {Path(settings.data_dir)}\n"
            f"  Servers run as: {servers_text(settings)}\n"
            "  Press Ctrl-C to stop.\n",
            flush=True,
        )
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
