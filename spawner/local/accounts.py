"""Who a server runs as on one machine: the Unix account of each user's servers.

``spawner.server_user`` chooses (docs/security.md, "Servers' Unix users"):

- ``per_user``: an account gputap keeps for each user, ``gputap-<name>``, made with ``useradd``
  at the user's first start (no password, no login; its home is the user's home under
  ``homes_root``, given to it). Needs a hub running as root.
- ``hub``: the hub's own Unix user (a single-owner workstation, a hub run as an ordinary user).
- ``auto`` (the default): ``per_user`` when the hub runs as root, else ``hub``. So a server
  never runs as root unless an operator writes ``hub`` and runs the hub as root.

``spawner.run_as_system_user`` (existing system accounts of the same name) comes before all.

Only the standard library: the server pool's process (forkserver.py), which runs in a server
environment's Python, uses :class:`Account` too.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CHOICES = ("auto", "per_user", "hub")
PREFIX = "gputap-"
#: the longest login useradd takes on Linux (UT_NAMESIZE)
MAX_NAME = 32
#: the comment every account gputap makes carries: an account of that name without it is
#: a person's, never taken over
COMMENT = "gputap servers of {user}"
#: useradd's exit status when /etc/passwd is locked by another change
PASSWD_BUSY = 10
_lock = threading.Lock()


class AccountError(RuntimeError):
    """The server's account cannot be made or used; the message says what to do."""


def server_user_mode(setting: str, run_as_system_user: bool, euid: int) -> str:
    """What servers run as: "system", "per_user" or "hub". AccountError for a choice the
    hub's own user cannot carry out."""
    if run_as_system_user:
        return "system"
    if setting not in CHOICES:
        raise AccountError(f"spawner.server_user must be one of {', '.join(CHOICES)}")
    if setting == "auto":
        return "per_user" if euid == 0 else "hub"
    if setting == "per_user" and euid != 0:
        raise AccountError(
            "spawner.server_user: per_user makes a Unix account per user, which needs the hub "
            "to run as root; run it as root, or set spawner.server_user: hub (servers then run "
            "as the hub's own user)"
        )
    return setting


def account_name(user: str) -> str:
    """The login of ``user``'s servers: ``gputap-`` and the name where it is a valid login,
    else its valid part and a hash, so different users never share an account."""
    cleaned = re.sub(r"[^a-z0-9_-]", "-", user.lower())
    name = PREFIX + cleaned
    if cleaned == user and len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(user.encode()).hexdigest()[:8]
    return f"{PREFIX}{cleaned[: MAX_NAME - len(PREFIX) - 9]}-{digest}"


@dataclass(frozen=True)
class Account:
    """A Unix account a server runs as, and the home it starts in."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: Path

    def become(self) -> None:
        """In the server's process, after fork: take the account's groups and uid for good
        (no way back to the hub's), and start in its home."""
        os.setgid(self.gid)
        os.setgroups(list(self.groups))
        os.setuid(self.uid)
        if os.getuid() != self.uid or os.geteuid() != self.uid:
            raise OSError("the server's process is still the hub's user")
        os.chdir(self.home)

    def env(self) -> dict[str, str]:
        return {"USER": self.name, "LOGNAME": self.name, "HOME": str(self.home)}

    def to_json(self) -> dict:
        return {**self.__dict__, "groups": list(self.groups), "home": str(self.home)}

    @classmethod
    def from_json(cls, data: dict) -> Account:
        groups = tuple(data["groups"])
        return cls(data["name"], data["uid"], data["gid"], groups, Path(data["home"]))


def system_account(user: str) -> Account:
    """The existing system account named ``user`` (spawner.run_as_system_user)."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise AccountError(
            f"there is no Unix account {user!r} on this machine, and servers run as system "
            "users (spawner.run_as_system_user): make the account, or turn that off"
        ) from None
    return _from_entry(entry, Path(entry.pw_dir))


def own_account(user: str, home: Path) -> Account:
    """``user``'s servers' account, made at the first start, with ``home`` made and given to
    it (its files too, once, when the home belongs to someone else: homes of servers that ran
    as the hub's user). Blocking; needs root."""
    name = account_name(user)
    with _lock:
        entry = _entry(name)
        if entry is None:
            _useradd(name, user, home)
            entry = _entry(name)
        if entry is None:
            raise AccountError(f"useradd made no account {name}")
    if entry.pw_gecos != COMMENT.format(user=user):
        raise AccountError(
            f"the Unix account {name} exists and gputap did not make it for {user}: rename "
            "or remove it, or set spawner.server_user: hub"
        )
    give_home(home, entry.pw_uid, entry.pw_gid)
    return _from_entry(entry, home)


def give_home(home: Path, uid: int, gid: int) -> None:
    """Make ``home`` (0700) and give it to ``uid``; when it belonged to another uid, give
    every file in it too (never through a link). An unchanged owner costs one stat, as
    Kubernetes' ``fsGroupChangePolicy: OnRootMismatch``. The folder of homes stays the hub's
    alone: a server reaches its own home through its view (view.py)."""
    home.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    home.mkdir(mode=0o700, exist_ok=True)
    info = home.lstat()
    if info.st_uid == uid and info.st_gid == gid:
        return
    for folder, dirs, files in os.walk(home):
        for entry in (*dirs, *files):
            os.chown(os.path.join(folder, entry), uid, gid, follow_symlinks=False)
    os.chown(home, uid, gid, follow_symlinks=False)
    os.chmod(home, 0o700)


def _entry(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def _useradd(name: str, user: str, home: Path) -> None:
    command = [
        "useradd",
        "--no-create-home",
        "--no-log-init",
        "--user-group",
        "--home-dir",
        str(home),
        "--shell",
        "/bin/bash",
        "--comment",
        COMMENT.format(user=user),
        name,
    ]
    for _ in range(20):
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        except FileNotFoundError:
            raise AccountError(
                "useradd is missing (Debian's passwd package): install it, or set "
                "spawner.server_user: hub"
            ) from None
        if done.returncode != PASSWD_BUSY:
            break
        time.sleep(0.2)  # another program is changing /etc/passwd
    if done.returncode not in (0, 9):  # 9: made meanwhile by another hub
        raise AccountError(f"useradd {name} failed: {done.stderr.strip()[:300]}")


def _from_entry(entry: pwd.struct_passwd, home: Path) -> Account:
    groups = os.getgrouplist(entry.pw_name, entry.pw_gid)
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, tuple(groups), home)
