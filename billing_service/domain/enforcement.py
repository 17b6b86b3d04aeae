"""Enforcement, pure: which servers must stop before the money paying for them runs out.

Data disks (storage sessions) are never stopped: their cost counts in how fast the money
drains, so servers beside them stop sooner, but a disk stays, and with disks alone the
balance may go below zero (new servers are then refused at admission).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime

from .money import cost_micro
from .records import AccountState, SessionRecord


def sessions_to_stop(
    accounts: Iterable[AccountState], now: datetime, interval_seconds: float
) -> list[SessionRecord]:
    """Open server sessions whose money would not last until the next check.

    Sessions are judged by what pays for them (``AccountState.funding_groups``): a course's
    sessions its allowance alone pays run out with that allowance; the others with the
    account's credit. A group's servers are stopped when what it has <= what it costs in one
    interval, data disks' cost included; its disks are never stopped.
    """
    stop: list[SessionRecord] = []
    for account in accounts:
        for _, available, sessions in account.funding_groups(now):
            rate = sum(s.rate_per_hour_micro for s in sessions)
            if available <= cost_micro(rate, 1, math.ceil(interval_seconds)):
                stop.extend(s for s in sessions if not s.is_storage)
    return stop
