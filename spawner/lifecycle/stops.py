"""Why a server stopped, in words a user acts on, and telling the server before it goes.

A :class:`StopReason` is recorded by whoever stops a server (gputap's stop endpoint knows
who asks: the user, an admin, billing, the idle culler; a change says so itself), or by the
spawner when the server went by itself. The spawner keeps it (its ``notice``, shown on the
hub's home page and the spawn form; the structured form in the hub's server view) and tells
the running server first (:func:`announce`), so the Lab page can say why instead of
"Server unavailable or unreachable" (docs/lab.md, "Why a server stopped").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPRequest

#: who stops servers for lack of credit, and for idleness (their JupyterHub service names)
BILLING_SERVICE = "billing"
IDLE_CULLER_SERVICE = "idle-culler"
#: where a single-user server's gputap-lab extension hears why it stops (under its base URL)
ANNOUNCE_PATH = "gputap/stopping"
#: how long a stop waits for the server to hear why: a server that does not answer in time
#: is stopped anyway (its page then shows the hub's reason after a reload)
ANNOUNCE_TIMEOUT_SECONDS = 3.0

START_AGAIN = "Start it again from the hub's home page; your files are kept."


@dataclass(frozen=True)
class StopReason:
    """Why a server stopped: ``kind`` (credit, idle, change, admin, user, hub, died,
    preempted, fault), what happened, what to do, and when."""

    kind: str
    message: str
    todo: str
    at: datetime

    @property
    def notice(self) -> str:
        """The one sentence the hub's pages show."""
        return f"{self.message} {self.todo}".strip()

    def view(self) -> dict[str, Any]:
        """As the hub's server view, the saved state and the announcement carry it."""
        return {
            "kind": self.kind,
            "message": self.message,
            "todo": self.todo,
            "at": self.at.isoformat(),
            "notice": self.notice,
            # a fault's server comes back by itself (Lab follows it and reloads)
            "restarting": self.kind == "fault" and self.todo == FAULT_RESTARTING,
        }

    @classmethod
    def from_view(cls, data: dict[str, Any]) -> StopReason:
        return cls(data["kind"], data["message"], data["todo"], datetime.fromisoformat(data["at"]))


#: a reason still to be dated: made when the stop is asked for, dated when it happens
Pending = Callable[[datetime], StopReason]


def clock_time(at: datetime) -> str:
    """``14:05 UTC``: a stop is read soon after it happens, so the day goes without saying."""
    return f"{at:%H:%M} UTC"


def _span(seconds: float) -> str:
    if seconds < 90:
        return f"{round(seconds)} seconds"
    minutes = round(seconds / 60)
    return f"{minutes} minute{'s' if minutes != 1 else ''}"


def by_user(at: datetime) -> StopReason:
    return StopReason("user", f"You stopped this server at {clock_time(at)}.", START_AGAIN, at)


def by_credit(at: datetime) -> StopReason:
    return StopReason(
        "credit",
        f"Your server was stopped at {clock_time(at)}: your credit ran out.",
        "Add credit on the billing page, then start again; your files are kept.",
        at,
    )


def by_idle(idle_seconds: float | None) -> Pending:
    """Stopped by the idle culler after ``idle_seconds`` without activity (None: unknown)."""

    def reason(at: datetime) -> StopReason:
        span = f" after {_span(idle_seconds)}" if idle_seconds is not None else ""
        return StopReason(
            "idle",
            f"Your server was stopped at {clock_time(at)}{span} without activity "
            "(no typing, running kernel or GPU work).",
            START_AGAIN,
            at,
        )

    return reason


def by_admin(name: str) -> Pending:
    """Stopped by ``name``, an admin (or a service other than billing and the culler)."""

    def reason(at: datetime) -> StopReason:
        return StopReason(
            "admin",
            f"An admin ({name}) stopped your server at {clock_time(at)}.",
            f"Start it again from the hub's home page, or ask {name} why; your files are kept.",
            at,
        )

    return reason


def by_membership(organizations: str) -> Pending:
    """Stopped because GitHub says the user is no longer a member of ``organizations``."""

    def reason(at: datetime) -> StopReason:
        return StopReason(
            "membership",
            f"You are no longer a member of {organizations} on GitHub: your server was "
            f"stopped at {clock_time(at)}.",
            "Your files are kept. Ask an owner to add you again, then sign in.",
            at,
        )

    return reason


def for_change(why: str) -> Pending:
    """Restarted by the user's own change (``why``: "change", "mount disk data", ...)."""

    def reason(at: datetime) -> StopReason:
        what = "a change of GPU" if why == "change" else f"a restart ({why})"
        return StopReason(
            "change",
            f"Your server is restarting at {clock_time(at)} for {what}.",
            "It comes back by itself; Lab reloads when it is up.",
            at,
        )

    return reason


def from_hub(at: datetime) -> StopReason:
    """A stop through JupyterHub's own API (its home and admin pages): who asked is unknown."""
    return StopReason(
        "hub",
        f"Your server was stopped from the hub at {clock_time(at)} (by you or an admin).",
        START_AGAIN,
        at,
    )


def died(at: datetime) -> StopReason:
    """The server exited by itself; ``at``: when it was last seen alive."""
    return StopReason(
        "died",
        f"Your server exited by itself at {clock_time(at)} (e.g. out of memory).",
        START_AGAIN,
        at,
    )


def preempted(text: str, at: datetime) -> StopReason:
    """A spot server made way for an on-demand one (``text`` says so and what to do)."""
    return StopReason("preempted", text, "", at)


def by_fault(detail: str, then: str) -> Pending:
    """The server's GPU failed (``detail``: what was seen, e.g. "XID 79 (GPU has fallen off
    the bus)"); billing ended at the detection second; ``then`` says what happens next, as
    :func:`fault_next` words it."""

    def reason(at: datetime) -> StopReason:
        # what matters first: Lab's notifications cut long messages (the panel shows all)
        return StopReason(
            "fault",
            f"The GPU of your server failed at {clock_time(at)}. Billing stopped at that "
            f"second. What failed: {detail}.",
            then,
            at,
        )

    return reason


#: what a fault notice says happens next (``restarting`` is the one the server comes back by)
FAULT_RESTARTING = (
    "gputap is starting your server again on a healthy GPU with your files, disks and "
    "environment; Lab reloads when it is back."
)
FAULT_NOT_RESTARTED = (
    "It was not started again: {why}. Start it from the hub's home page; your files are kept."
)


def fault_next(restarting: bool, why: str = "") -> str:
    """The ``todo`` of a fault notice: restarting, or why not (restarts turned off, the
    limit reached)."""
    return FAULT_RESTARTING if restarting else FAULT_NOT_RESTARTED.format(why=why)


def asked_by(
    service: str | None, user: str | None, owner: str, idle_seconds: float | None
) -> Pending:
    """The reason for a stop asked through gputap's stop endpoint, from who asked: a
    JupyterHub ``service`` by name, else ``user`` (the server's ``owner`` or someone else
    holding the scope: an admin)."""
    if service == BILLING_SERVICE:
        return by_credit
    if service == IDLE_CULLER_SERVICE:
        return by_idle(idle_seconds)
    if service is not None:
        return by_admin(f"service {service}")
    if user == owner:
        return by_user
    return by_admin(user or "unknown")


async def announce(
    server_url: str,
    token: str,
    reason: StopReason,
    log: logging.Logger,
    wait_seconds: float = ANNOUNCE_TIMEOUT_SECONDS,
) -> bool:
    """Tell the server at ``server_url`` why it stops, directly (its proxy route is already
    gone), with its own API token, waiting at most ``wait_seconds``. Failures are logged
    and ignored: the stop goes on."""
    request = HTTPRequest(
        server_url.rstrip("/") + "/" + ANNOUNCE_PATH,
        method="POST",
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
        body=json.dumps(reason.view()),
        request_timeout=wait_seconds,
        connect_timeout=wait_seconds,
        follow_redirects=False,
    )
    client = AsyncHTTPClient(force_instance=True)
    try:
        await client.fetch(request)
    except Exception as e:  # the server may be hung or already gone: it stops anyway
        log.info("could not tell the server why it stops (%s): %s", reason.kind, e)
        return False
    finally:
        client.close()
    return True
