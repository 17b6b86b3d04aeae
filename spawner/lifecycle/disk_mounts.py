"""The data disks a server mounts as it starts (docs/lab.md), for every backend."""

from __future__ import annotations

from tornado import web

from ..core.disks import Disk, DiskError, DiskStore


async def disks_to_mount(store: DiskStore, user: str, server: str) -> tuple[list[Disk], set[str]]:
    """The disks of ``user`` attached to ``server``, read as it starts, and the names of
    their disks attached to their other servers (whose links in the shared home must stay).
    A store that cannot answer is the store's own 4xx/5xx, saying what to do."""
    try:
        every = await store.list(user)
    except DiskError as e:
        raise web.HTTPError(e.status, e.message) from None
    disks = [d for d in every if d.attached_to == server]
    elsewhere = {d.name for d in every if d.attached_to not in (None, server)}
    return disks, elsewhere
