"""First come, first served waiting for sold-out cards and slices, one line per offering.

A spawn that finds nothing free and asked to wait joins the line of the offering it wants;
whenever the inventory changes the head of each line is woken if enough is free for it. Only
the head may take what frees up, so nobody jumps the line. Pure asyncio, no I/O.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .placement import FreeView


@dataclass
class Waiter:
    holder: str
    key: str
    count: int
    woken: asyncio.Event = field(default_factory=asyncio.Event)
    #: a server that lost its GPU to a fault: it waits ahead of new spawns
    front: bool = False


class WaitQueues:
    """Lines of waiting spawns per offering key."""

    def __init__(self) -> None:
        self.lines: dict[str, list[Waiter]] = {}

    def join(self, holder: str, key: str, count: int, front: bool = False) -> Waiter:
        """Join the end of the line (``front``: behind only those who joined at the front:
        servers the platform broke wait ahead of new spawns)."""
        self.leave(holder)
        waiter = Waiter(holder, key, count, front=front)
        line = self.lines.setdefault(key, [])
        at = sum(1 for w in line if w.front) if front else len(line)
        line.insert(at, waiter)
        return waiter

    def join_if_absent(self, holder: str, key: str, count: int, front: bool = False) -> Waiter:
        """The holder's place in line, joining if not there yet."""
        for waiter in self.lines.get(key, ()):
            if waiter.holder == holder:
                return waiter
        return self.join(holder, key, count, front)

    def leave(self, holder: str) -> None:
        for key, line in list(self.lines.items()):
            line[:] = [w for w in line if w.holder != holder]
            if not line:
                del self.lines[key]

    def position(self, holder: str) -> int | None:
        """1 for the head of its line, None when not waiting."""
        for line in self.lines.values():
            for index, waiter in enumerate(line):
                if waiter.holder == holder:
                    return index + 1
        return None

    def waiting(self, key: str) -> int:
        return len(self.lines.get(key, ()))

    def is_head(self, holder: str, key: str) -> bool:
        line = self.lines.get(key)
        return bool(line) and line[0].holder == holder

    def poke(self, view: FreeView) -> None:
        """Wake the head of every line whose request fits in what is free now."""
        for key, line in self.lines.items():
            head = line[0]
            if view.max_free(key) >= head.count:
                head.woken.set()


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
