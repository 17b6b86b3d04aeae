"""Reconciliation with the hub, pure: which open sessions to close because the hub no longer
runs their server, and where they end. The rule, also in docs/billing.md:

- a session whose server the hub reports neither running nor starting, at two checks in a
  row, is closed;
- at the last time billing saw the hub (or the cluster) report it (``last_seen_at``, kept in
  the database, so a restart of billing does not forget it), or at its start if it never did
  (billing does not charge time it cannot vouch for);
- a pass that cannot read the hub closes nothing;
- data disks' storage sessions are no servers: they are never looked up or closed here (the
  hub stops them when it deletes the disk);
- a scale-out worker's session is judged by its server's workers as the hub lists them
  (:func:`workers_seen`), never by the server's own state, and a server's session never by
  its workers': one whose worker is not listed (or the server is gone), or is listed
  ``failed`` or ``stopped``, at two checks in a row, is closed at the worker's ``ended_at``
  when the hub gives one, else as a server's. A worker listed under the same name with
  another session id is a later worker of that name: this session's is gone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .records import SessionRecord

#: worker states whose worker no longer runs (its session ends)
WORKER_ENDED = frozenset({"failed", "stopped"})


@dataclass(frozen=True)
class WorkerSeen:
    """One worker of a server as the hub's workers API lists it."""

    name: str
    state: str
    session_id: str | None
    ended_at: datetime | None


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return None
    return at if at.tzinfo is not None else None


def workers_seen(answer: Mapping[str, Any]) -> dict[str, WorkerSeen]:
    """The hub's ``GET {server}/workers`` answer as workers by name (entries it cannot read
    are left out, which counts as not there)."""
    seen = {}
    for worker in answer.get("workers") or []:
        if not isinstance(worker, Mapping) or not isinstance(worker.get("name"), str):
            continue
        session_id = worker.get("session_id")
        seen[worker["name"]] = WorkerSeen(
            name=worker["name"],
            state=str(worker.get("state") or ""),
            session_id=session_id if isinstance(session_id, str) and session_id else None,
            ended_at=_time(worker.get("ended_at")),
        )
    return seen


def _worker_running(
    session: SessionRecord, workers: Mapping[str, WorkerSeen]
) -> tuple[bool, datetime | None]:
    """(whether the session's worker still runs, its end when the hub gives one)."""
    worker = workers.get(session.worker)
    if worker is None or (worker.session_id is not None and worker.session_id != session.id):
        return False, None
    if worker.state in WORKER_ENDED:
        return False, worker.ended_at
    return True, None


#: checks in a row a server must be missing before its session is closed
MISSING_CHECKS = 2


def sessions_to_close(
    sessions: Iterable[SessionRecord],
    present: set[tuple[str, str]],
    seen: dict[str, datetime],
    missing: dict[str, int],
    now: datetime,
    workers: Mapping[tuple[str, str], Mapping[str, WorkerSeen]] | None = None,
) -> list[tuple[SessionRecord, datetime]]:
    """Update ``seen`` / ``missing`` from one look at the hub; return (session, end) pairs.

    ``present``: the (user, server) pairs the hub has; ``workers``: the workers listed per
    (user, server) of the open worker sessions (an empty list for a server that is gone); a
    worker session whose server was not looked up is left as it is. Storage sessions (data
    disks) are skipped: the hub runs no server for them."""
    close = []
    open_ids = set()
    for session in sessions:
        if session.is_storage:
            continue
        open_ids.add(session.id)
        key = (session.username, session.server_name)
        ended_at = None
        if session.is_worker:
            if workers is None or key not in workers:
                continue
            running, ended_at = _worker_running(session, workers[key])
        else:
            running = key in present
        if running:
            seen[session.id] = now
            missing.pop(session.id, None)
            continue
        missing[session.id] = missing.get(session.id, 0) + 1
        if missing[session.id] >= MISSING_CHECKS:
            last = ended_at or seen.get(session.id) or session.last_seen_at or session.started_at
            close.append((session, max(last, session.started_at)))
    for gone in [sid for sid in seen if sid not in open_ids]:
        del seen[gone]
    for gone in [sid for sid in missing if sid not in open_ids]:
        del missing[gone]
    return close
