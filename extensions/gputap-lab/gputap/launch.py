"""``gputap.run``: PyTorch's elastic launcher (``torchrun``) on the notebook and every worker of
the group, each rank's output streamed into the cell, every rank stopped on interrupt.

The notebook hosts the rendezvous (``--rdzv-backend=c10d --rdzv-endpoint=<notebook>:<port>``)
and the same command, from the same folder, runs through each worker's agent. Lines a rank
prints come as ``[rank K] …``; the launchers' own lines as ``[notebook] …`` and ``[wN] …``.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from .group import Group, GroupError, Hub, scale
from .group import workers as current_group

#: what torchrun puts before each line a rank prints (its own template variables)
RANK_PREFIX = "[rank ${rank}] "
#: how long the launchers wait for every node at the rendezvous
JOIN_TIMEOUT_SECONDS = 120


class RunFailed(RuntimeError):
    """A node's launcher ended with an error, or a worker was lost; ``exits`` per node."""

    def __init__(self, message: str, exits: Mapping[str, int | None]):
        super().__init__(message)
        self.exits = dict(exits)


@dataclass
class RunResult:
    """How each node's launcher ended (``notebook``, ``w1``, …: their exit codes)."""

    exits: dict[str, int | None] = field(default_factory=dict)
    run_id: str = ""


def _loopback(host: str) -> bool:
    return host.startswith("127.") or host in ("localhost", "::1")


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def launcher_args(
    script: str,
    args: Sequence[str],
    *,
    nodes: int,
    endpoint: str,
    run_id: str,
    local_addr: str,
    nproc_per_node: int,
    max_restarts: int,
) -> list[str]:
    """The ``torchrun`` arguments of one node. With restarts the group may go on smaller
    (``--nnodes=1:N``) after a worker is lost; without, every node must be there."""
    nnodes = f"1:{nodes}" if max_restarts else str(nodes)
    return [
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={run_id}",
        f"--rdzv-conf=join_timeout={JOIN_TIMEOUT_SECONDS},last_call_timeout=5",
        f"--local-addr={local_addr}",
        f"--max-restarts={max_restarts}",
        "--tee=3",
        script,
        *args,
    ]


def node_env(hosts: Sequence[str]) -> dict[str, str]:
    """What every node's launcher gets: the rank prefix, and on one machine (every address
    a loopback one) gloo on the loopback interface."""
    env = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": RANK_PREFIX, "PYTHONUNBUFFERED": "1"}
    if all(_loopback(h) for h in hosts):
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


class _Printer:
    """Lines from every node into one stream, whole lines at a time."""

    def __init__(self, out: TextIO):
        self.out = out
        self.lock = threading.Lock()

    def line(self, node: str, text: str) -> None:
        text = text.rstrip("\n")
        if not text.startswith("[rank "):
            text = f"[{node}] {text}"
        with self.lock:
            print(text, file=self.out, flush=True)


class _Remote:
    """One worker's launcher, run by its agent; its output read on a thread."""

    def __init__(self, worker: Mapping[str, Any], token: str, body: dict[str, Any]):
        self.name = worker["name"]
        self.host, self.port = worker["host"], int(worker["port"])
        self.headers = {"Authorization": f"token {token}", "Content-Type": "application/json"}
        self.body = body
        self.exit: int | None = None
        self.lost = ""
        self._connection: http.client.HTTPConnection | None = None

    def run(self, printer: _Printer) -> None:
        connection = self._connection = http.client.HTTPConnection(self.host, self.port)
        try:
            connection.request("POST", "/run", json.dumps(self.body), self.headers)
            response = connection.getresponse()
            if response.status != 200:
                self.lost = f"its agent refused the job ({response.status})"
                return
            for raw in response:
                message = json.loads(raw)
                if "out" in message:
                    printer.line(self.name, message["out"])
                elif "exit" in message:
                    self.exit = message["exit"]
        except (OSError, ValueError, http.client.HTTPException) as e:
            self.lost = f"the connection to it was lost ({e or type(e).__name__})"
        finally:
            connection.close()
        if self.exit is None and not self.lost:
            self.lost = "it went away before its launcher ended"

    def cancel(self) -> None:
        """The agent ends the job when its caller goes: cut the stream."""
        connection = self._connection
        if connection is not None and connection.sock is not None:
            try:
                connection.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def run(
    script: str,
    *args: str,
    workers: int | None = None,
    gpus: int | None = None,
    nproc_per_node: int | None = None,
    max_restarts: int = 0,
    hub: Hub | None = None,
    out: TextIO | None = None,
    say: Callable[[str], None] | None = None,
) -> RunResult:
    """Run ``script`` with ``torchrun`` across the notebook and the group's ready workers.

    ``workers``: make the group that size first (running workers are reused). ``gpus``: GPUs
    per worker when it scales. ``nproc_per_node``: processes per node (default: the node's
    GPUs, at least one). ``max_restarts``: torchrun's restarts after a failure. Raises
    RunFailed naming the node that failed (and KeyboardInterrupt after stopping every rank)."""
    hub = hub or Hub()
    out = out or sys.stdout
    group = scale(workers, gpus, hub=hub, say=say) if workers else _current(hub)
    ready = group.ready
    nodes = 1 + len(ready)
    host = group.rendezvous_host
    run_id = uuid.uuid4().hex[:12]
    endpoint = f"{host}:{free_port(host)}"
    procs = nproc_per_node or max(1, int(os.environ.get("GPUTAP_GPU_COUNT") or 0))
    common = {"nodes": nodes, "endpoint": endpoint, "run_id": run_id,
              "nproc_per_node": procs, "max_restarts": max_restarts}  # fmt: skip
    env = node_env([host, *(w["host"] for w in ready)])
    cwd = os.getcwd()
    printer = _Printer(out)
    remotes = [
        _Remote(
            w,
            group.token,
            {
                "argv": ["python", *launcher_args(script, args, local_addr=w["host"], **common)],
                "env": env,
                "cwd": cwd,
            },
        )
        for w in ready
    ]
    local = subprocess.Popen(
        [sys.executable, *launcher_args(script, args, local_addr=host, **common)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, **env},
        cwd=cwd,
        start_new_session=True,
        text=True,
        bufsize=1,
    )
    threads = [threading.Thread(target=_read_local, args=(local, printer), daemon=True)]
    threads += [threading.Thread(target=r.run, args=(printer,), daemon=True) for r in remotes]
    for thread in threads:
        thread.start()
    try:
        local.wait()
        for thread in threads:
            thread.join()
    except KeyboardInterrupt:
        _stop_all(local, remotes, threads)
        printer.line("gputap", "interrupted: every rank was stopped")
        raise
    failed = _failure(local.returncode, remotes)
    if failed:
        raise failed
    return RunResult({"notebook": local.returncode, **{r.name: r.exit for r in remotes}}, run_id)


def _failure(local_exit: int | None, remotes: Sequence[_Remote]) -> RunFailed | None:
    """What went wrong, node by node (no token: it is printed into the notebook)."""
    exits: dict[str, int | None] = {"notebook": local_exit}
    exits.update({r.name: r.exit for r in remotes})
    problems = [f"{r.name}: {r.lost}" for r in remotes if r.lost]
    problems += [f"{node} exited with code {code}" for node, code in exits.items() if code]
    return RunFailed(f"The run failed: {'; '.join(problems)}.", exits) if problems else None


def _current(hub: Hub) -> Group:
    group = current_group(hub)
    if not group.ready:
        raise GroupError(
            "This server has no ready workers: gputap.run(…, workers=2) starts two, or use the "
            "Scale out section of the gputap panel."
        )
    return group


def _read_local(proc: subprocess.Popen, printer: _Printer) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        printer.line("notebook", line)


def _stop_all(local: subprocess.Popen, remotes: list[_Remote], threads) -> None:
    for remote in remotes:
        remote.cancel()
    try:
        os.killpg(local.pid, signal.SIGTERM)
        local.wait(5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(local.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    local.wait()
    for thread in threads:
        thread.join(10)
