"""The server pool's process: one per server environment, in that environment's own Python.

It imports jupyter_server, JupyterLab, jupyterhub-singleuser and the server extensions once
(the ~4 s every cold start spends; docs/instant-start.md), then serves claims from the hub,
one line of JSON each on the socket it was given (``--fd``)::

    {"argv": [...], "env": {...}, "home": "...", "account": {...} | null,
     "plan": {...} | null, "links": {...} | null}

For each claim it forks a child that becomes what a cold start's process is: its own session,
exactly the claim's environment (nothing of the pool's), the server's view of the machine's
folders and its Unix account (view.py, accounts.py), and the reaper of everything it starts
(reaper.py), whose own child then runs jupyterhub-singleuser in-process with the claim's
arguments. It answers ``{"pid": PID}`` (the reaper's pid, which the hub records and signals)
or ``{"error": "..."}``. The pool process itself never runs a server nor any user's code:
every claim is a fresh fork of a process that only imported, so nothing of one user's ever
reaches another's.

It ends when the hub's end of the socket closes, once its children (running servers, which
outlive hub restarts) have ended. Only the standard library and the environment's own
packages are imported: gputap's modules come from the checkout (``-P`` and a path).

    PYTHON -P -c "BOOT" --fd N --checkout DIR
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import select
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

PR_SET_MM = 35
PR_SET_MM_MAP = 14
#: what a server's start imports, imported once here (missing ones are skipped: an
#: environment need not have them all)
PRELOAD = (
    "jupyterhub.singleuser",
    "jupyter_server.serverapp",
    "jupyterlab",
    "jupyterlab.labapp",
    "jupyter_server_proxy",
    "gputap_lab",
    "notebook_shim",
    "jupyter_lsp",
    "jupyter_server_terminals",
    "terminado",
    "ipykernel.kernelspec",
)


def preload() -> list[str]:
    """Import what a server imports; the modules that could not be."""
    missing = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # an environment without it: its servers do not need it either
            missing.append(name)
    return missing


def serve(argv: list[str]) -> int:
    """Run jupyterhub-singleuser with ``argv`` in this process (as its script would)."""
    sys.argv = list(argv)
    from jupyterhub.singleuser import main

    return main() or 0


class _MmMap(ctypes.Structure):
    """Linux's ``struct prctl_mm_map`` (prctl(2), PR_SET_MM_MAP)."""

    _fields_ = [
        *[
            (name, ctypes.c_uint64)
            for name in (
                "start_code", "end_code", "start_data", "end_data", "start_brk", "brk",
                "start_stack", "arg_start", "arg_end", "env_start", "env_end", "auxv",
            )
        ],
        ("auxv_size", ctypes.c_uint32),
        ("exe_fd", ctypes.c_uint32),
    ]  # fmt: skip


#: the pipe SIGCHLD wakes the pool's loop through (read end, write end)
_wake_pipe: list[int] = []
#: the claimed process's new command line and environment (never freed: the kernel reads them)
_regions: list[ctypes.Array] = []


def rebirth(argv: list[str], env: dict[str, str]) -> bool:
    """Make /proc/PID/cmdline and /proc/PID/environ say what a cold start's would: the
    process was forked, never exec'd, so the kernel still shows the pool's. The hub finds a
    start's leftovers by the mark in their environment (leftovers.py), and ``ps`` shows what
    runs. Whether the kernel took it."""
    stat = Path("/proc/self/stat").read_bytes()
    fields = stat[stat.rfind(b")") + 2 :].split()  # fields[0] is field 3 of proc(5)

    def field(n: int) -> int:
        return int(fields[n - 3])

    args = b"\0".join(a.encode() for a in argv) + b"\0"
    envs = b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0"
    arg_buf = ctypes.create_string_buffer(args, len(args))
    env_buf = ctypes.create_string_buffer(envs, len(envs))
    _regions.extend((arg_buf, env_buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.sbrk.restype = ctypes.c_void_p
    mm = _MmMap(
        start_code=field(26), end_code=field(27), start_data=field(45), end_data=field(46),
        start_brk=field(47), brk=libc.sbrk(0) or field(47), start_stack=field(28),
        arg_start=ctypes.addressof(arg_buf), arg_end=ctypes.addressof(arg_buf) + len(args),
        env_start=ctypes.addressof(env_buf), env_end=ctypes.addressof(env_buf) + len(envs),
        auxv=0, auxv_size=0, exe_fd=0xFFFFFFFF,
    )  # fmt: skip
    return libc.prctl(PR_SET_MM, PR_SET_MM_MAP, ctypes.byref(mm), ctypes.sizeof(mm), 0) == 0


def refresh_home_defaults() -> None:
    """Defaults a module computed from the pool's home as it was imported, computed again for
    the claimed server's: JupyterLab's user settings and workspaces folders (LabApp's trait
    defaults are evaluated when its class is defined)."""
    labapp = sys.modules.get("jupyterlab.labapp")
    if labapp is None:
        return
    from jupyterlab.commands import get_user_settings_dir, get_workspaces_dir

    app = labapp.LabApp
    traits = app.class_traits()
    # traitlets keeps a class's static defaults in a cache of its own as well
    cached = getattr(app, "_static_immutable_initial_values", {})
    for name, value in (
        ("user_settings_dir", get_user_settings_dir()),
        ("workspaces_dir", get_workspaces_dir()),
    ):
        traits[name].default_value = value
        if name in cached:
            cached[name] = value


def become(claim: dict[str, Any]) -> None:
    """In the claimed child: what a cold start's process does before it execs."""
    from spawner.local import view
    from spawner.local.accounts import Account
    from spawner.local.reaper import reaper_command

    os.setsid()
    os.environ.clear()
    os.environ.update(claim["env"])
    if not rebirth([*reaper_command(), *claim["argv"]], claim["env"]):
        print("gputap pool: /proc shows the pool's command line for this server", file=sys.stderr)
    if claim.get("plan"):
        view.enter(view.Plan.from_json(claim["plan"]))
    account = claim.get("account")
    if account:
        from spawner.local import home_links

        Account.from_json(account).become()
        if claim.get("links"):
            home_links.make(claim["links"])
    else:
        os.makedirs(claim["home"], 0o700, exist_ok=True)
        os.chdir(claim["home"])
    refresh_home_defaults()


def start(claim: dict[str, Any], channel: socket.socket) -> int:
    """Fork the claimed server's process; its pid (in the parent)."""
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        # the hub's channel, here for good: its reader keeps the socket open past close()
        os.close(channel.detach())
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)  # the pool's own wake-up pipe is not the server's
        for fd in _wake_pipe:
            os.close(fd)
        become(claim)
        from spawner.local import reaper

        code = reaper.run_with(lambda: serve(claim["argv"]))
    except BaseException as e:
        print(f"gputap pool: the claimed server did not start: {e}", file=sys.stderr)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def reap(children: set[int]) -> None:
    while children:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)


def run(channel: socket.socket) -> None:
    """Answer claims until the hub's end closes; then wait for the servers started. A child
    that ended is reaped at once (SIGCHLD wakes the loop): until then its pid would still
    answer the hub's liveness check, as a zombie."""
    children: set[int] = set()
    reader = channel.makefile("rb")
    wake_read, wake_write = _wake_pipe[:] = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    channel.sendall(b'{"ready": true}\n')
    while True:
        ready, _, _ = select.select([channel, wake_read], [], [], 1.0)
        if wake_read in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_read, 512)
        reap(children)
        if channel not in ready:
            continue
        line = reader.readline()
        if not line:
            break
        try:
            pid = start(json.loads(line), channel)
        except Exception as e:  # a claim that cannot be forked is the hub's cold start
            channel.sendall(json.dumps({"error": str(e)[:300]}).encode() + b"\n")
            continue
        children.add(pid)
        channel.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    channel.close()
    while children:  # running servers keep their parent until they end
        reap(children)
        time.sleep(1.0)


def main(argv: list[str]) -> int:
    fd = int(argv[argv.index("--fd") + 1])
    sys.path.insert(0, str(Path(argv[argv.index("--checkout") + 1])))
    # the hub's Ctrl-C and stops are not the pool's: it ends when the hub's end closes
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    channel = socket.socket(fileno=fd)
    started = time.monotonic()
    missing = preload()
    without = f" (without {', '.join(missing)})" if missing else ""
    took = time.monotonic() - started
    print(
        f"gputap pool {os.getpid()} for {sys.prefix}: ready in {took:.2f} s{without}",
        file=sys.stderr,
        flush=True,
    )
    run(channel)
    return 0


#: the program the hub runs: the checkout's modules, never the current folder's (-P)
BOOT = (
    "import sys; sys.path.insert(0, sys.argv[sys.argv.index('--checkout') + 1]); "
    "from spawner.local import forkserver; sys.exit(forkserver.main(sys.argv))"
)
