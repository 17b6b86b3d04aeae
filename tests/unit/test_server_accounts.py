"""Who one-machine servers run as (spawner/local/accounts.py) and what they see of the machine's
folders (spawner/local/view.py)."""

import os
import pwd
import secrets
import stat
import subprocess
from pathlib import Path

import pytest

from gputap_common.settings import SettingsError
from hub_config.server_users import servers_run_as
from spawner.local import view
from spawner.local.accounts import (
    COMMENT,
    MAX_NAME,
    AccountError,
    account_name,
    own_account,
    server_user_mode,
)

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="accounts and mounts need root")
NOBODY = 65534


def test_an_account_is_the_users_name_after_gputap_where_that_is_a_valid_login():
    assert account_name("alice") == "gputap-alice"
    assert account_name("data-team_2") == "gputap-data-team_2"


def test_other_names_keep_their_valid_part_and_a_hash_so_two_users_never_share_one():
    names = ["Alice", "alice.b", "al@ce", "a" * 39, "a" * 39 + "b", "ünï"]
    made = [account_name(n) for n in names]
    assert len(set(made) | {account_name("alice")}) == len(names) + 1
    for name in made:
        assert len(name) <= MAX_NAME and name.startswith("gputap-")
        assert set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789_-")


def test_auto_is_an_account_per_user_under_root_and_the_hubs_own_user_otherwise():
    assert server_user_mode("auto", False, 0) == "per_user"
    assert server_user_mode("auto", False, 1000) == "hub"
    assert server_user_mode("hub", False, 0) == "hub"
    assert server_user_mode("auto", True, 0) == "system"


def test_per_user_without_root_is_refused_saying_what_to_do():
    with pytest.raises(AccountError, match="needs the hub to run as root.*server_user: hub"):
        server_user_mode("per_user", False, 1000)
    settings = {"backend": "local", "server_user": "per_user", "run_as_system_user": False}
    if os.geteuid() != 0:
        with pytest.raises(SettingsError, match="per_user"):
            servers_run_as(settings)
    assert servers_run_as({**settings, "backend": "kubernetes"}) == "hub"


@pytest.fixture
def unique_user():
    user = f"t{secrets.token_hex(4)}"
    yield user
    subprocess.run(["userdel", account_name(user)], capture_output=True)


@root_only
def test_the_first_start_makes_the_account_and_gives_it_the_home(tmp_path, unique_user):
    home = tmp_path / "homes" / unique_user
    account = own_account(unique_user, home)
    entry = pwd.getpwnam(account_name(unique_user))
    assert (account.uid, account.name) == (entry.pw_uid, entry.pw_name)
    assert account.uid != 0 and entry.pw_gecos == COMMENT.format(user=unique_user)
    assert entry.pw_passwd in ("x", "*", "!")  # no password in passwd itself
    info = home.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (account.uid, 0o700)
    assert stat.S_IMODE((tmp_path / "homes").stat().st_mode) == 0o700
    assert own_account(unique_user, home) == account  # the next start: the same


@root_only
def test_a_home_of_the_hubs_user_is_given_to_the_account_with_everything_in_it(
    tmp_path, unique_user
):
    home = tmp_path / unique_user
    (home / "work").mkdir(parents=True)
    (home / "work" / "notes.txt").write_text("mine")
    os.symlink("/etc/passwd", home / "link")
    account = own_account(unique_user, home)
    for path in (home, home / "work", home / "work" / "notes.txt"):
        assert path.stat().st_uid == account.uid
    assert os.lstat(home / "link").st_uid == account.uid
    assert Path("/etc/passwd").stat().st_uid == 0  # never through a link


@root_only
def test_an_account_of_that_name_gputap_did_not_make_is_never_taken_over(tmp_path, unique_user):
    name = account_name(unique_user)
    subprocess.run(["useradd", "--no-create-home", "--comment", "a person", name], check=True)
    with pytest.raises(AccountError, match=f"{name} exists and gputap did not make it"):
        own_account(unique_user, tmp_path / "home")
    assert not (tmp_path / "home").exists()


def test_the_plan_covers_the_highest_folder_the_account_cannot_pass(tmp_path):
    private = tmp_path / "private"
    (private / "checkout" / "data" / "homes" / "omar").mkdir(parents=True)
    private.chmod(0o700)
    (private / "checkout" / "data").chmod(0o700)
    outside = tmp_path / "open"
    outside.mkdir()
    outside.chmod(0o755)
    needed = [private / "checkout", private / "checkout" / "data" / "homes" / "omar", outside]
    plan = view.plan(needed, [], NOBODY, [NOBODY])
    # tmp_path's own parents may be closed too (pytest's are 0700): the covers here start
    # with the highest one
    folders = [c.folder for c in plan.covers]
    assert folders[-1] == private / "checkout" / "data"
    assert plan.covers[-1].keep == [private / "checkout" / "data" / "homes" / "omar"]
    assert not any(outside.is_relative_to(f) and outside != f for f in folders[1:])


def in_view(plan: view.Plan, code: str) -> subprocess.CompletedProcess:
    def preexec():
        view.enter(plan)
        os.setgid(NOBODY)
        os.setgroups([])
        os.setuid(NOBODY)

    return subprocess.run(
        ["python3", "-c", code], preexec_fn=preexec, capture_output=True, text=True, timeout=30
    )


@root_only
def test_the_view_holds_what_is_needed_and_nothing_else_and_shared_data_read_only(tmp_path):
    private = tmp_path / "private"
    (private / "checkout").mkdir(parents=True)
    (private / "checkout" / "code.py").write_text("code")
    (private / "secret").write_text("root's")
    private.chmod(0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "w.bin").write_text("weights")
    (shared / "w.bin").chmod(0o666)
    shared.chmod(0o777)
    tmp_path.chmod(0o755)
    plan = view.plan([private / "checkout"], [shared], NOBODY, [NOBODY])
    code = f"""
import ctypes, os
print(open({str(private / "checkout" / "code.py")!r}).read())
print(sorted(os.listdir({str(private)!r})))
weights, new = {str(shared / "w.bin")!r}, {str(shared / "n")!r}
for action in (lambda: open(weights, "a"), lambda: open(new, "w")):
    try:
        action()
        print("written")
    except OSError as e:
        print(e.errno)
libc = ctypes.CDLL(None, use_errno=True)
print("umount", libc.umount2({str(shared).encode()!r}, 0), ctypes.get_errno())
"""
    done = in_view(plan, code)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert lines[0] == "code"
    assert lines[1] == "['checkout']"  # root's secret is not in the view
    assert lines[2:4] == ["30", "30"]  # EROFS, whatever the modes say
    assert lines[4] == "umount -1 1"  # EPERM: the account cannot undo the view
    assert (shared / "w.bin").read_text() == "weights"
    # the machine's own namespace is untouched
    assert (private / "secret").read_text() == "root's"
    assert os.access(shared / "w.bin", os.W_OK)
