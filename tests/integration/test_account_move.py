"""An admin moves a renamed user's account to their new name (docs/github.md, "Renamed logins:
moving an account"): the hub user, the billing account with all its history and the files
follow; refused by name while anything is in the way; a failure midway moves nothing."""

from pathlib import Path

import pytest
import requests

from gputap_common.settings import load_settings
from spawner.core.dirnames import safe_dirname
from tests.disks_client import Disks
from tests.github_sim.client import sign_in
from tests.platform import Platform

CPU = {"kind": "cpu"}
TRIAL = 10_000_000


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    # billing runs on its own, so a test can take it away in the middle of a move
    # a disk so cheap that its open storage session takes no micro-credit while a test
    # looks twice: the money a move keeps is compared exactly
    prices = {**load_settings(environ={}).billing["prices"], "disk": "0.000001"}
    p = Platform(
        tmp_path_factory.mktemp("move"),
        extra={"billing": {"prices": prices}},
        external_billing=True,
    )
    p.start()
    yield p
    p.shutdown()


def move(platform: Platform, old: str, body, token: str | None = None) -> requests.Response:
    headers = {"Authorization": f"token {token}"} if token else {}
    return (requests if token else platform.api).post(
        f"{platform.url}/hub/gputap/api/admin/users/{old}/move",
        json=body,
        headers=headers,
        timeout=60,
    )


def home(platform: Platform, user: str) -> Path:
    return platform.root / "data" / "homes" / safe_dirname(user)


def disks_of(platform: Platform, user: str) -> Path:
    return platform.root / "data" / "disks" / safe_dirname(user)


def files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (links not followed) with its bytes."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


#: what a session is, less what moves with the clock while it runs
SESSION_KEYS = ("id", "server_name", "sku", "count", "price_per_hour_micro", "started_at")
SESSION_KEYS += ("ended_at", "charged_micro", "course", "price_book_version", "state")


def billing_history(platform: Platform, user: str):
    """Balance, ledger and sessions, the username aside."""
    account = platform.account(user)
    transactions = platform.billing(f"api/accounts/{user}/transactions").json()["transactions"]
    return (
        account["balance_micro"],
        [(t["id"], t["kind"], t["amount_micro"], t["memo"]) for t in transactions],
        [{key: s[key] for key in SESSION_KEYS} for s in platform.sessions(user)],
    )


def used_account(platform: Platform, name: str) -> str:
    """A user with a server run, paid credit, a file in the home and a data disk with a
    file, linked into the home; returns their API token."""
    platform.create_user(name)
    token = platform.user_token(name)
    disks = Disks(platform, token)
    assert disks.create(name, {"name": "data", "size_gb": 1}).status_code == 201
    assert disks.attach(name, "data", "").status_code == 202  # mounted at its next start
    r = platform.spawn(name, CPU)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready(name)
    (home(platform, name) / "notes.txt").write_text(f"{name}'s notes\n")
    (disks_of(platform, name) / "data" / "weights.bin").write_bytes(bytes(range(256)) * 64)
    platform.stop_server(name)
    platform.adjust(name, "5.00")
    return token


def test_an_admin_moves_a_renamed_users_account_whole(platform):
    token = used_account(platform, "jo")
    platform.login("jo-new")  # the new login's first sign-in: an empty user with a trial
    assert platform.account("jo-new")["balance_micro"] == TRIAL
    before = billing_history(platform, "jo")
    home_before, disk_before = files(home(platform, "jo")), files(disks_of(platform, "jo"))
    assert "notes.txt" in home_before and "data/weights.bin" in disk_before

    refused = move(platform, "jo", {"to": "jo-new"}, token=token)  # jo is no admin
    assert refused.status_code == 403 and "admin:users" in refused.json()["message"]

    r = move(platform, "jo", {"to": "jo-new"})
    assert r.status_code == 200, f"{r.text}\n{platform.log_tail()}"
    assert r.json() == {
        "from": "jo",
        "to": "jo-new",
        "balance": platform.account("jo-new")["balance"],
        "discarded_trial_micro": TRIAL,
        "replaced_user": True,
    }
    # the hub user: renamed, its token follows; the old name is free
    assert platform.get("/users/jo").status_code == 404
    me = requests.get(
        f"{platform.url}/hub/api/user", headers={"Authorization": f"token {token}"}, timeout=30
    )
    assert me.json()["name"] == "jo-new"
    # billing: the same money, ledger and sessions; the new login's trial was not added
    assert platform.billing("api/accounts/jo").status_code == 404
    assert billing_history(platform, "jo-new") == before
    # the files: the same bytes under the new name, nothing left under the old
    assert files(home(platform, "jo-new")) == home_before
    assert files(disks_of(platform, "jo-new")) == disk_before
    assert not home(platform, "jo").exists() and not disks_of(platform, "jo").exists()
    assert Disks(platform, token).names("jo-new") == {"data": ""}

    # the next server finds the disk in its home again
    r = platform.spawn("jo-new", CPU)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("jo-new")
    link = home(platform, "jo-new") / "disks" / "data"
    assert link.resolve() == (disks_of(platform, "jo-new") / "data").resolve()
    assert (link / "weights.bin").read_bytes() == disk_before["data/weights.bin"]
    platform.stop_server("jo-new")


def test_a_move_is_refused_by_name_while_anything_is_in_the_way(platform):
    assert move(platform, "nobody", {"to": "x"}).status_code == 404
    platform.create_user("kit")
    r = move(platform, "kit", {})
    assert r.status_code == 400 and "Field 'to' is required" in r.json()["message"]
    assert move(platform, "kit", {"to": "kit"}).status_code == 400

    r = platform.spawn("kit", CPU)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("kit")
    r = move(platform, "kit", {"to": "kit-new"})
    assert r.status_code == 409
    assert r.json()["message"] == "Stop these servers first, then move: kit (nothing was moved)"
    platform.stop_server("kit")
    # a new name nobody signed in with yet: a rename, with nothing to replace
    r = move(platform, "kit", {"to": "kit.b"})
    assert r.status_code == 200, r.text
    assert r.json()["replaced_user"] is False and r.json()["discarded_trial_micro"] is None
    assert platform.get("/users/kit.b").json()["name"] == "kit.b"
    assert home(platform, "kit.b").is_dir() and not home(platform, "kit").exists()

    used_account(platform, "lee")
    platform.login("lee-new")
    platform.adjust("lee-new", "1.50")  # the new user holds credit of their own
    before = files(home(platform, "lee")), billing_history(platform, "lee")
    r = move(platform, "lee", {"to": "lee-new"})
    assert r.status_code == 409, r.text
    assert r.json()["message"].startswith("lee-new already holds paid credit 1.50")
    assert r.json()["message"].endswith("(nothing was moved)")
    assert (files(home(platform, "lee")), billing_history(platform, "lee")) == before
    assert not home(platform, "lee-new").exists()
    assert platform.get("/users/lee-new").status_code == 200

    # a file in the new user's home: refused before anything moves
    home(platform, "lee-new").mkdir(parents=True)
    (home(platform, "lee-new") / "mine.txt").write_text("x")
    r = move(platform, "lee", {"to": "lee-new"})
    assert r.status_code == 409 and "lee-new's home" in r.json()["message"]
    assert files(home(platform, "lee")) == before[0]


def test_billing_failing_midway_moves_nothing(platform):
    token = used_account(platform, "max")
    platform.login("max-new")
    before = files(home(platform, "max")), files(disks_of(platform, "max"))
    history = billing_history(platform, "max")

    platform.stop_billing()
    try:
        r = move(platform, "max", {"to": "max-new"})
    finally:
        platform.start_billing()
    assert r.status_code == 503, r.text
    assert "Billing is unreachable" in r.json()["message"]
    assert "nothing was moved" in r.json()["message"]
    # the files had moved, and were moved back; both users stay as they were
    assert (files(home(platform, "max")), files(disks_of(platform, "max"))) == before
    assert not home(platform, "max-new").exists() and not disks_of(platform, "max-new").exists()
    assert billing_history(platform, "max") == history
    assert platform.account("max-new")["balance_micro"] == TRIAL
    assert platform.get("/users/max").status_code == 200
    assert platform.get("/users/max-new").status_code == 200
    r = platform.spawn("max", CPU)  # and the old account works as before
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("max")
    platform.stop_server("max")

    history = billing_history(platform, "max")
    r = move(platform, "max", {"to": "max-new"})  # once billing is back, the move goes
    assert r.status_code == 200, r.text
    assert billing_history(platform, "max-new") == history
    me = requests.get(
        f"{platform.url}/hub/api/user", headers={"Authorization": f"token {token}"}, timeout=30
    )
    assert me.json()["name"] == "max-new"


def test_a_renamed_github_login_lands_in_the_moved_account(github_hub, github):
    hub = github_hub
    github.add_user("ren")
    assert sign_in(requests.Session(), f"{hub.url}/hub/oauth_login", "ren").status_code == 200
    hub.adjust("ren", "7.00")
    github_id = hub.reader.get(f"{hub.url}/hub/api/users/ren", timeout=30).json()["auth_state"][
        "github_user"
    ]["id"]

    github.rename_user("ren", "ren-2")  # GitHub frees the old login
    r = sign_in(requests.Session(), f"{hub.url}/hub/oauth_login", "ren-2")
    assert r.status_code == 200, r.text  # a new, empty user with a trial
    assert hub.account("ren-2")["balance_micro"] == TRIAL

    r = move(hub, "ren", {"to": "ren-2"})
    assert r.status_code == 200, f"{r.text}\n{hub.log_tail()}"

    session = requests.Session()
    r = sign_in(session, f"{hub.url}/hub/oauth_login", "ren-2")
    assert r.status_code == 200, r.text
    assert hub.account("ren-2")["balance_micro"] == TRIAL + 7_000_000  # the old account
    user = hub.reader.get(f"{hub.url}/hub/api/users/ren-2", timeout=30).json()
    assert user["auth_state"]["github_user"]["id"] == github_id
    assert user["auth_state"]["github_user"]["login"] == "ren-2"

    github.add_user("ren")  # someone else takes the free login: an account of their own
    r = sign_in(requests.Session(), f"{hub.url}/hub/oauth_login", "ren")
    assert r.status_code == 200, r.text
    assert hub.account("ren")["balance_micro"] == TRIAL
