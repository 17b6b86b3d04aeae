"""``python -m hub_config.with_hub PID -- COMMAND ...``: run COMMAND so that it ends when
process PID, the one that started it, dies, however it dies.

JupyterHub starts its managed services (billing, the idle culler) in sessions of their own, so
that they never get the hub's signals; when the hub stops they are stopped by its cleanup.
A hub killed outright (``kill -9``, the out-of-memory killer) cleans nothing up: its billing
kept the port, and the next hub's billing failed on it every 30 s. Put before a command, this
module asks Linux to send the command SIGTERM when its parent dies (PR_SET_PDEATHSIG, kept
across exec), gives SIGINT back its default (a script's background job has it ignored), then
becomes the command. `make demo` starts the hub the same way, so a demo
killed outright stops its hub, which stops the rest. Elsewhere than Linux it only runs the
command.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def with_hub(parent_pid: int | None = None) -> list[str]:
    """The command prefix tying what follows to ``parent_pid`` (this process by default:
    the hub reads its configuration in its own process)."""
    pid = os.getpid() if parent_pid is None else parent_pid
    return [sys.executable, "-m", "hub_config.with_hub", str(pid), "--"]


def _die_with_parent() -> None:
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def main(argv: list[str]) -> int:
    if len(argv) < 3 or not argv[0].isdigit() or argv[1] != "--":
        print("usage: python -m hub_config.with_hub PID -- COMMAND ...", file=sys.stderr)
        return 2
    parent, command = int(argv[0]), argv[2:]
    _die_with_parent()
    if os.getppid() != parent:
        # the parent died before the request took effect: nobody is left to serve
        print(f"with_hub: process {parent} is gone; not starting {command[0]}", file=sys.stderr)
        return 1
    # A shell runs a script's background jobs with SIGINT ignored, and an ignored signal stays
    # ignored across exec: the hub's stop of a service (SIGINT first) then waited its
    # interrupt timeout, and Ctrl-C of a demo started from a script took a minute. The
    # command gets SIGINT's default, so a Python command gets its KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.execvp(command[0], command)
    return 127  # not reached: exec replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
