"""The one-machine backend: single-user servers as local processes, each with exclusive GPUs
or MIG devices through ``CUDA_VISIBLE_DEVICES`` (device UUIDs).

The machine's devices are a :class:`~.machine.LocalMachine`, one per hub process, which this
spawner, its workers and the fault desk share. Placement and taking devices happen in one
synchronous step, so two concurrent spawns never get the same device. Devices are released
when a server stops, when its start fails, and when a poll finds it dead. After a hub restart,
``load_state`` claims the devices of re-attached servers again.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from jupyterhub.spawner import LocalProcessSpawner
from jupyterhub.utils import random_port
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError
from traitlets import Bool, Dict, Float, List, Unicode, default

from ..core.apps import all_apps
from ..core.catalog import Catalog
from ..core.dirnames import safe_dirname
from ..core.disks import HOME_FOLDER
from ..core.placement import FreeView, Placement, ServerOptions
from ..core.record import ServerRecord
from ..core.shared_data import home_link, shared_data_env
from ..lifecycle.mixin import GPUSpawnerMixin
from ..lifecycle.moving import MoveRefused, UndoMove
from . import home_links, leftovers, moves, view
from .accounts import Account, own_account, server_user_mode, system_account
from .disks import LocalDiskStore, link_disks
from .environments import interpreter_of, singleuser_of
from .inventory import DevicePool
from .machine import DeviceSource, LocalMachine, local_machine
from .pool import hub_pools, pool_limits, python_of, static_env
from .reaper import reaper_command
from .shared_data import link_shared_data
from .workers import LocalWorkers

#: gputap's own code, which the reaper and the servers' configuration come from
CHECKOUT = Path(__file__).resolve().parents[2]
DEFAULT_INVENTORY_FILE = CHECKOUT / "hub_config" / "simulated-inventory.yaml"


class GPULocalSpawner(GPUSpawnerMixin, LocalProcessSpawner):
    """LocalProcessSpawner with GPU placement, billing and exclusive devices."""

    inventory = Unicode(
        "auto",
        config=True,
        help="""Where GPUs come from: "auto" (NVML if it sees GPUs, else inventory_file),
        "nvml", or "file".

        c.GPULocalSpawner.inventory = "nvml"
        """,
    )

    inventory_file = Unicode(
        str(DEFAULT_INVENTORY_FILE),
        config=True,
        help="""YAML file of simulated cards, used on machines without GPUs.

        c.GPULocalSpawner.inventory_file = "/etc/gputap/simulated-inventory.yaml"
        """,
    )

    exclude_gpus = List(
        Unicode(),
        config=True,
        help="""GPUs kept out of gputap, by UUID (GPU-… or MIG-…) or NVML index: the
        display GPU of a workstation, one kept for the owner. A GPU's MIG devices go with it.

        c.GPULocalSpawner.exclude_gpus = ["0", "GPU-5e1c…"]
        """,
    )

    inventory_refresh_seconds = Float(
        10.0,
        config=True,
        help="""NVML's GPUs are read again before a start or a change when the last reading is
        older than this: a MIG reconfiguration, a GPU lost or back, is seen without a restart.

        c.GPULocalSpawner.inventory_refresh_seconds = 10
        """,
    )

    node_name = Unicode(
        config=True,
        help="""Name of this machine in placements and messages (default: the host name).

        c.GPULocalSpawner.node_name = "workstation"
        """,
    )

    @default("node_name")
    def _default_node_name(self) -> str:
        return os.uname().nodename

    homes_root = Unicode(
        "/home/gputap",
        config=True,
        help="""Folder holding each user's home (one sub-folder per user), kept across servers,
        restarts and card changes. Ignored when run_as_system_user is set.

        c.GPULocalSpawner.homes_root = "/srv/gputap/homes"
        """,
    )

    run_as_system_user = Bool(
        False,
        config=True,
        help="""Run each server as the system user of the same name, with that user's home
        (JupyterHub's LocalProcessSpawner behaviour). Off: servers run as the hub's user
        with homes under homes_root (a single-owner workstation, or the demo).

        c.GPULocalSpawner.run_as_system_user = True
        """,
    )

    server_user = Unicode(
        "auto",
        config=True,
        help="""Who servers run as, unless run_as_system_user: "per_user" (an account gputap
        makes for each user, gputap-<name>; needs a hub running as root), "hub" (the hub's
        own Unix user), or "auto": per_user when the hub runs as root, else hub
        (spawner/local/accounts.py).

        c.GPULocalSpawner.server_user = "per_user"
        """,
    )

    server_pool = Dict(
        {"enabled": True},
        config=True,
        help="""The server pool (spawner/local/pool.py): a warm process per server
        environment that forks each server ready-imported. The settings' spawner.pool.

        c.GPULocalSpawner.server_pool = {"enabled": True, "max_pools": 4, "min_available_mb": 512}
        """,
    )

    disk_root = Unicode(
        "/srv/gputap/disks",
        config=True,
        help="""Folder holding the users' data disks: {disk_root}/{user}/{disk} (a folder per
        disk, its record beside it). Attached disks appear in servers at ~/disks/{disk}.

        c.GPULocalSpawner.disk_root = "/srv/gputap/disks"
        """,
    )

    shared_data = List(
        Dict(),
        config=True,
        help="""Folders every server sees read-only, linked into the home at their mount path
        (the settings' shared_data entries: name, mount_path, kind, folder; docs/lab.md,
        "Shared data, read-only").

        c.GPULocalSpawner.shared_data = [
            {"name": "hf", "mount_path": "/models", "kind": "models", "folder": "/srv/models"}
        ]
        """,
    )

    #: the command configured (gputap's own environment), kept when a start runs another
    _configured_cmd: list[str] | None = None
    #: the disk links a system user's server makes as it starts (see _link_disks)
    _links: tuple[Path, Path, dict[str, Path], set[str]] | None = None
    _worker_backend: LocalWorkers | None = None
    #: the Unix account this start runs as (None: the hub's own user), found in launch
    account: Account | None = None
    #: the folders of the disks attached to this start
    _disk_folders: list[Path] = []

    @property
    def home_dir(self) -> str:
        return str(Path(self.homes_root) / safe_dirname(self.user.name))

    @property
    def server_home(self) -> Path:
        """The home the server runs in (the system user's own, or one under homes_root)."""
        if self.run_as_system_user:
            return Path(pwd.getpwnam(self.user.name).pw_dir)
        return Path(self.home_dir)

    @property
    def user_mode(self) -> str:
        """What this hub's servers run as: "system", "per_user" or "hub" (accounts.py)."""
        return server_user_mode(self.server_user, self.run_as_system_user, os.geteuid())

    async def ensure_account(self) -> None:
        """Find the account this server runs as (``account``), made with its home at a
        user's first start; once per start, and again after a hub restart."""
        mode = self.user_mode
        loop = asyncio.get_running_loop()
        if mode == "system":
            self.account = await loop.run_in_executor(None, system_account, self.user.name)
        elif mode == "per_user":
            home = Path(self.home_dir)
            self.account = await loop.run_in_executor(None, own_account, self.user.name, home)

    # -- data disks -----------------------------------------------------------------------

    @property
    def disk_store(self) -> LocalDiskStore:
        return LocalDiskStore(self.disk_root, self.disk_max_size_gb, self.max_disks)

    def disk_path(self, name: str) -> str:
        return str(self.server_home / HOME_FOLDER / name)

    async def move_user_files(self, old: str, new: str) -> UndoMove:
        """Move ``old``'s home and data disks to ``new``'s names (an account move,
        spawner/lifecycle/moving.py); returns what moves them back. MoveRefused, with
        nothing moved, when ``new`` holds files there or homes are system users' own."""
        if self.user_mode == "system":
            raise MoveRefused(
                "Servers run as system users, whose homes are their Unix accounts' own: "
                f"rename the Unix account {old} to {new} (usermod --login {new} --move-home "
                f"--home /home/{new} {old}) and its disks folder yourself; gputap moves "
                "only homes under homes_root (nothing was moved)"
            )
        loop = asyncio.get_running_loop()
        renames = await loop.run_in_executor(
            None, moves.plan, Path(self.homes_root), self.disk_store, old, new
        )
        done = await loop.run_in_executor(None, moves.apply, renames)
        for source, target in done:
            self.log.info("Moved %s to %s (account %s is now %s)", source, target, old, new)

        async def undo() -> None:
            await loop.run_in_executor(None, moves.undo, done)
            self.log.info("Moved %s's files back to %s", new, old)

        return undo

    async def _link_disks(self) -> None:
        """Link the disks attached to this server into ~/disks, and unlink those detached.

        As the hub's own user (homes under homes_root) the hub makes the links. For servers
        of their own accounts the server's process makes them once it is that user
        (make_preexec_fn): a hub running as root never works inside a home its user
        controls."""
        disks, elsewhere = await self.disks_to_mount()
        store = self.disk_store
        wanted = {d.name: store.folder(self.user.name, d.name) for d in disks}
        links = (self.server_home, Path(store.root), wanted, elsewhere)
        self._disk_folders = list(wanted.values())
        loop = asyncio.get_running_loop()
        if self.account is not None:
            self._links = links
            if os.geteuid() == 0:
                # disk folders live in the hub's disks root, which no user can change
                await loop.run_in_executor(None, _give_folders, wanted.values(), self.account)
            return
        blocked = await loop.run_in_executor(None, _link_in_home, *links)
        for name in blocked:
            self.log.warning(
                "%s: disk %s not linked: ~/%s/%s is the user's own file",
                self.who,
                name,
                HOME_FOLDER,
                name,
            )
        if blocked:
            self.mounted_disks = [d for d in self.mounted_disks if d["name"] not in blocked]

    async def _link_shared_data(self) -> None:
        """Link the shared folders into the home (for servers of their own accounts their
        server's process does, as it does the disks: make_preexec_fn)."""
        if not self.shared_data or self.account is not None:
            return
        loop = asyncio.get_running_loop()
        blocked = await loop.run_in_executor(
            None, link_shared_data, self.server_home, self.shared_data
        )
        for path in blocked:
            self.log.warning("%s: %s not linked: ~%s is in the way", self.who, path, path)

    # -- inventory -----------------------------------------------------------------------

    @property
    def machine(self) -> LocalMachine:
        """This machine's devices, shared with every server, worker and the fault desk."""
        return local_machine(
            DeviceSource(
                self.inventory, self.inventory_file, tuple(self.exclude_gpus), self.node_name
            )
        )

    async def pool(self) -> DevicePool:
        """This machine's devices, read on first use and, for real GPUs, again when older
        than ``inventory_refresh_seconds``."""
        return await self.machine.reread(self.settings_catalog, self.inventory_refresh_seconds)

    async def discover(self) -> None:
        """Read the GPUs before options are parsed: a card NVML found that the catalog does
        not know may be what they ask for."""
        await self.pool()

    @property
    def settings_catalog(self) -> Catalog:
        """The catalog of the settings alone, without the GPUs NVML found that it lacks."""
        return super().catalog

    @property
    def catalog(self) -> Catalog:
        """The settings' catalog plus the cards of GPUs it does not know (unpriced until an
        operator prices them)."""
        return self.machine.catalog(super().catalog)

    async def gpu_free_view(self) -> tuple[FreeView, bool]:
        pool = await self.machine.pool(self.settings_catalog)
        return pool.free_view(), pool.simulated

    async def change_free_view(self, spot: bool = False) -> tuple[FreeView, bool]:
        pool = await self.pool()
        return pool.free_view(as_free=self.who), pool.simulated

    # -- process environment --------------------------------------------------------------

    def make_preexec_fn(self, name):
        if self.account is not None:
            enter = self.process_setup()
            links = self._home_links()

            def preexec() -> None:
                enter()
                home_links.make(links)

            return preexec
        return self.process_setup()

    def _home_links(self, keep: bool = False) -> dict[str, Any]:
        """The links this start's process makes in the home (home_links.py), once (``keep``:
        for a pool claim, which may still fall back to a cold start)."""
        disks = self._links
        if not keep:
            self._links = None
        return home_links.describe(self.server_home, disks, list(self.shared_data))

    def process_setup(self) -> Callable[[], None]:
        """What a process of this server (the server, a worker's agent) does after fork:
        as root, a view of the machine's folders of its own (view.py); then become the
        server's account and start in its home. Without an account of its own, make the
        home under homes_root and start there."""
        account = self.account
        if account is None:
            home = self.home_dir

            def in_home() -> None:
                os.makedirs(home, 0o700, exist_ok=True)
                os.chdir(home)

            return in_home
        plan = self._view_plan(account) if os.geteuid() == 0 else None

        def as_account() -> None:
            try:
                if plan is not None:
                    view.enter(plan)
                account.become()
            except OSError as e:  # Popen says only "Exception occurred in preexec_fn"
                print(f"gputap: cannot start as {account.name}: {e}", file=sys.stderr)
                raise

        return as_account

    def _view_plan(self, account: Account) -> view.Plan:
        """What the account must reach (its environment, gputap's code its server runs, its
        home and disks) and the folders it sees read-only (shared data)."""
        needed = [CHECKOUT, account.home, *_installation(sys.executable)]
        python = self.server_environment.python
        if python:
            needed += _installation(str(singleuser_of(python)))
        needed += self._disk_folders
        needed += self._named_paths()
        read_only = [Path(entry["folder"]) for entry in self.shared_data]
        return view.plan(needed, read_only, account.uid, account.groups)

    def _named_paths(self) -> list[Path]:
        """What the operator names for servers: absolute paths in the spawner's environment
        (JUPYTER_CONFIG_PATH, PYTHONPATH) and in apps' commands (a folder an app serves)."""
        words = [
            part
            for value in self.environment.values()
            if isinstance(value, str)
            for part in value.split(os.pathsep)
        ]
        if self.apps:
            words += [str(w) for app in all_apps(self.apps).values() for w in app["command"]]
        return [Path(w) for w in words if w.startswith("/")]

    def user_env(self, env: dict[str, str]) -> dict[str, str]:
        if self.account is not None:
            env.update(self.account.env(), SHELL="/bin/bash")
            return env
        env["USER"] = self.user.name
        env["HOME"] = self.home_dir
        env["SHELL"] = "/bin/bash"
        return env

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        if self.record is not None:
            visible = ",".join(self.record.devices)
            # an empty value hides every GPU from CUDA: CPU-only servers see none
            env["CUDA_VISIBLE_DEVICES"] = visible
            env["NVIDIA_VISIBLE_DEVICES"] = visible or "void"
            env["GPUTAP_OFFERING"] = self.record.offering
            env["GPUTAP_GPU_COUNT"] = str(self.record.count)
            env["GPUTAP_SIMULATED"] = "1" if self.record.simulated else "0"
            # every process of this start carries it: what outlives the server is found by
            # it (leftovers.py)
            env[leftovers.MARK] = self.record.session_id
        if self.shared_data:
            home = self.server_home
            env.update(
                shared_data_env(
                    self.shared_data,
                    home=str(home),
                    seen_at=lambda e: str(home / home_link(e["mount_path"])),
                    read_at=lambda e: e["folder"],
                )
            )
        python = self.server_environment.python
        if python:  # its programs (python, pip) before the hub's
            env["PATH"] = os.pathsep.join([str(singleuser_of(python).parent), env.get("PATH", "")])
        return env

    # -- lifecycle hooks (spawner.lifecycle.mixin) -------------------------------------------

    async def gpu_views(self, options: ServerOptions) -> tuple[Callable[[], FreeView], FreeView]:
        pool = await self.pool()
        await self.machine.check_processes(pool)
        return pool.free_view, pool.free_view()

    async def end_leftovers(self, record: ServerRecord) -> None:
        """End the processes of this start that outlived its reaper (killed outright),
        before its devices go to another server."""
        loop = asyncio.get_running_loop()
        left = await loop.run_in_executor(None, leftovers.end_marked, record.session_id)
        if left:
            self.log.warning("%s: processes %s did not end after SIGKILL", self.who, left)

    def keep_devices(self, record: ServerRecord) -> None:
        """A process that never died may still use its GPUs: they stay held under a name of
        their own."""
        self.machine.keep_held(self.who, f"{self.who} (pid {self.pid} never died)")

    async def launch(self, placement: Placement) -> tuple[str, int]:
        """Link the disks, start the process, and return once it answers HTTP (billing
        starts when the server is up); a process that never answered is stopped."""
        await self.ensure_account()
        await self._link_disks()
        await self._link_shared_data()
        self._run_environment()
        try:
            ip, port = await self._claim_pooled() or await LocalProcessSpawner.start(self)
            await self._wait_up(ip, port)
        except BaseException:
            if self.pid:
                await LocalProcessSpawner.stop(self, now=True)
            raise
        return ip, port

    def _run_environment(self) -> None:
        """The command of this start: the environment's own jupyterhub-singleuser under the
        reaper, or (gputap's own) the configured command. LocalProcessSpawner.start runs
        ``cmd`` and offers no hook, so it is set here, for this start, from what was
        configured."""
        if self._configured_cmd is None:
            self._configured_cmd = list(self.cmd)
        python = self.server_environment.python
        own = [*reaper_command(), str(singleuser_of(python))] if python else None
        self.cmd = own or self._configured_cmd

    async def _claim_pooled(self) -> tuple[str, int] | None:
        """The server forked from its environment's warm pool (pool.py), started as a cold
        start would be; None where the pool cannot (the caller then starts it cold)."""
        prefix = reaper_command()
        cmd = list(self.cmd)
        if (
            not self.server_pool.get("enabled", True)
            or cmd[: len(prefix)] != prefix
            or len(cmd) != len(prefix) + 1
            or self.shell_cmd
            or self.popen_kwargs
        ):
            return None  # an operator's own command: started as configured
        if self.port == 0:
            self.port = random_port()
        account = self.account
        plan = self._view_plan(account) if account and os.geteuid() == 0 else None
        request = {
            "argv": [cmd[-1], *self.get_args()],
            "env": self.get_env(),
            "home": self.home_dir,
            "account": account.to_json() if account else None,
            "plan": plan.to_json() if plan else None,
            "links": self._home_links(keep=True) if account else None,
        }
        pools = hub_pools(pool_limits(self.server_pool))
        pid = await pools.claim(python_of(cmd[-1]), static_env(self.environment), request)
        if pid is None:
            return None
        self._links = None
        self.pid, self.proc = pid, None
        self.log.info("%s: forked from the server pool (pid %s)", self.who, pid)
        return (self.ip or "127.0.0.1", self.port)

    async def still_running(self) -> bool:
        return bool(self.pid) and await self._signal(0)

    def worker_backend(self) -> LocalWorkers:
        """The backend of this server's workers (spawner/local/workers.py)."""
        if self._worker_backend is None:
            self._worker_backend = LocalWorkers(self)
        return self._worker_backend

    async def _wait_up(self, ip: str, port: int) -> None:
        """Return once the server answers HTTP."""
        url = f"http://{ip}:{port}{self.server.base_url}api"
        # its own client: probes of many starting servers in tornado's shared one (10 at a
        # time) made every other call of the hub wait behind them
        client = AsyncHTTPClient(force_instance=True, max_clients=1)
        deadline = time.monotonic() + self.http_timeout
        often_until = time.monotonic() + 2
        try:
            while time.monotonic() < deadline:
                if self.proc is not None and self.proc.poll() is not None:
                    code = self.proc.returncode
                    raise web.HTTPError(500, f"the server exited with code {code}")
                if self.proc is None and not await self.still_running():
                    raise web.HTTPError(500, "the server exited")
                try:
                    await client.fetch(url, request_timeout=2, connect_timeout=2)
                    return
                except HTTPClientError as e:
                    if e.code != 599:
                        return
                except OSError:
                    pass
                # a pooled server answers within a second: look often at first
                await asyncio.sleep(0.02 if time.monotonic() < often_until else 0.1)
        finally:
            client.close()
        raise TimeoutError(f"{self.who} did not answer within {self.http_timeout} s")


def _link_in_home(home: Path, root: Path, wanted: dict[str, Path], keep: set[str]) -> list[str]:
    home.mkdir(0o700, parents=True, exist_ok=True)  # as the server's preexec makes it
    return link_disks(home, root, wanted, keep)


def _installation(program: str) -> list[Path]:
    """The folders a program of a Python environment runs from: the environment's, and the
    installation a virtual environment is made from (its interpreter's, through links and the
    script's ``#!`` line)."""
    path = Path(program)
    found = [path.parent.parent]
    interpreter = Path(interpreter_of(path) or path)
    real = Path(os.path.realpath(interpreter))
    found += [interpreter.parent.parent, real.parent.parent]
    return found


def _give_folders(folders: Iterable[Path], account: Account) -> None:
    """Disk folders belong to their user (the hub made them as root); never through a link."""
    for folder in folders:
        os.chown(folder, account.uid, account.gid, follow_symlinks=False)
