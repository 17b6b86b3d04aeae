"""``python -P -m spawner.local.reaper -- COMMAND ...``: run a single-user server so that no
process it starts outlives it.

A kernel or a terminal can leave a daemon behind (double fork + setsid): it belongs to no
process group of the server, re-parents to init, and kept the previous user's GPU while the
hub gave the device to the next one. The one-machine backend starts every server under this
reaper (hub_config/hub.py puts it before the server's command):

- it becomes a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), so every orphaned
  descendant of the server re-parents to it instead of to init;
- the hub's signals (SIGINT, then SIGTERM: JupyterHub's LocalProcessSpawner.stop) go on to
  the server, which shuts down as it would without the reaper;
- the server gets SIGTERM when the reaper dies, even by kill -9 (``PR_SET_PDEATHSIG``): the
  hub then finds the pid it records gone, settles billing and frees the devices, and the
  server does not run on without them (its kernels end with it: they watch their parent);
- once the server has exited, every descendant left gets SIGTERM, then SIGKILL after
  ``GRACE_SECONDS``, and the reaper waits for them all before it exits with the server's
  status. The hub's stop waits for the reaper's pid, so the server's devices are free only
  when nothing it started runs any more.

The reaper stays in the server's session, so it survives hub restarts as the server does.
It runs as the server's user and imports nothing beyond the standard library.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: how long descendants left by the server have between SIGTERM and SIGKILL
GRACE_SECONDS = 3.0
#: how long the reaper waits for SIGKILLed processes to be gone (uninterruptible I/O)
KILL_WAIT_SECONDS = 10.0
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _prctl(option: int, value: int, what: str) -> None:
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({what}) failed")


def become_subreaper() -> None:
    _prctl(PR_SET_CHILD_SUBREAPER, 1, "PR_SET_CHILD_SUBREAPER")


def end_with(parent: int) -> None:
    """In the server's process: SIGTERM when ``parent`` (the reaper) dies, however it dies
    (kill -9 included; kept across exec), so the server ends its kernels and exits rather than
    run on, re-parented to init, unbilled and on a GPU the hub gives to someone else. A
    reaper already gone when that took effect ends the server now."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM, "PR_SET_PDEATHSIG")
    if os.getppid() != parent:
        os._exit(128 + signal.SIGTERM)


def descendants(root: int) -> list[int]:
    """Live (not zombie) processes below ``root``, read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(b")") + 2 :].split()
        if fields[0] == b"Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def reap() -> dict[int, int]:
    """Collect every exited child (orphans re-parented here included): pid -> status."""
    ended: dict[int, int] = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return ended
        if pid == 0:
            return ended
        ended[pid] = status


def end_all(me: int) -> list[int]:
    """SIGTERM every descendant, SIGKILL those left after GRACE_SECONDS, and wait until
    none is left (or KILL_WAIT_SECONDS passed); the pids still alive then."""
    for sig, wait in ((signal.SIGTERM, GRACE_SECONDS), (signal.SIGKILL, KILL_WAIT_SECONDS)):
        left = descendants(me)
        deadline = time.monotonic() + wait
        while left:
            for pid in left:  # again each round: a daemon may have forked meanwhile
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
            reap()
            left = descendants(me)
            if time.monotonic() > deadline:
                break
        if not left:
            return []
    return left


def run(command: list[str]) -> int:
    """Run ``command`` as the reaper of everything it starts; its exit status."""

    def execute() -> int:
        try:
            os.execvp(command[0], command)
        except OSError as e:
            print(f"reaper: cannot run {command[0]}: {e}", file=sys.stderr)
        return 127

    return run_with(execute)


def run_with(serve: Callable[[], int]) -> int:
    """Run ``serve`` in a child process as the reaper of everything it starts (an exec, or
    a server in the process itself: the server pool's forkserver.py); its exit status."""
    become_subreaper()
    me = os.getpid()
    # the server's apps proxy reaches only ports of this tree (gputap_lab/ports.py)
    os.environ["GPUTAP_REAPER_PID"] = str(me)
    server = os.fork()
    if server == 0:
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        code = 1
        try:
            end_with(me)
            code = serve()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # whatever it was, the server's process ends here
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)

    def forward(sig: int, _frame) -> None:
        try:
            os.kill(server, sig)
        except ProcessLookupError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    status = None
    while status is None:
        try:
            pid, code = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if pid == server:
            status = code
    # the server is gone: nothing it started may outlive it
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_IGN)
    left = end_all(os.getpid())
    if left:
        print(f"reaper: processes {left} did not end after SIGKILL", file=sys.stderr)
    if status is None:
        return 1
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as a shell says


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--":
        print("usage: python -P -m spawner.local.reaper -- COMMAND ...", file=sys.stderr)
        return 2
    return run(argv[1:])


def reaper_command() -> list[str]:
    """The prefix that runs a server's command under the reaper (``-P``: never a module of
    the folder it starts in, the user's home)."""
    return [sys.executable, "-P", "-m", "spawner.local.reaper", "--"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
