"""Servers on one machine run as an unprivileged Unix account of their user by default: with the
hub as root (the demo's case, and this test's), each user's server is ``gputap-<name>``, never
root, and a kernel can write neither the shared data, the hub's own files (inventory, fault
book, databases, secrets), another user's home, nor read another user's processes' tokens.

Every test here failed on the main branch of issue 27, where the servers ran as the hub's user."""

import json
import os
import pwd
import stat
from pathlib import Path

import pytest

from spawner.local.spawner import DEFAULT_INVENTORY_FILE
from tests.kernel import Kernel
from tests.platform import Platform

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="accounts of their own need root")

CPU = {"kind": "cpu"}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models")
    (folder / "weights.bin").write_text("weights")
    # writable by anyone: only the server's read-only view keeps it unchanged
    (folder / "weights.bin").chmod(0o666)
    folder.chmod(0o777)
    return folder


@pytest.fixture(scope="module")
def platform(tmp_path_factory, models):
    shared = [{"name": "hf", "mount_path": "/models", "kind": "models", "folder": str(models)}]
    # the settings' defaults: spawner.server_user auto
    p = Platform(tmp_path_factory.mktemp("accounts"), extra={"shared_data": shared})
    p.start()
    for name in ("omar", "nina"):
        p.create_user(name)
        assert p.spawn(name, CPU).status_code in (201, 202)
    for name in ("omar", "nina"):
        p.wait_ready(name)
    yield p
    p.shutdown()


def uid_of(pid: int) -> int:
    return os.stat(f"/proc/{pid}").st_uid


def test_each_users_server_runs_as_an_account_of_its_own_never_root(platform):
    accounts = {}
    for name in ("omar", "nina"):
        pid = platform.server(name)["state"]["pid"]
        entry = pwd.getpwnam(f"gputap-{name}")
        assert uid_of(pid) == entry.pw_uid != 0
        env = platform.server_env(name)
        assert env["USER"] == f"gputap-{name}"
        home = Path(env["HOME"])
        info = home.stat()
        assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (entry.pw_uid, 0o700)
        accounts[name] = entry.pw_uid
    assert accounts["omar"] != accounts["nina"]


def run(platform, name: str, code: str) -> str:
    result = Kernel(platform.url, name, platform.user_token(name)).run(code)
    assert result.status == "ok", result.error
    return result.text


TRY = """
import json, os
def attempt(what, action):
    try:
        action()
        return "done"
    except OSError as e:
        return type(e).__name__ + ":" + str(e.errno)
def write(path):
    return lambda: open(path, "a").write("x")
def read(path):
    return lambda: open(path, "rb").read()
"""


def test_a_kernel_can_write_nothing_the_hub_or_another_user_owns(platform, models):
    data = platform.root / "data"
    nina = platform.server("nina")["state"]["pid"]
    nina_home = platform.server_env("nina")["HOME"]
    targets = {
        "shared model": ("write", str(models / "weights.bin")),
        "new shared file": ("write", str(models / "new.bin")),
        "inventory": ("write", str(DEFAULT_INVENTORY_FILE)),
        "fault book": ("write", str(data / "gpu-health.json")),
        "hub database": ("read", str(data / "jupyterhub.sqlite")),
        "cookie secret": ("read", str(data / "jupyterhub_cookie_secret")),
        "nina's home": ("write", f"{nina_home}/planted.py"),
        "nina's server environment": ("read", f"/proc/{nina}/environ"),
    }
    code = (
        TRY
        + f"targets = {json.dumps(targets)}\n"
        + (
            "print(json.dumps({k: attempt(k, globals()[how](path)) for k, (how, path) in "
            "targets.items()}))"
        )
    )
    outcome = json.loads(run(platform, "omar", code))
    assert all(result != "done" for result in outcome.values()), outcome
    assert outcome["shared model"] == "OSError:30"  # EROFS: the view is read-only
    assert (models / "weights.bin").read_text() == "weights"
    assert not (models / "new.bin").exists()
    assert not Path(nina_home, "planted.py").exists()
    # what the server needs it has: its own home, and the shared model through ~/models
    mine = run(platform, "omar", "print(open('models/weights.bin').read()); open('x', 'w').close()")
    assert mine.strip() == "weights"


def test_nothing_of_the_hubs_folders_but_what_the_server_needs_is_in_its_view(platform):
    # the test's own folder (0700, root's) is covered: only the server's own home is in it
    listing = run(
        platform,
        "omar",
        f"import os; print(sorted(os.listdir({str(platform.root / 'data' / 'homes')!r})))",
    )
    assert listing.strip() == "['omar']"
    assert "read-only only by agreement" not in platform.log_path.read_text()
