"""The server pool, the hub's side: one warm process per server environment (forkserver.py),
which forks a ready-imported server per claim (docs/instant-start.md).

A claim waits for a pool that is still importing (it is ready about as soon as a cold start
would be, and spares the CPU of importing twice); a pool process that died or went stale (its
environment's packages changed since it imported them) is replaced, and the claim waits for
the new one. A claim the pool cannot answer (it did not start, over its memory limit, a
refused or timed-out claim) returns None: the spawner then starts the server cold, as without
a pool, and the user sees no difference but speed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .environments import interpreter_of
from .forkserver import BOOT

log = logging.getLogger("gputap.pool")

#: gputap's code, which the pool process imports its fork server, view and reaper from
CHECKOUT = Path(__file__).resolve().parents[2]
#: how long a claim may take to be forked and answered
CLAIM_SECONDS = 10.0
#: how long a new pool process may take to import everything (a claim waits as long)
READY_SECONDS = 60.0
#: the pool process's home, which does not exist
POOL_HOME = "/nonexistent/gputap-pool"
#: environment variables a pool's imports read, which a claim must share with it
IMPORT_ENV = ("JUPYTERHUB_SINGLEUSER_APP", "JUPYTERHUB_SINGLEUSER_EXTENSION")


@dataclass(frozen=True)
class PoolLimits:
    """``spawner.pool`` (gputap_common/settings/schema.yaml)."""

    enabled: bool = True
    #: server environments kept warm at once (a pool process each, ~100-200 MB)
    max_pools: int = 4
    #: no new pool process while the machine has less memory available than this
    min_available_mb: int = 512


def pool_limits(setting: dict[str, Any]) -> PoolLimits:
    """The limits of the settings' ``spawner.pool`` (defaults where a key is missing)."""
    return PoolLimits(**{k: v for k, v in setting.items() if k in PoolLimits.__dataclass_fields__})


def static_env(environment: dict[str, Any]) -> dict[str, str]:
    """The servers' environment the configuration fixes (no user's): what a pool imports
    under."""
    return {k: v for k, v in environment.items() if isinstance(v, str)}


def available_mb() -> int:
    """MemAvailable of /proc/meminfo, in MB (a large number where it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 30


def signature(python: str) -> tuple[int, ...]:
    """What changes when an environment's packages do: its site-packages folders' mtimes."""
    prefix = Path(python).parent.parent
    found = sorted(prefix.glob("lib/python3*/site-packages"))
    return tuple(p.stat().st_mtime_ns for p in found)


class ServerPool:
    """The pool process of one server environment (its ``python``)."""

    def __init__(self, python: str, env: dict[str, str]):
        self.python = python
        self.env = env  # the servers' static environment: what the pool imports under
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._ready = asyncio.Event()
        #: set once the pool process is ready or failed to be: what a claim waits for
        self._settled = asyncio.Event()
        self._lock = asyncio.Lock()
        self._signature: tuple[int, ...] = ()
        self.used_at = time.monotonic()
        self.claims = 0

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    @property
    def started_with(self) -> tuple[int, ...]:
        """The environment's packages when this pool started (signature())."""
        return self._signature

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        """Start the pool process and wait (in the background) until it has imported."""
        ours, theirs = socket.socketpair()
        self._signature = signature(self.python)
        path = self.env.get("PATH", os.environ.get("PATH", ""))
        # GPUTAP_POOL marks the pool process (ps, tests); a claimed server has the claim's
        # environment alone (forkserver.py)
        # a home that does not exist: what an import captures of it (forkserver.py,
        # refresh_home_defaults) fails loudly rather than share one folder among users
        env = {**self.env, "PATH": path, "GPUTAP_POOL": "1", "HOME": POOL_HOME}
        self.proc = await asyncio.create_subprocess_exec(
            *[self.python, "-P", "-c", BOOT, "--fd", str(theirs.fileno())],
            *["--checkout", str(CHECKOUT)],
            pass_fds=(theirs.fileno(),),
            env=env,
            cwd="/",
            start_new_session=True,  # the hub's Ctrl-C is not its
            stdin=asyncio.subprocess.DEVNULL,
        )
        theirs.close()
        self._reader, self._writer = await asyncio.open_unix_connection(sock=ours)
        self._ready.clear()
        self._settled.clear()
        asyncio.ensure_future(self._wait_ready())

    async def _wait_ready(self) -> None:
        try:
            line = await asyncio.wait_for(self._reader.readline(), READY_SECONDS)
        except (TimeoutError, OSError):
            line = b""
        try:
            ready = json.loads(line or b"{}").get("ready")
        except ValueError:
            ready = False
        if ready:
            self._ready.set()
            log.info("server pool for %s ready (pid %s)", self.python, self.proc.pid)
        else:
            log.warning("server pool for %s did not start; servers start cold", self.python)
            self.close()
        self._settled.set()

    def stale(self) -> bool:
        return signature(self.python) != self._signature

    async def claim(self, request: dict[str, Any]) -> int | None:
        """Fork a server for ``request``; its reaper's pid, or None (start it cold). A pool
        still importing is waited for: it is ready about as soon as a cold start would be,
        and the imports are not made twice."""
        if not self._settled.is_set():
            try:
                await asyncio.wait_for(self._settled.wait(), READY_SECONDS)
            except TimeoutError:
                return None
        if not self._ready.is_set() or not self.alive:
            return None
        self.used_at = time.monotonic()
        async with self._lock:
            try:
                self._writer.write(json.dumps(request).encode() + b"\n")
                await self._writer.drain()
                line = await asyncio.wait_for(self._reader.readline(), CLAIM_SECONDS)
            except (OSError, TimeoutError) as e:
                log.warning("server pool for %s: claim failed (%s)", self.python, e)
                self.close()
                return None
        answer = json.loads(line or b"{}")
        if "pid" not in answer:
            log.warning("server pool for %s: %s", self.python, answer.get("error", "gone"))
            if not line:
                self.close()
            return None
        self.claims += 1
        return int(answer["pid"])

    def close(self) -> None:
        """Let the pool process go: it ends once the servers it started have ended."""
        self._ready.clear()
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class Pools:
    """The pools of one hub process, by environment python."""

    def __init__(self, limits: PoolLimits):
        self.limits = limits
        self._pools: dict[str, ServerPool] = {}
        #: environments whose pool did not start, with their packages then: not tried again
        #: until those change (their servers start cold meanwhile)
        self._failed: dict[str, tuple[int, ...]] = {}

    async def claim(
        self, python: str | None, env: dict[str, str], request: dict[str, Any]
    ) -> int | None:
        """A pooled server for ``request`` in ``python``'s environment, or None (cold start);
        starts, replaces or retires pool processes as needed."""
        if not self.limits.enabled or python is None:
            return None
        if python in self._failed and self._failed[python] == signature(python):
            return None
        pool = self._pools.get(python)
        if pool is not None and (not pool.alive or pool.stale() or pool.env != env):
            pool.close()
            del self._pools[python]
            pool = None
        if any(request["env"].get(k) != env.get(k) for k in IMPORT_ENV):
            return None
        if pool is None:
            pool = await self._add(python, env)
        if pool is None:
            return None
        pid = await pool.claim(request)
        if pid is None and not pool.ready:
            self._failed[python] = pool.started_with
        return pid

    async def _add(self, python: str, env: dict[str, str]) -> ServerPool | None:
        if available_mb() < self.limits.min_available_mb:
            log.info("server pool for %s not started: too little memory available", python)
            return None
        while len(self._pools) >= self.limits.max_pools:
            oldest = min(self._pools.values(), key=lambda p: p.used_at)
            oldest.close()
            del self._pools[oldest.python]
        pool = ServerPool(python, env)
        self._pools[python] = pool
        await pool.start()
        return pool

    async def warm(self, python: str | None, env: dict[str, str]) -> None:
        """Start ``python``'s pool ahead of its first claim (the default environment's, at
        the hub's start)."""
        if self.limits.enabled and python is not None and python not in self._pools:
            await self._add(python, env)


_pools: Pools | None = None


def hub_pools(limits: PoolLimits) -> Pools:
    """The pools of this hub process (one set, whichever spawner asks first)."""
    global _pools
    if _pools is None or _pools.limits != limits:
        _pools = Pools(limits)
    return _pools


def warm_pool(limits: PoolLimits, python: str | None, env: dict[str, str]) -> None:
    """At the hub's start (its configuration is loaded in its event loop): start ``python``'s
    pool. Nothing outside a running loop (a check of the settings)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    loop.call_soon(lambda: asyncio.ensure_future(hub_pools(limits).warm(python, env)))


def python_of(singleuser: str) -> str | None:
    """The Python that runs an environment's jupyterhub-singleuser (beside it, else its
    ``#!`` line's), or None where it is not run by Python (a wrapper script: its servers
    start cold)."""
    beside = Path(singleuser).parent / "python"
    if beside.exists():
        return str(beside)
    interpreter = interpreter_of(singleuser) or ""
    return interpreter if Path(interpreter).name.startswith("python") else None
