"""Reconciliation with the hub, pure: which open sessions to close because the hub no longer
runs their server, and where they end. The rule, also in docs/billing.md:

- a session whose server the hub reports neither running nor starting, at two checks in a
  row, is closed;
- at the last time billing saw the hub (or the cluster) report it (``last_seen_at``, kept in
  the database, so a restart of billing does not forget it), or at its start if it never did
  (billing does not charge time it cannot vouch for);
- a pass that cannot read the hub closes nothing;
- data disks' storage sessions are no servers: they are never looked up or closed here (the
  hub stops them when it deletes the disk).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from .records import SessionRecord

#: checks in a row a server must be missing before its session is closed
MISSING_CHECKS = 2


def sessions_to_close(
    sessions: Iterable[SessionRecord],
    present: set[tuple[str, str]],
    seen: dict[str, datetime],
    missing: dict[str, int],
    now: datetime,
) -> list[tuple[SessionRecord, datetime]]:
    """Update ``seen`` / ``missing`` from one look at the hub; return (session, end) pairs.

    Storage sessions (data disks) are skipped: the hub runs no server for them."""
    close = []
    open_ids = set()
    for session in sessions:
        if session.is_storage:
            continue
        open_ids.add(session.id)
        if (session.username, session.server_name) in present:
            seen[session.id] = now
            missing.pop(session.id, None)
            continue
        missing[session.id] = missing.get(session.id, 0) + 1
        if missing[session.id] >= MISSING_CHECKS:
            last = seen.get(session.id) or session.last_seen_at or session.started_at
            ended_at = max(last, session.started_at)
            close.append((session, ended_at))
    for gone in [sid for sid in seen if sid not in open_ids]:
        del seen[gone]
    for gone in [sid for sid in missing if sid not in open_ids]:
        del missing[gone]
    return close
