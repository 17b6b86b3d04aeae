"""The hub's data disk API (docs/lab.md, "The hub's server API" and "Data disks").

At ``{base_url}hub/gputap/api/``:

| call | scope | answer |
|---|---|---|
| ``GET users/{U}/disks`` | ``custom:gputap:disks!user=U`` | the disks, limits and price |
| ``POST users/{U}/disks`` ``{"name", "size_gb"}`` | same | 201 the disk |
| ``GET users/{U}/disks/{D}`` | same | the disk |
| ``DELETE users/{U}/disks/{D}`` | same | 204; 409 while attached |
| ``POST users/{U}/disks/{D}/attach`` ``{"server": N}`` | and ``servers!server=U/N`` | 202 |
| ``POST users/{U}/disks/{D}/detach`` | and ``servers!server=U/N`` (N: where it is) | 202 |

A user, disk or server the caller may not see answers 404 with the message a missing one
gets. Attach and detach take effect at the server's next start, so a running server is
restarted with the options it runs with (spawner/change.py's ``restart_with``: ``restart`` in
the answer is its status, also at ``GET {server}/change``; null when no server needed it; when
the restart is refused, the disk is left as it was). Billing meters each disk as a storage
session (sku ``disk``, count = GB) from its creation to its deletion; when billing cannot be
reached, neither happens.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from jupyterhub.scopes import has_scope
from tornado import web

from gputap_common import clock, scopes

from ..core.disks import Disk, DiskError, check_new_disk
from ..lifecycle.billing_client import (
    DISK_SKU,
    STORAGE_CLASS,
    BillingClient,
    BillingRefused,
    BillingUnavailable,
)
from ..lifecycle.change import restart_with
from ..lifecycle.change import status as change_status
from .base import API_PATH, GPUTapAPIHandler

PENDING = {"spawn": "starting", "stop": "stopping", "check": "starting"}
# disk changes of one user, one at a time (the hub is one process)
_locks: dict[str, asyncio.Lock] = {}


def _lock(username: str) -> asyncio.Lock:
    return _locks.setdefault(username, asyncio.Lock())


@contextmanager
def refusals_as_http() -> Iterator[None]:
    """A store's refusal as the HTTP error it answers with; bad input as 400."""
    try:
        yield
    except DiskError as e:
        raise web.HTTPError(e.status, e.message) from None
    except ValueError as e:
        raise web.HTTPError(400, str(e)) from None


class DiskAPIHandler(GPUTapAPIHandler):
    """What the disk handlers share: who may see what, the store, the views."""

    def may(self, scope: str) -> bool:
        return has_scope(scope, self.parsed_scopes, db=self.db)

    def owner(self, username: str) -> Any:
        """The user whose disks are asked for; 404 alike for a missing one and one the
        caller may not see."""
        if self.current_user is None:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        user = self.find_user(username) if self.may(f"{scopes.DISKS}!user={username}") else None
        if user is None:
            raise web.HTTPError(404, f"No user {username!r}")
        return user

    def server(self, user: Any, server_name: Any) -> Any:
        """The user's server ``server_name`` if the caller may start and stop it (its spawner,
        or None for a default server that never ran); 404 alike otherwise."""
        if not isinstance(server_name, str):
            raise web.HTTPError(
                400,
                "Field 'server' must be the name of one of your servers "
                '("" for the default server)',
            )
        exists = server_name == "" or server_name in user.orm_spawners
        if not exists or not self.may(f"servers!server={user.name}/{server_name}"):
            raise web.HTTPError(404, f"{user.name} has no server {server_name!r}")
        return user.spawners[server_name] if server_name in user.orm_spawners else None

    @staticmethod
    def running(user: Any, server_name: str | None) -> bool:
        if server_name is None or server_name not in user.orm_spawners:
            return False
        return bool(user.spawners[server_name].active)

    def view(self, user: Any, disk: Disk) -> dict[str, Any]:
        spawner = user.spawner
        return {
            **disk.to_json(),
            "attached_running": self.running(user, disk.attached_to),
            "path": spawner.disk_path(disk.name),
        }

    async def store_call(self, user: Any, method: str, *args: Any) -> Any:
        """Call ``method`` of the user's disk store for them; refusals become HTTP errors."""
        with refusals_as_http():
            return await getattr(user.spawner.disk_store, method)(user.name, *args)


class DisksHandler(DiskAPIHandler):
    async def get(self, username: str) -> None:
        user = self.owner(username)
        disks = await self.store_call(user, "list")
        spawner = user.spawner
        self.write_json(
            {
                "disks": [self.view(user, d) for d in disks],
                "limits": {"max_size_gb": spawner.disk_max_size_gb, "max_disks": spawner.max_disks},
                **await disk_price(spawner.billing),
            }
        )

    async def post(self, username: str) -> None:
        user = self.owner(username)
        body = self.json_body(("name", "size_gb"))
        name, size_gb = body.get("name"), body.get("size_gb")
        spawner = user.spawner
        async with _lock(user.name):
            # every check the store makes, before billing hears of the disk
            existing = await self.store_call(user, "list", False)
            with refusals_as_http():
                check_new_disk(existing, name, size_gb, spawner.disk_max_size_gb, spawner.max_disks)
            session_id = str(uuid.uuid4())
            started_at = clock.utcnow()
            try:
                await spawner.billing.start_storage_session(
                    session_id, user.name, name, size_gb, started_at
                )
            except BillingUnavailable as e:
                # billing may have stored the session before its answer was lost
                await spawner.metering.close(session_id, started_at)
                raise web.HTTPError(
                    503,
                    "Billing is unreachable, so no disk can be created now (nothing was "
                    f"created or charged). Try again in a minute. ({e})",
                ) from None
            except BillingRefused as e:
                raise web.HTTPError(
                    502, f"Billing refused to meter the disk, so it was not created: {e.message}"
                ) from None
            try:
                disk = await self.store_call(user, "create", name, size_gb, session_id)
            except BaseException:
                await spawner.metering.close(session_id, started_at)
                raise
        self.log.info("%s: disk %s created (%d GB)", user.name, name, size_gb)
        self.write_json(self.view(user, disk), 201)


class DiskHandler(DiskAPIHandler):
    async def get(self, username: str, name: str) -> None:
        user = self.owner(username)
        self.write_json(self.view(user, await self.store_call(user, "get", name)))

    async def delete(self, username: str, name: str) -> None:
        user = self.owner(username)
        spawner = user.spawner
        async with _lock(user.name):
            disk = await self.store_call(user, "get", name)
            if disk.attached_to is not None:
                where = f"server {disk.attached_to!r}" if disk.attached_to else "default server"
                raise web.HTTPError(
                    409, f"Disk {name!r} is attached to your {where}; detach it first."
                )
            refuse_if_mounted(user, name)
            if disk.billing_session_id:
                try:
                    await spawner.billing.stop_session(disk.billing_session_id, clock.utcnow())
                except BillingUnavailable as e:
                    raise web.HTTPError(
                        503,
                        "Billing is unreachable, so the disk cannot be deleted now (its "
                        f"metering ends with it); nothing was deleted. Try again later. ({e})",
                    ) from None
                except BillingRefused as e:
                    if e.status != 404:  # 404: never metered, nothing to stop
                        raise web.HTTPError(
                            502, f"Billing refused to stop metering the disk: {e.message}"
                        ) from None
            await self.store_call(user, "delete", name)
        self.log.info("%s: disk %s deleted", user.name, name)
        self.set_status(204)


class DiskActionHandler(DiskAPIHandler):
    """POST .../attach {"server": N} and POST .../detach."""

    async def post(self, username: str, name: str, action: str) -> None:
        user = self.owner(username)
        body = self.json_body(("server",))
        async with _lock(user.name):
            disk = await self.store_call(user, "get", name)
            if action == "attach":
                answer = await self._attach(user, disk, body)
            else:
                answer = await self._detach(user, disk, body)
        self.write_json(answer, 202)

    def _check_not_pending(self, spawner: Any, server_name: str) -> None:
        which = f"server {server_name!r}" if server_name else "default server"
        if spawner is not None and spawner.pending:
            raise web.HTTPError(
                409,
                f"Your {which} is {PENDING.get(spawner.pending, 'busy')}; try again once it "
                "is running or stopped.",
            )
        current = change_status(spawner.user.name, server_name) if spawner is not None else None
        if current is not None and current.active:
            # between a change's stop and its start nothing is pending, yet it is changing
            raise web.HTTPError(
                409, f"Your {which} is changing ({current.state}); try again once it runs."
            )

    async def _attach(self, user: Any, disk: Disk, body: dict[str, Any]) -> dict[str, Any]:
        if "server" not in body:
            raise web.HTTPError(
                400, "Field 'server' is required: the server to attach to (\"\" the default)"
            )
        server_name = body["server"]
        spawner = self.server(user, server_name)
        other = disk.attached_to
        if other is not None and other != server_name:
            if self.running(user, other):
                where = f"server {other!r}" if other else "default server"
                raise web.HTTPError(
                    409,
                    f"Disk {disk.name!r} is in use by your running {where}; detach it there "
                    "first (that restarts it), or stop that server.",
                )
        self._check_not_pending(spawner, server_name)
        refuse_if_mounted(user, disk.name, but=server_name)
        before = disk
        if other != server_name:
            disk = await self.store_call(user, "attach", disk.name, server_name)
        restart = None
        if not self._mounted(spawner, disk.name):
            restart = await self._restart(user, server_name, f"mount disk {disk.name}", before)
        if other != server_name:
            self.log.info("%s: disk %s attached to %r", user.name, disk.name, server_name)
        return {"disk": self.view(user, disk), "restart": restart}

    async def _detach(self, user: Any, disk: Disk, body: dict[str, Any]) -> dict[str, Any]:
        server_name = disk.attached_to
        if "server" in body and body["server"] != server_name:
            asked = body["server"]
            self.server(user, asked)  # 404 for a server the caller may not see
            raise web.HTTPError(
                409, f"Disk {disk.name!r} is not attached to server {asked!r}; nothing changed."
            )
        if server_name is None:
            return {"disk": self.view(user, disk), "restart": None}
        spawner = None
        if server_name == "" or server_name in user.orm_spawners:
            spawner = self.server(user, server_name)
        # else the named server was deleted: the disk is free to go, nothing runs with it
        self._check_not_pending(spawner, server_name)
        before = disk
        disk = await self.store_call(user, "detach", disk.name)
        restart = None
        if self._mounted(spawner, disk.name):
            restart = await self._restart(user, server_name, f"unmount disk {disk.name}", before)
        self.log.info("%s: disk %s detached from %r", user.name, disk.name, server_name)
        return {"disk": self.view(user, disk), "restart": restart}

    async def _restart(
        self, user: Any, server_name: str, reason: str, before: Disk
    ) -> dict[str, Any] | None:
        """Restart the server with the options it runs with, so the disk is (un)mounted: the
        status of the restart (spawner/change.py), or None when the server does not run. If
        the restart is refused (busy, billing away), the disk is put back as it was."""
        spawner = user.spawners[server_name] if server_name in user.orm_spawners else None
        if spawner is None or not spawner.ready:
            return None  # its next start mounts what is attached then

        async def put_back() -> None:
            if before.attached_to is None:
                await self.store_call(user, "detach", before.name)
            else:
                await self.store_call(user, "attach", before.name, before.attached_to)

        try:
            # a start that fails with the disk (un)mounted goes back to how it was before
            change = await restart_with(self, user, server_name, reason, undo=put_back)
        except web.HTTPError:
            await put_back()
            raise
        return change.view()

    @staticmethod
    def _mounted(spawner: Any, name: str) -> bool:
        """Whether the running server has the disk mounted (a stopped one has none)."""
        if spawner is None or not spawner.ready:
            return False
        return any(d["name"] == name for d in spawner.mounted_disks or [])


def refuse_if_mounted(user: Any, name: str, but: str | None = None) -> None:
    """409 while a server of ``user`` (other than ``but``) that has not stopped yet still has
    the disk mounted: a detach takes effect only once that server has restarted."""
    for server_name, spawner in user.spawners.items():
        if server_name == but or not spawner.active:
            continue
        if any(d["name"] == name for d in spawner.mounted_disks or []):
            which = f"server {server_name!r}" if server_name else "default server"
            raise web.HTTPError(
                409,
                f"Disk {name!r} is still mounted by your {which}, which has not restarted "
                "without it yet; try again once it has.",
            )


async def disk_price(billing: BillingClient) -> dict[str, Any]:
    """Billing's price of a GB-hour of disk (micro-credits, and exact credits as text) and
    its currency; nulls when billing has no price or cannot be asked (the list still shows
    the disks)."""
    try:
        answer = await billing.price_list([DISK_SKU], STORAGE_CLASS)
    except (BillingUnavailable, BillingRefused):
        answer = {}
    price = (answer.get("prices") or {}).get(DISK_SKU) or {}
    return {
        "price_per_gb_hour_micro": price.get("per_hour_micro"),
        "price_per_gb_hour": price.get("per_hour"),
        "currency": answer.get("currency", "credits"),
    }


default_handlers = [
    (rf"/{API_PATH}/users/([^/]+)/disks", DisksHandler),
    (rf"/{API_PATH}/users/([^/]+)/disks/([^/]+)", DiskHandler),
    (rf"/{API_PATH}/users/([^/]+)/disks/([^/]+)/(attach|detach)", DiskActionHandler),
]
