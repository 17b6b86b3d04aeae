"""Data disks on one machine: a folder ``{root}/{user}/{name}`` per disk (the user's part
named as homes are, :func:`spawner.core.dirnames.safe_dirname`), its record beside it in
``{root}/{user}/.{name}.json``. A local server has no mount namespace of its own, so the
spawner links each attached disk into the home at ``~/disks/{name}`` (:func:`link_disks`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from gputap_common import clock

from ..core.dirnames import safe_dirname
from ..core.disks import (
    HOME_FOLDER,
    Disk,
    DiskConflict,
    attached_conflict,
    check_name,
    check_new_disk,
    not_found,
)

T = TypeVar("T")


def used_bytes(folder: Path) -> int:
    """Bytes of the files under ``folder`` (links not followed). Blocking."""
    total = 0
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass  # removed while we counted
    return total


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(root: Path) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(str(root), threading.Lock())


class LocalDiskStore:
    """Disks as folders under ``root``: ``{root}/{user}/{name}`` and ``{root}/{user}/.{name}.json``.

    The coroutines run the file work in the default executor; the ``*_sync`` methods are the
    same work, blocking. Changes hold one lock per root, so a count and the creation that
    relies on it are one step."""

    def __init__(self, root: str | os.PathLike[str], max_size_gb: int = 100, max_disks: int = 5):
        self.root = Path(root).resolve()
        self.max_size_gb = max_size_gb
        self.max_disks = max_disks
        self._lock = _lock_for(self.root)

    # -- paths -----------------------------------------------------------------------------

    def user_dir(self, user: str) -> Path:
        return self.root / safe_dirname(user)

    def folder(self, user: str, name: str) -> Path:
        """Where the disk's files are."""
        return self.user_dir(user) / check_name(name)

    def _record_path(self, user: str, name: str) -> Path:
        return self.user_dir(user) / f".{check_name(name)}.json"

    # -- blocking work ---------------------------------------------------------------------

    def _read(self, path: Path) -> Disk:
        return Disk.from_json(json.loads(path.read_text()))

    def _write(self, user: str, disk: Disk) -> None:
        """Write the record atomically (a reader sees the old record or the new one)."""
        target = self._record_path(user, disk.name)
        record = {k: v for k, v in disk.to_json().items() if k != "used_bytes"}
        fd, tmp = tempfile.mkstemp(prefix=f".{disk.name}.", suffix=".tmp", dir=target.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def list_sync(self, user: str, usage: bool = False) -> list[Disk]:
        folder = self.user_dir(user)
        disks = []
        try:
            entries = sorted(folder.glob(".*.json"))
        except FileNotFoundError:
            return []
        for path in entries:
            try:
                disk = self._read(path)
            except FileNotFoundError:
                continue  # deleted while we listed
            if usage:
                disk = replace(disk, used_bytes=used_bytes(folder / disk.name))
            disks.append(disk)
        return sorted(disks, key=lambda d: d.name)

    def get_sync(self, user: str, name: str) -> Disk:
        try:
            check_name(name)
            return self._read(self._record_path(user, name))
        except (ValueError, FileNotFoundError):
            raise not_found(user, name) from None

    def create_sync(
        self, user: str, name: str, size_gb: int, billing_session_id: str | None = None
    ) -> Disk:
        with self._lock:
            size = check_new_disk(
                self.list_sync(user), name, size_gb, self.max_size_gb, self.max_disks
            )
            user_dir = self.user_dir(user)
            user_dir.mkdir(parents=True, exist_ok=True)
            os.chmod(user_dir, 0o711)  # servers of other users may not list the names
            folder = user_dir / name
            try:
                folder.mkdir(0o700)
            except FileExistsError:
                # a folder without a record (an interrupted delete): never reuse its files
                raise DiskConflict(
                    f"A folder named {name!r} is in the way on the hub's disk store; pick "
                    "another name, or ask an operator to look at it."
                ) from None
            disk = Disk(name, size, clock.utcnow(), None, billing_session_id, 0)
            try:
                self._write(user, disk)
            except BaseException:
                folder.rmdir()
                raise
            return disk

    def delete_sync(self, user: str, name: str) -> Disk:
        with self._lock:
            disk = self.get_sync(user, name)
            if disk.attached_to is not None:
                raise attached_conflict(disk)
            # the files first: if that fails half way, the record stays and the user may
            # ask again; a record never outlives nothing
            shutil.rmtree(self.user_dir(user) / name, ignore_errors=False)
            self._record_path(user, name).unlink()
            return disk

    def _set_attached(self, user: str, name: str, server: str | None) -> Disk:
        with self._lock:
            disk = replace(self.get_sync(user, name), attached_to=server)
            self._write(user, disk)
            return disk

    def attach_sync(self, user: str, name: str, server: str) -> Disk:
        return self._set_attached(user, name, server)

    def detach_sync(self, user: str, name: str) -> Disk:
        return self._set_attached(user, name, None)

    def attached_sync(self, user: str, server: str) -> list[Disk]:
        return [d for d in self.list_sync(user) if d.attached_to == server]

    # -- the store's coroutines --------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    async def list(self, user: str, usage: bool = True) -> list[Disk]:
        return await self._run(self.list_sync, user, usage)

    async def get(self, user: str, name: str) -> Disk:
        return await self._run(self.get_sync, user, name)

    async def create(
        self, user: str, name: str, size_gb: int, billing_session_id: str | None = None
    ) -> Disk:
        return await self._run(self.create_sync, user, name, size_gb, billing_session_id)

    async def delete(self, user: str, name: str) -> Disk:
        """Delete a detached disk and its files (DiskConflict while attached)."""
        return await self._run(self.delete_sync, user, name)

    async def attach(self, user: str, name: str, server: str) -> Disk:
        return await self._run(self.attach_sync, user, name, server)

    async def detach(self, user: str, name: str) -> Disk:
        return await self._run(self.detach_sync, user, name)

    async def attached(self, user: str, server: str) -> list[Disk]:
        return await self._run(self.attached_sync, user, server)


def link_disks(
    home: Path, root: Path, wanted: Mapping[str, Path], keep: Iterable[str] = ()
) -> list[str]:
    """Make ``{home}/disks/{name}`` a link to each wanted disk folder, and remove the links in
    ``{home}/disks`` that point into ``root`` but are neither wanted nor in ``keep`` (the
    disks the user's other servers mount: the home is shared). Anything else there (the
    user's own files, links elsewhere) is never touched. Blocking.

    Returns the names whose link could not be made (a file of the user's is in the way, or
    ``~/disks`` is not a folder of the home's own: a link there is never followed). Without
    disks, a home that has no ``disks`` folder gets none."""
    folder = home / HOME_FOLDER
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        return sorted(wanted)
    if not wanted and not folder.is_dir():
        return []  # no disks, never had any: no empty folder in the home
    folder.mkdir(parents=True, exist_ok=True)
    kept = set(keep)
    blocked = []
    for entry in folder.iterdir():
        if not entry.is_symlink():
            continue
        target = Path(os.readlink(entry))
        ours = target.is_absolute() and target.is_relative_to(root)
        if ours and wanted.get(entry.name) != target and entry.name not in kept:
            entry.unlink()
    for name, target in sorted(wanted.items()):
        link = folder / name
        if link.is_symlink() and Path(os.readlink(link)) == target:
            continue
        if link.exists() or link.is_symlink():
            blocked.append(name)
            continue
        link.symlink_to(target, target_is_directory=True)
    return blocked
