"""A spawner double in one process, as JupyterHub's ``MockSpawner`` is for its own tests: the
real :class:`~spawner.lifecycle.mixin.GPUSpawnerMixin` (options, placement, the start pipeline,
billing's hold and session, stop reasons, state across hub restarts) on JupyterHub's own
:class:`~jupyterhub.spawner.Spawner`, whose "server" is a tornado app in this process that
answers the hub's check (``{base_url}api``) until it is stopped or told to :meth:`die`.

The devices are a real :class:`~spawner.local.machine.LocalMachine` on the simulated inventory
(one per test, or shared to model one hub's spawners), billing a
:class:`~tests.doubles.billing.BillingDouble`, disks a folder of the test's own. No hub, no
process, no port but the app's: a test of the lifecycle runs in milliseconds.

    spawner = spawner_double("ada", machine, billing, disks=tmp_path)
    spawner.user_options = {"gpu": "T4", "count": 1}
    await spawner.start()
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from jupyterhub import orm
from jupyterhub.objects import Hub
from jupyterhub.spawner import Spawner
from tornado import web
from tornado.httpserver import HTTPServer

from spawner.core.placement import FreeView, Placement, ServerOptions
from spawner.lifecycle.mixin import GPUSpawnerMixin
from spawner.local.disks import LocalDiskStore
from spawner.local.machine import DeviceSource, LocalMachine
from spawner.local.spawner import DEFAULT_INVENTORY_FILE
from tests.doubles.billing import BillingDouble


def simulated_machine(node: str = "node") -> LocalMachine:
    """A machine of the simulated inventory's devices, none taken (read on first use)."""
    return LocalMachine(DeviceSource("file", str(DEFAULT_INVENTORY_FILE), (), node))


class _Api(web.RequestHandler):
    def get(self) -> None:
        self.write({"version": "double"})


class InProcessServer(Spawner):
    """JupyterHub's Spawner whose server is a tornado app on 127.0.0.1 in this process:
    ``start`` serves it, ``stop`` closes it, ``poll`` says None while it serves."""

    _http: HTTPServer | None = None
    _exit_status: int | None = None

    async def start(self) -> tuple[str, int]:
        if self._http is not None:
            raise RuntimeError(f"{self.user.name}'s server is already running")
        base_url = self.server.base_url if self.server else "/"
        app = web.Application([(f"{base_url}api", _Api)])
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        listener.setblocking(False)
        self._http = HTTPServer(app)
        self._http.add_sockets([listener])
        self._exit_status = None
        return "127.0.0.1", listener.getsockname()[1]

    async def stop(self, now: bool = False) -> None:
        self._close(0)

    async def poll(self) -> int | None:
        """None while it serves; its exit status after, 0 if it never ran (as
        LocalProcessSpawner says of a process it has no pid for)."""
        if self._http is not None:
            return None
        return 0 if self._exit_status is None else self._exit_status

    def die(self, status: int = 1) -> None:
        """The server exits by itself (a crash): the next poll finds it gone."""
        self._close(status)

    def _close(self, status: int) -> None:
        if self._http is not None:
            self._http.stop()
            self._http = None
            self._exit_status = status


class SpawnerDouble(GPUSpawnerMixin, InProcessServer):
    """gputap's lifecycle on the in-process server (see the module's docstring)."""

    machine: LocalMachine
    billing_double: BillingDouble
    disk_folder: Path

    @property
    def billing(self) -> Any:
        return self.billing_double

    @property
    def disk_store(self) -> LocalDiskStore:
        return LocalDiskStore(str(self.disk_folder), self.disk_max_size_gb, self.max_disks)

    def disk_path(self, name: str) -> str:
        return f"/home/{self.user.name}/disks/{name}"

    async def gpu_free_view(self) -> tuple[FreeView, bool]:
        pool = await self.machine.pool(self.catalog)
        return pool.free_view(), pool.simulated

    async def change_free_view(self, spot: bool = False) -> tuple[FreeView, bool]:
        pool = await self.machine.pool(self.catalog)
        return pool.free_view(as_free=self.who), pool.simulated

    async def gpu_views(self, options: ServerOptions) -> tuple[Callable[[], FreeView], FreeView]:
        pool = await self.machine.pool(self.catalog)
        return pool.free_view, pool.free_view()

    async def launch(self, placement: Placement) -> tuple[str, int]:
        await self.disks_to_mount()
        return await InProcessServer.start(self)


def spawner_double(
    user: str,
    machine: LocalMachine,
    billing: BillingDouble,
    disks: Path,
    name: str = "",
    **settings: Any,
) -> SpawnerDouble:
    """A spawner of ``user``'s server ``name`` on ``machine``, with ``billing`` and the
    disks under ``disks``; ``settings`` are GPUSpawnerMixin's or Spawner's traits."""
    spawner = SpawnerDouble(
        # what the lifecycle reads of JupyterHub's User
        user=SimpleNamespace(name=user, escaped_name=user, url=f"/user/{user}/", groups=[]),
        hub=Hub(base_url="/hub/"),
        orm_spawner=orm.Spawner(name=name),  # its row, in no database
        **settings,
    )
    spawner.machine = machine
    spawner.billing_double = billing
    spawner.disk_folder = disks
    return spawner
