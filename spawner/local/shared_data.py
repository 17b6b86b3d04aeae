"""Shared data on one machine: each ``shared_data`` folder is linked into the home at its mount
path (/models: ``~/models``), as data disks are linked into ``~/disks``.

What keeps it read-only: servers of Unix accounts of their own (``spawner.server_user``
per_user, the default for a hub running as root, or system users) start in a mount namespace
of their own where each shared folder is bound read-only (view.py): no write gets through,
whatever its files' modes; the hub only checks at start-up that their accounts may read the
folder (:func:`folder_problem`). Servers run as the hub's own user: they are that user, and may
write wherever it may; the OS enforces nothing, which the hub says in its log at start-up
(docs/lab.md, "Shared data, read-only").
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.shared_data import home_link


def folder_problem(entry: Mapping[str, Any], where: str, other_users: bool) -> str | None:
    """What keeps ``entry``'s folder (setting ``where``) from being shared read-only, or None:
    missing, or (servers of ``other_users``) not readable by others. Blocking."""
    folder = Path(entry["folder"])
    if not folder.is_dir():
        return f"{where}.folder {folder} is not a folder on this machine; create it or fix the path"
    if not other_users:
        return None
    mode = folder.stat().st_mode
    wanted = stat.S_IROTH | stat.S_IXOTH
    if mode & wanted != wanted:
        return (
            f"{where}.folder {folder} is not readable by servers' users (mode "
            f"{stat.S_IMODE(mode):o}): chmod o+rx {folder}, and o+r on its files"
        )
    return None


def writable_by_hub(entry: Mapping[str, Any]) -> bool:
    """Whether the hub's own user (and so a server running as it) may write the folder."""
    return os.access(entry["folder"], os.W_OK)


def link_shared_data(home: Path, entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """Make ``{home}/{mount path}`` a link to each entry's folder (parents made as needed).
    Anything else at that place (the user's own file or folder, a link elsewhere) is never
    touched. Blocking; run as the server's user, or as the hub's for homes under homes_root.

    Returns the mount paths whose link could not be made."""
    try:
        home.mkdir(0o700, parents=True, exist_ok=True)
    except OSError:
        return [entry["mount_path"] for entry in entries]
    blocked = []
    for entry in entries:
        link = home / home_link(entry["mount_path"])
        target = Path(entry["folder"])
        try:
            if link.is_symlink() and Path(os.readlink(link)) == target:
                continue
            if link.is_symlink() or link.exists():
                blocked.append(entry["mount_path"])
                continue
            parent = link.parent
            parent.mkdir(parents=True, exist_ok=True)
            if parent.resolve() != (home.resolve() / home_link(entry["mount_path"])).parent:
                blocked.append(entry["mount_path"])  # a link on the way: never followed
                continue
            link.symlink_to(target, target_is_directory=True)
        except OSError:
            blocked.append(entry["mount_path"])
    return blocked
