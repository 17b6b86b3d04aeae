"""Data disks, pure: what a disk is, the rules of names and sizes, what every store answers.

A disk belongs to one user and is attached to at most one of their servers; a server mounts
the disks attached to it when it starts. A disk is deleted only when its user asks and it is
detached: no store deletes data otherwise.

Every store (``LocalDiskStore`` in spawner/local/disks.py, ``KubeDiskStore`` in
spawner/kube/disks.py) answers the coroutines of :class:`DiskStore`. Refusals are
:class:`DiskError` subclasses whose message is written for the user; bad names and sizes are
``ValueError``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

#: the folder of a server's home where attached disks appear (one link per disk)
HOME_FOLDER = "disks"
NAME_MAX = 32
_NAME_RE = re.compile(r"[a-z][a-z0-9-]*")
NAME_RULE = (
    f"1 to {NAME_MAX} lowercase letters, digits and single hyphens, starting with a letter "
    "and not ending with a hyphen, e.g. 'data' or 'imagenet-2024'"
)


class DiskError(Exception):
    """A refusal the user can act on; ``status`` is the HTTP status it answers with."""

    status = 409

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class DiskNotFound(DiskError):
    status = 404


class DiskConflict(DiskError):
    """The name exists, the limit is reached, or the disk is attached."""

    status = 409


class DiskUnavailable(DiskError):
    """The storage behind the disks cannot be reached (the Kubernetes API)."""

    status = 503


def check_name(name: Any) -> str:
    """The disk name as given, or ``ValueError`` saying what a name must be.

    Single hyphens only and none at the end: names become parts of Kubernetes object names
    (``disk-{user}--{name}``), which must end with a letter or digit and where ``--``
    separates the user's part from the disk's."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"Field 'name' is required: {NAME_RULE}")
    if len(name) > NAME_MAX or not _NAME_RE.fullmatch(name) or name.endswith("-") or "--" in name:
        raise ValueError(f"Field 'name' must be {NAME_RULE}, not {name[:40]!r}")
    return name


def check_size(size_gb: Any, max_size_gb: int) -> int:
    """The size in whole GB, or ``ValueError`` saying the bounds."""
    if isinstance(size_gb, bool) or not isinstance(size_gb, int):
        raise ValueError(
            f"Field 'size_gb' must be a whole number of GB from 1 to {max_size_gb}, not {size_gb!r}"
        )
    if not 1 <= size_gb <= max_size_gb:
        raise ValueError(f"Field 'size_gb' must be from 1 to {max_size_gb} GB, not {size_gb}")
    return size_gb


@dataclass(frozen=True)
class Disk:
    """A disk's record. ``attached_to`` is a server name ("" is the default server) or None;
    ``used_bytes`` is None where the store cannot tell (Kubernetes)."""

    name: str
    size_gb: int
    created_at: datetime
    attached_to: str | None = None
    billing_session_id: str | None = None
    used_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The record as a store keeps it (and as the hub's API shows it)."""
        return {
            "name": self.name,
            "size_gb": self.size_gb,
            "created_at": self.created_at.isoformat(),
            "attached_to": self.attached_to,
            "billing_session_id": self.billing_session_id,
            "used_bytes": self.used_bytes,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Disk:
        return cls(
            name=str(data["name"]),
            size_gb=int(data["size_gb"]),
            created_at=datetime.fromisoformat(data["created_at"]),
            attached_to=data.get("attached_to"),
            billing_session_id=data.get("billing_session_id"),
            used_bytes=data.get("used_bytes"),
        )


class DiskStore(Protocol):
    """What the hub's disk API and the spawners use; ``user`` is the JupyterHub username."""

    max_size_gb: int
    max_disks: int

    async def list(self, user: str, usage: bool = True) -> list[Disk]:
        """The user's disks by name; ``usage``: with the bytes each holds, where the store
        can tell (counting them takes a while on one machine)."""
        ...

    async def get(self, user: str, name: str) -> Disk: ...

    async def create(
        self, user: str, name: str, size_gb: int, billing_session_id: str | None = None
    ) -> Disk: ...

    async def delete(self, user: str, name: str) -> Disk: ...

    async def attach(self, user: str, name: str, server: str) -> Disk: ...

    async def detach(self, user: str, name: str) -> Disk: ...

    async def attached(self, user: str, server: str) -> list[Disk]: ...


def not_found(user: str, name: str) -> DiskNotFound:
    return DiskNotFound(f"{user} has no disk {name!r}")


def check_new_disk(
    existing: list[Disk], name: str, size_gb: Any, max_size_gb: int, max_disks: int
) -> int:
    """Whether a disk ``name`` of ``size_gb`` may be added to ``existing``: the size in GB,
    ``ValueError`` for a bad name or size, DiskConflict for a taken name or a full quota."""
    check_name(name)
    size = check_size(size_gb, max_size_gb)
    if any(d.name == name for d in existing):
        raise DiskConflict(f"You already have a disk named {name!r}; pick another name.")
    if len(existing) >= max_disks:
        raise DiskConflict(
            f"You have {len(existing)} disks, the most allowed; delete one you no longer "
            "need first."
        )
    return size


def attached_conflict(disk: Disk) -> DiskConflict:
    where = f"server {disk.attached_to!r}" if disk.attached_to else "your default server"
    return DiskConflict(
        f"Disk {disk.name!r} is attached to {where}; detach it first, then delete it."
    )
