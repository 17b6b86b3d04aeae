"""One machine's workers: each a process of the server's user, running the agent
(``gputap-worker``) of the server's environment under the reaper, with devices of its own.

Worker ``wK`` listens on ``127.0.0.(K+1)``: an address of its own on the loopback network,
as a pod has one on a cluster (so torchrun tells the nodes apart, and the notebook, at
``127.0.0.1``, is the first node). Its home and working folder are the server's, its
``CUDA_VISIBLE_DEVICES`` its own devices, its environment the server's without the hub's
credentials, plus the group's token for its agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from gputap_common import clock

from ..core.environments import Environment
from ..core.placement import FreeView, Request, ServerOptions
from ..core.workers import Worker
from .environments import singleuser_of
from .reaper import reaper_command

AGENT = "gputap-worker"
#: how long a worker has to end after SIGTERM before its process group is killed
STOP_GRACE_SECONDS = 10.0
#: how often a worker the hub did not start itself (re-attached) is looked for
REATTACHED_POLL_SECONDS = 1.0
#: variables of the server's environment a worker does not get (the hub's credentials)
HUB_ONLY = ("JUPYTERHUB_", "JPY_")


def worker_host(index: int) -> str:
    """``127.0.0.(K+1)``: worker K's own loopback address."""
    if not 1 <= index <= 253:
        raise ValueError(f"worker index {index} has no loopback address")
    return f"127.0.0.{index + 1}"


def listening_socket(host: str) -> socket.socket:
    """A socket listening on a free port of ``host``, for a worker's agent to answer on."""
    sock = socket.socket()
    try:
        sock.bind((host, 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def ended_how(code: int | None) -> str:
    """How a worker's process ended, as a user reads it."""
    if code is None:
        return "ended"
    if code < 0:
        return f"was killed (signal {-code})"
    if code > 128:
        return f"was killed (signal {code - 128})"
    return "exited" if code == 0 else f"exited with code {code}"


def agent_program(python: str, server_cmd: list[str]) -> str:
    """The environment's agent: beside its ``jupyterhub-singleuser`` (``python``), or beside
    the configured server command's, else on PATH."""
    if python:
        return str(singleuser_of(python).parent / AGENT)
    for part in server_cmd:
        if part.endswith("jupyterhub-singleuser") and os.path.isabs(part):
            return str(Path(part).parent / AGENT)
    return shutil.which(AGENT) or AGENT


def _pid_runs_agent(pid: int) -> bool:
    """Whether ``pid`` is still the reaper of a worker's agent (a reused pid is not)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"spawner.local.reaper" in cmdline and AGENT.encode() in cmdline


class WorkerServer(Protocol):
    """What workers take from their server's spawner (GPULocalSpawner): what is free, the
    server's environment, user and home."""

    who: str
    cmd: list[str]
    log: Any
    user: Any

    @property
    def server_environment(self) -> Environment: ...

    def get_env(self) -> dict[str, str]: ...

    async def ensure_account(self) -> None: ...

    def process_setup(self) -> Callable[[], None]: ...

    async def gpu_views(
        self, options: ServerOptions
    ) -> tuple[Callable[[], FreeView], FreeView]: ...


class LocalWorkers:
    """The one-machine backend of a server's workers (their devices are the machine's:
    spawner/local/machine.py, taken through the start pipeline)."""

    def __init__(self, spawner: WorkerServer):
        self.spawner = spawner
        self._procs: dict[int, asyncio.subprocess.Process] = {}

    async def views(self, request: Request) -> tuple[Callable[[], FreeView], FreeView]:
        """What a worker may take: what a server asking the same could."""
        return await self.spawner.gpu_views(ServerOptions(request))

    def rendezvous_host(self) -> str:
        return "127.0.0.1"

    # -- processes ------------------------------------------------------------------------

    def _env(self, worker: Worker, token: str) -> dict[str, str]:
        env = {k: v for k, v in self.spawner.get_env().items() if not k.startswith(HUB_ONLY)}
        record = worker.record
        visible = ",".join(record.devices)
        env.update(
            CUDA_VISIBLE_DEVICES=visible,
            NVIDIA_VISIBLE_DEVICES=visible or "void",
            GPUTAP_OFFERING=record.offering,
            GPUTAP_GPU_COUNT=str(record.count if visible else 0),
            GPUTAP_SIMULATED="1" if record.simulated else "0",
            GPUTAP_WORKER_NAME=worker.name,
            GPUTAP_WORKER_TOKEN=token,
        )
        return env

    async def launch(self, worker: Worker, token: str) -> tuple[str, int]:
        spawner = self.spawner
        # the server's own account (found again after a hub restart), its view and home
        await spawner.ensure_account()
        host = worker_host(worker.index)
        program = agent_program(spawner.server_environment.python, list(spawner.cmd))
        # the hub binds the agent's socket and hands it over: a port chosen and then bound
        # by the agent could be taken meanwhile by another local user, whom the hub's first
        # look would send the group's token
        with listening_socket(host) as sock:
            port = sock.getsockname()[1]
            fd = sock.fileno()
            command = [*reaper_command(), program, "--host", host, "--port", str(port)]
            proc = await asyncio.create_subprocess_exec(
                *command,
                "--fd",
                str(fd),
                "--name",
                worker.name,
                env=self._env(worker, token),
                preexec_fn=spawner.process_setup(),
                start_new_session=True,  # its own process group, ended as a whole
                stdin=asyncio.subprocess.DEVNULL,
                pass_fds=(fd,),
            )
        self._procs[worker.index] = proc
        worker.handle["pid"] = proc.pid
        spawner.log.info(
            "%s#%s: started pid %s on %s", spawner.who, worker.name, proc.pid, ",".join(
                worker.record.devices) or "no GPU"
        )  # fmt: skip
        return host, port

    async def wait(self, worker: Worker) -> tuple[datetime, str]:
        proc = self._procs.get(worker.index)
        if proc is not None and proc.pid == worker.handle.get("pid"):
            code = await proc.wait()
            self._procs.pop(worker.index, None)
            return clock.utcnow(), ended_how(code)
        pid = int(worker.handle.get("pid") or 0)
        # re-attached after a hub restart: not the hub's child, so looked for
        while pid and _pid_runs_agent(pid):  # noqa: ASYNC110 (no event tells a pid's end)
            await asyncio.sleep(REATTACHED_POLL_SECONDS)
        return clock.utcnow(), "ended"

    async def stop(self, worker: Worker) -> None:
        """SIGTERM to its process group (the reaper passes it on; the agent ends its job),
        SIGKILL after STOP_GRACE_SECONDS."""
        pid = int(worker.handle.get("pid") or 0)
        if not pid:
            return
        _kill_group(pid, signal.SIGTERM)
        deadline = asyncio.get_running_loop().time() + STOP_GRACE_SECONDS
        while _alive(pid, self._procs.get(worker.index)):
            if asyncio.get_running_loop().time() > deadline:
                _kill_group(pid, signal.SIGKILL)
                break
            await asyncio.sleep(0.1)

    def still_runs(self, worker: Worker) -> bool:
        pid = int(worker.handle.get("pid") or 0)
        return bool(pid) and _pid_runs_agent(pid)


def _alive(pid: int, proc: Any) -> bool:
    if proc is not None:
        return proc.returncode is None
    return _pid_runs_agent(pid)


def _kill_group(pgid: int, sig: int) -> None:
    """Signal a worker's process group: its own (start_new_session), never the hub's."""
    if pgid <= 1 or pgid == os.getpgrp():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
