"""What a server's processes see of the machine's folders, when the hub runs as root.

Each server of a Unix account of its own starts in a mount namespace of its own, set up in
its process before it becomes that account (docs/security.md, "Servers' Unix users"):

- **Folders it needs behind folders it may not enter.** A checkout under ``/root`` (0700), a
  test's ``/tmp/pytest-of-root`` (0700): the account could not reach its own environment or
  home. The highest such folder is covered, in this namespace only, by an empty tmpfs holding
  just the paths the server needs, bound from where they are. The server sees nothing else
  of it; nobody's permissions change.
- **Shared data read-only in fact.** Each shared folder is bound onto itself read-only: no
  write gets through, whatever its files' modes, and the server's account cannot mount.

The plan is made in the hub (it reads modes); :func:`enter` carries it out in the forked
process, with only system calls.
"""

from __future__ import annotations

import ctypes
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

CLONE_NEWNS = 0x00020000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18


@dataclass
class Cover:
    """A folder the account cannot pass, replaced by a tmpfs holding ``keep`` (bound)."""

    folder: Path
    keep: list[Path] = field(default_factory=list)


@dataclass
class Plan:
    covers: list[Cover]
    read_only: list[Path]

    def to_json(self) -> dict:
        return {
            "covers": [[str(c.folder), [str(k) for k in c.keep]] for c in self.covers],
            "read_only": [str(p) for p in self.read_only],
        }

    @classmethod
    def from_json(cls, data: dict) -> Plan:
        covers = [Cover(Path(f), [Path(k) for k in keep]) for f, keep in data["covers"]]
        return cls(covers, [Path(p) for p in data["read_only"]])


def passable(path: Path, uid: int, groups: Iterable[int]) -> bool:
    """Whether ``uid`` (in ``groups``) may enter the folder ``path``."""
    info = path.stat()
    if uid == info.st_uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid in groups:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def plan(
    needed: Iterable[Path], read_only: Iterable[Path], uid: int, groups: Iterable[int]
) -> Plan:
    """The covers that let ``uid`` reach every path of ``needed`` (and ``read_only``), and the
    folders to bind read-only. Paths that do not exist are left out."""
    groups = tuple(groups)
    read_only = [Path(os.path.abspath(p)) for p in read_only if os.path.isdir(p)]
    wanted = {Path(os.path.abspath(p)) for p in needed if os.path.exists(p)} | set(read_only)
    covers: dict[Path, Cover] = {}
    for path in sorted(wanted):  # a folder before what is inside it
        _reach(path, covers, uid, groups)
    # a cover inside a path another cover keeps is made after it, on what that one bound
    return Plan(sorted(covers.values(), key=lambda c: len(c.folder.parts)), read_only)


def _reach(path: Path, covers: dict[Path, Cover], uid: int, groups: tuple[int, ...]) -> None:
    """Add what it takes for ``uid`` to reach ``path`` to ``covers``."""
    parents = list(reversed(path.parents))[1:]  # below "/", down to path's own folder
    i = 0
    while i < len(parents):
        part = parents[i]
        cover = covers.get(part)
        if cover is not None:  # a tmpfs here: only what it keeps is below it
            kept = next((k for k in cover.keep if path.is_relative_to(k)), None)
            if kept is None:
                cover.keep.append(path)
                return
            if kept == path:
                return
            i = len(kept.parts) - 2  # on from the kept path itself (real folders again)
            continue
        if not passable(part, uid, groups):
            covers[part] = Cover(part, [path])
            return
        i += 1


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None):
    libc = ctypes.CDLL(None, use_errno=True)
    enc = [None if s is None else s.encode() for s in (source, target, fstype, data)]
    if libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target}: {os.strerror(errno)}")


def enter(the_plan: Plan) -> None:
    """In the forked server process, still root: a mount namespace of its own, as planned."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare(CLONE_NEWNS): {os.strerror(errno)}")
    # nothing mounted here reaches the machine's namespace
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    umask = os.umask(0o022)  # the hub's 0077 would make the tmpfs' folders root's alone
    try:
        _cover_and_bind(the_plan)
    finally:
        os.umask(umask)


def _cover_and_bind(the_plan: Plan) -> None:
    for cover in the_plan.covers:
        handles = [os.open(kept, os.O_PATH) for kept in cover.keep]
        try:
            _mount("tmpfs", str(cover.folder), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")
            for kept, handle in zip(cover.keep, handles, strict=True):
                target = str(kept)
                if os.path.isdir(f"/proc/self/fd/{handle}"):
                    os.makedirs(target, 0o755, exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
                    open(target, "a").close()
                _mount(f"/proc/self/fd/{handle}", target, None, MS_BIND | MS_REC, None)
        finally:
            for handle in handles:
                os.close(handle)
    for folder in the_plan.read_only:
        _mount(str(folder), str(folder), None, MS_BIND | MS_REC, None)
        _mount(None, str(folder), None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID, None)
