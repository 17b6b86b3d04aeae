"""What is left of a server after it ended, found by the mark every process of it carries.

The reaper (reaper.py) ends everything a server started, daemons included, before the
devices go back. When the reaper itself is killed outright (``kill -9`` of the pid the hub
records), its adoptees are re-parented to init and nothing ends them: the GPU would go to the
next server while they still run on it. Each server's environment carries
``GPUTAP_START=<its billing session id>``, inherited by every process it starts; when the
hub finds the server ended it ends every process still carrying that mark before the
devices are released.

Read from /proc (environ of processes of the hub's own user, or of anyone when the hub runs
as root); a process that cleared its own environment escapes this sweep, not the reaper.
"""

from __future__ import annotations

import os
import signal
import time

MARK = "GPUTAP_START"


def marked(mark: str, environ: bytes) -> bool:
    """Whether a process's raw ``/proc/PID/environ`` holds ``MARK=mark`` exactly."""
    return f"{MARK}={mark}".encode() in environ.split(b"\0")


def marked_processes(mark: str) -> list[int]:
    """The pids of live processes carrying ``mark`` (none for an empty mark)."""
    if not mark:
        return []
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
        except OSError:
            continue  # gone, or not ours to read
        if marked(mark, environ):
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :][:1] != b"Z"


def end_marked(mark: str, timeout: float = 5.0) -> list[int]:
    """SIGKILL every process carrying ``mark`` and wait until they are gone; the pids that
    were still alive at ``timeout`` (an uninterruptible sleep), for the log."""
    pids = marked_processes(mark)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout
    left = [pid for pid in pids if _alive(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [pid for pid in left if _alive(pid)]
    return left
