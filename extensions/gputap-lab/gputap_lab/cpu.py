"""How much CPU a server's own processes (its kernels, its terminals' jobs, what they started)
use, for the GPU-aware idle rule on MIG slices that count no activity of their own (A100,
A30): a training loop feeding its GPU keeps a CPU busy, a finished context does not
(docs/lab.md, "GPU-aware idle").

Read from /proc: the live descendants' CPU time, plus what the kernel added to the server's
own account for descendants that ended and were waited for. The server's process itself is
left out: answering the panel or the hub is not work on the GPU. Elsewhere than Linux there is
no reading (None).
"""

from __future__ import annotations

import os
import time

TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/PID/stat after the command's name (from the state on)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None  # gone meanwhile, or not Linux
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses
    return stat[stat.rfind(b")") + 2 :].split()


def tree_cpu_seconds(root: int) -> float | None:
    """CPU seconds of ``root``'s descendants, live and ended (not ``root``'s own)."""
    own = stat_fields(root)
    if own is None:
        return None
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(entry)
        if fields is None or fields[0] == b"Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        ticks[int(entry)] = int(fields[11]) + int(fields[12])  # utime + stime
    live, todo = 0, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            live += ticks.get(child, 0)
            todo.append(child)
    ended = int(own[13]) + int(own[14])  # cutime + cstime: waited-for descendants
    return (live + ended) / TICKS_PER_SECOND


class ProcessTreeCPU:
    """The CPU use of ``root``'s descendants between two readings, in percent of one CPU."""

    def __init__(self, root: int):
        self.root = root
        self._last: tuple[float, float] | None = None

    def percent(self) -> float | None:
        """Percent of one CPU since the previous call; None at the first call, or where
        nothing can be read."""
        seconds = tree_cpu_seconds(self.root)
        now = time.monotonic()
        if seconds is None:
            self._last = None
            return None
        last, self._last = self._last, (now, seconds)
        if last is None or now <= last[0]:
            return None
        # a descendant that ended but is not waited for yet drops out for a moment: never < 0
        return max(0.0, seconds - last[1]) / (now - last[0]) * 100
