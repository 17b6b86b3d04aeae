"""A user's home and data disks moved to another username on one machine (an account move,
spawner/lifecycle/moving.py): each is one folder, ``{homes_root}/{user}`` and
``{disk_root}/{user}`` (named by :func:`~spawner.core.dirnames.safe_dirname`), so a move is
one ``rename`` each, within the same folder: nothing is copied, nothing half-moved.

The new name's folders must hold nothing: an empty one is removed to make room; files, or a
disk record, refuse the move before anything moves. Links in the home (``~/disks/NAME``) name
the old disk folder until the next server starts, which links the disks again
(:func:`~spawner.local.disks.link_disks`).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.dirnames import safe_dirname
from ..lifecycle.moving import MoveRefused
from .disks import LocalDiskStore

#: (from, to) folder renames, in the order they were made
Renames = list[tuple[Path, Path]]


def _room(folder: Path, what: str) -> bool:
    """Whether ``folder`` is there (and empty: it is removed when the move is made);
    MoveRefused when it holds anything."""
    if not folder.exists() and not folder.is_symlink():
        return False
    if folder.is_symlink() or not folder.is_dir() or any(folder.iterdir()):
        raise MoveRefused(
            f"{what} {folder} is not empty: move or remove what is there first (nothing was moved)"
        )
    return True


def plan(homes_root: Path, disks: LocalDiskStore, old: str, new: str) -> Renames:
    """The renames that move ``old``'s home and disks to ``new``'s names; MoveRefused when
    ``new`` has disks or files there. Blocking."""
    taken = disks.list_sync(new)
    if taken:
        names = ", ".join(d.name for d in taken)
        raise MoveRefused(
            f"{new} already has data disks ({names}): delete them, or move their files into "
            f"{old}'s disks, first (nothing was moved)"
        )
    renames = []
    pairs = (
        (homes_root / safe_dirname(old), homes_root / safe_dirname(new), f"{new}'s home"),
        (disks.user_dir(old), disks.user_dir(new), f"{new}'s disk folder"),
    )
    for source, target, what in pairs:
        _room(target, what)
        if source.is_dir() and not source.is_symlink():
            renames.append((source, target))
    return renames


def apply(renames: Renames) -> Renames:
    """Make the renames; on any failure, undo those made and raise. Blocking."""
    done: Renames = []
    try:
        for source, target in renames:
            if target.is_dir():
                target.rmdir()  # empty (plan checked): room for the moved folder
            os.rename(source, target)
            done.append((source, target))
    except BaseException:
        undo(done)
        raise
    return done


def undo(done: Renames) -> None:
    """Move back what :func:`apply` moved, last first. Blocking."""
    for source, target in reversed(done):
        os.rename(target, source)
