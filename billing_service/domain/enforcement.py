"""Enforcement, pure: which servers and workers must stop before the money paying for them
runs out.

A group that runs short loses its scale-out workers first: a worker is extra hardware beside
a server, and stopping it keeps the notebook (and its kernel's state) running. The group's
servers stop in the same pass only if the group would still run short without its workers.

Data disks (storage sessions) are never stopped: their cost counts in how fast the money
drains, so servers beside them stop sooner, but a disk stays, and with disks alone the
balance may go below zero (new servers are then refused at admission).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import datetime

from .money import cost_micro
from .records import AccountState, SessionRecord


def _short(available: int, sessions: Iterable[SessionRecord], interval_seconds: float) -> bool:
    """Whether ``available`` would not last ``sessions`` until the next check."""
    rate = sum(s.rate_per_hour_micro for s in sessions)
    return available <= cost_micro(rate, 1, math.ceil(interval_seconds))


def group_to_stop(
    available: int, sessions: Sequence[SessionRecord], interval_seconds: float
) -> list[SessionRecord]:
    """What one funding group stops now: nothing while ``available`` lasts past the next
    check; else its workers, and its servers too when, with the workers gone, it would still
    not last (what stopped workers cost so far stays spent: ``available`` already counts it).
    """
    if not _short(available, sessions, interval_seconds):
        return []
    workers = [s for s in sessions if s.is_worker and not s.is_storage]
    servers = [s for s in sessions if not s.is_worker and not s.is_storage]
    if workers:
        left = [s for s in sessions if not s.is_worker]
        if not _short(available, left, interval_seconds):
            return workers
    return workers + servers


def sessions_to_stop(
    accounts: Iterable[AccountState], now: datetime, interval_seconds: float
) -> list[SessionRecord]:
    """Open server and worker sessions whose money would not last until the next check,
    workers before servers (:func:`group_to_stop`).

    Sessions are judged by what pays for them (``AccountState.funding_groups``): a course's
    sessions its allowance alone pays run out with that allowance; the others with the
    account's credit. A group runs short when what it has <= what it costs in one interval,
    data disks' cost included; its disks are never stopped.
    """
    stop: list[SessionRecord] = []
    for account in accounts:
        for _, available, sessions in account.funding_groups(now):
            stop.extend(group_to_stop(available, sessions, interval_seconds))
    return stop
