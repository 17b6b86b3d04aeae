"""The data disks a server mounts as it starts (docs/lab.md), for every backend."""

from __future__ import annotations

from typing import Any

from tornado import web

from ..core.disks import Disk, DiskError


class DiskMounts:
    """The data-disk part of :class:`~.mixin.GPUSpawnerMixin` (which provides ``user``,
    ``name``, ``who``, ``log`` and ``mounted_disks``)."""

    # each backend provides ``disk_store`` (a spawner.core.disks.DiskStore) and
    # ``disk_path(name)``, where disk ``name`` appears inside this user's servers

    async def disks_to_mount(self) -> tuple[list[Disk], set[str]]:
        """The disks attached to this server, read as it starts (they become its
        ``mounted_disks`` and $GPUTAP_DISKS), and the names of the user's disks attached to
        their other servers (whose links in the shared home must stay)."""
        try:
            every = await self.disk_store.list(self.user.name)
        except DiskError as e:
            raise web.HTTPError(e.status, e.message) from None
        disks = [d for d in every if d.attached_to == self.name]
        elsewhere = {d.name for d in every if d.attached_to not in (None, self.name)}
        self.mounted_disks = [{"name": d.name, "path": self.disk_path(d.name)} for d in disks]
        if disks:
            self.log.info("%s: mounting disks %s", self.who, ", ".join(d.name for d in disks))
        return disks, elsewhere

    async def attached_disks_view(self) -> list[dict[str, Any]]:
        """The data disks of the running server, as the server API shows them:
        ``[{"name", "path"}]``, the disks it mounted at its start (none once stopped)."""
        return [dict(d) for d in self.mounted_disks or []]
