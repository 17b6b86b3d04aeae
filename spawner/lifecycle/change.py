"""Changing a running server's GPU (resize, migrate) and restarting it with new disks.

The change is checked first: the new options must be valid and must fit now, counting what the
server holds as free; otherwise it is refused and nothing is stopped (``"queue": true`` instead
stops the server and waits in the spawn queue). Then, in the background: stop the server
(billing closes its session at the stop's second), start it with the new options (billing opens
the new session when the server answers), and, if that start fails, start the old options
again so the user is not left without a server.

One status record per server, kept in the hub's memory (a hub restart forgets them). The
stop and the start go through the hub's own machinery (:class:`HandlerHub`), as JupyterHub's
REST API does; the orchestration takes any object with that shape, so it is tested without a
hub.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from tornado import web
from tornado.log import app_log as log

from gputap_common import clock
from gputap_common.money import format_credits
from gputap_common.names import server_label

from ..core.choices import wanted_key
from ..core.form import course_offers, course_refusal, offering_options
from ..core.placement import Alternative, Refusal, RequestError
from . import stops
from .billing_client import BillingRefused, BillingUnavailable

STOPPING, STARTING, WAITING = "stopping", "starting", "waiting"
DONE, FAILED, REVERTED = "done", "failed", "reverted"
ACTIVE = frozenset({STOPPING, STARTING, WAITING})
#: how often a change that waits in the spawn queue looks at its place in line
QUEUE_LOOK_SECONDS = 0.5
#: how long the stop waits after the change is accepted: the answer travels back to the
#: browser through the very server being stopped (its Lab extension asked)
ANSWER_GRACE_SECONDS = 1.0

_changes: dict[tuple[str, str], Change] = {}
# the background tasks of changes in progress (asyncio keeps only weak references)
_tasks: set[asyncio.Task] = set()


@dataclass
class Change:
    """The status of one server's change, as ``GET {server}/change`` shows it."""

    user: str
    server: str
    reason: str
    from_key: str
    to_key: str
    state: str
    message: str
    started_at: datetime
    finished_at: datetime | None = None

    @property
    def who(self) -> str:
        return server_label(self.user, self.server)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    def set(self, state: str, message: str) -> None:
        """Move to ``state`` (one log line per state change)."""
        self.state, self.message = state, message
        if state not in ACTIVE:
            self.finished_at = clock.utcnow()
        log.info(
            "%s: %s %s -> %s: %s: %s",
            *(self.who, self.reason, self.from_key, self.to_key, state, message),
        )

    def view(self) -> dict[str, Any]:
        """The status as ``GET {server}/change`` answers it (docs/lab.md)."""
        times = {"started_at": self.started_at, "finished_at": self.finished_at}
        return {
            "state": self.state,
            "from": self.from_key,
            "to": self.to_key,
            "reason": self.reason,
            "message": self.message,
            **{key: at.isoformat() if at else None for key, at in times.items()},
        }


class ChangeRefused(web.HTTPError):
    """409: the change does not fit now; nothing was stopped. ``alternatives`` are the free
    options the user could change to instead (with the options to post for each)."""

    def __init__(self, message: str, alternatives: list[dict[str, Any]]):
        super().__init__(409, message)
        self.alternatives = alternatives


class Hub(Protocol):
    """What a change needs of the hub: the server's spawner, stopping it, starting it."""

    def spawner(self, user: Any, server_name: str) -> Any: ...

    async def stop(self, user: Any, server_name: str) -> None: ...

    async def start(self, user: Any, server_name: str, options: dict[str, Any]) -> None: ...


class HandlerHub:
    """Stop and start through a hub request handler's own machinery, as JupyterHub's REST API
    does: proxy routes, the pending flags, the poll callback that notices a dead server."""

    def __init__(self, handler: Any):
        self.handler = handler

    def spawner(self, user: Any, server_name: str) -> Any:
        return user.spawners[server_name] if server_name in user.orm_spawners else None

    async def stop(self, user: Any, server_name: str) -> None:
        stopping = await self.handler.stop_single_user(user, server_name)
        await stopping
        if user.spawners[server_name].active:
            raise RuntimeError("it did not stop")

    async def start(self, user: Any, server_name: str, options: dict[str, Any]) -> None:
        await self.handler.spawn_single_user(user, server_name, options=options)
        # a slow start returns early: follow it to its end (it raises if the start failed)
        spawner = user.spawners[server_name]
        if spawner._spawn_future is not None:
            await spawner._spawn_future
        if not user.spawners[server_name].ready:
            raise RuntimeError("it stopped as soon as it started")


def status(user_name: str, server_name: str) -> Change | None:
    """The server's last change (in progress or finished), if one was asked for."""
    return _changes.get((user_name, server_name))


def track(change: Change) -> None:
    """Keep ``change`` as its server's status (a recovery after a GPU fault is one)."""
    _changes[(change.user, change.server)] = change


def why_busy(spawner: Any, user_name: str, server_name: str) -> str | None:
    """Why the server cannot change now (409), or None."""
    who = server_label(user_name, server_name)
    current = status(user_name, server_name)
    if current is not None and current.active:
        return f"{who} is already changing ({current.state}); wait until that is done"
    pending = spawner.pending if spawner is not None else None
    if pending == "spawn":
        return f"{who} is still starting; change it once it runs"
    if pending:
        return f"{who} is busy ({pending} pending); try again when that is done"
    if spawner is None or not spawner.ready:
        return f"{who} is not running; start it with the options you want instead"
    return None


def alternatives_view(alternatives: tuple[Alternative, ...]) -> list[dict[str, Any]]:
    return [
        {
            "key": a.offering.key,
            "label": a.offering.label,
            "free": a.free,
            "price_per_hour_micro": a.price_per_hour_micro,
            "price_per_hour": format_credits(a.price_per_hour_micro),
            "options": offering_options(a.offering),
        }
        for a in alternatives
    ]


def reason_of(error: BaseException) -> str:
    """What went wrong, for the status message (HTTP errors carry the user's message)."""
    if isinstance(error, web.HTTPError):
        text = error.log_message or error.reason or f"HTTP {error.status_code}"
    elif isinstance(error, TimeoutError):
        text = "it did not start in time"
    else:
        text = str(error) or type(error).__name__
    return text.rstrip(".")


async def change_server(
    hub: Hub,
    user: Any,
    server_name: str,
    user_options: dict[str, Any],
    *,
    queue: bool = False,
    reason: str = "change",
    undo: Callable[[], Awaitable[None]] | None = None,
) -> Change:
    """Check a change of ``user``'s server to ``user_options`` and start it in the background.

    ``undo`` puts back what the caller changed before asking (a disk's attachment) when the
    new start fails, before the old options start again.

    The server keeps its environment unless ``user_options`` name another.

    Raises 400 (invalid options, an environment that is not the user's or cannot run on the
    new GPU), 409 (not running, pending or already changing; or, without
    ``queue``, :class:`ChangeRefused` when it does not fit now) and 503 (billing does not
    answer); in each case nothing was stopped. Returns the change's status record."""
    spawner = hub.spawner(user, server_name)
    busy = why_busy(spawner, user.name, server_name)
    if busy:
        raise web.HTTPError(409, busy)
    options_in = {**user_options, "queue": True} if queue else dict(user_options)
    options_in = with_environment_kept(options_in, spawner.user_options)
    try:
        options = spawner.parse_server_options(options_in)
    except RequestError as e:
        raise web.HTTPError(400, f"Invalid server options: {e}") from None
    # 400 when the environment is not the user's or cannot run on the new GPU
    _, options = await spawner.environment_for(options)
    try:
        # first: billing must answer before anything is stopped, or neither the new server
        # nor the old one could start again (and the fit check's prices may be cached)
        await spawner.billing.account(user.name)
    except BillingUnavailable as e:
        raise web.HTTPError(
            503,
            "Billing is unreachable, so no server can start now; yours was not stopped. "
            f"Try again in a minute ({e}).",
        ) from None
    except BillingRefused:
        pass  # no account yet: the start opens it
    answer = await spawner.fits_after_stop(options)
    wanted = wanted_key(options.request)
    if isinstance(answer, Refusal) and not (options.queue and wanted):
        hint = " Ask to wait in the queue, or pick" if wanted else " Pick"
        raise ChangeRefused(
            f"{answer.message}{hint} a free option. Your server was not stopped.",
            alternatives_view(answer.alternatives),
        )
    if options.course:
        await _check_course(spawner, user.name, options.course, answer, wanted)
    # the checks awaited billing: the server may have stopped or started changing since
    busy = why_busy(spawner, user.name, server_name)
    if busy:
        raise web.HTTPError(409, busy)
    old_options = dict(spawner.user_options or {})
    old_options.pop("queue", None)  # starting the old server again never waits in line
    change = Change(
        user=user.name,
        server=server_name,
        reason=reason,
        from_key=spawner.record.offering if spawner.record else "",
        to_key=answer.offering.key if not isinstance(answer, Refusal) else wanted,
        state=STOPPING,
        message="",
        started_at=clock.utcnow(),
    )
    track(change)
    change.set(STOPPING, f"stopping the {_label(spawner, change.from_key)} server")
    task = asyncio.ensure_future(_run(change, hub, user, options_in, old_options, undo))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return change


#: the options that say what a server runs rather than on what: a change keeps them
ENVIRONMENT_OPTIONS = ("environment", "image")


def with_environment_kept(new: dict[str, Any], current: dict[str, Any] | None) -> dict[str, Any]:
    """``new`` options running the environment of the ``current`` ones, unless they name
    an environment (or image) of their own, or another course pays (it may pin one)."""
    if any(key in new for key in ENVIRONMENT_OPTIONS):
        return new
    if (new.get("course") or "") != ((current or {}).get("course") or ""):
        return new
    kept = {key: current[key] for key in ENVIRONMENT_OPTIONS if (current or {}).get(key)}
    return {**new, **kept}


async def _check_course(
    spawner: Any, username: str, slug: str, answer: Any, wanted: str | None
) -> None:
    """409 when the course would refuse to pay for the new option: asked before the stop,
    so a refusal stops nothing (admission would refuse only after the old server ended)."""
    key = wanted if isinstance(answer, Refusal) else answer.offering.key
    try:
        offers = course_offers(await spawner.billing.courses(username))
    except BillingUnavailable as e:
        raise web.HTTPError(
            503,
            "Billing is unreachable, so the course cannot be asked; your server was not "
            f"stopped. Try again in a minute ({e}).",
        ) from None
    except BillingRefused:
        offers = []  # no account yet: no courses
    why = course_refusal(offers, slug, key or "")
    if why:
        raise web.HTTPError(409, f"{why} Your server was not stopped.")


async def restart_with(
    handler: Any,
    user: Any,
    server_name: str,
    reason: str,
    options: dict[str, Any] | None = None,
    undo: Callable[[], Awaitable[None]] | None = None,
) -> Change:
    """Restart a running server with ``options`` (default: the ones it runs with), e.g. to
    mount a data disk that was attached; the same checks and status as a change of GPU.
    ``handler`` is the hub request handler asking (its machinery stops and starts); ``undo``
    as in :func:`change_server`."""
    hub = HandlerHub(handler)
    if options is None:
        spawner = hub.spawner(user, server_name)
        current = getattr(spawner, "user_options", None) or {}
        options = {k: v for k, v in current.items() if k != "queue"}
    return await change_server(hub, user, server_name, options, reason=reason, undo=undo)


def _label(spawner: Any, key: str) -> str:
    try:
        return spawner.catalog.offering(key).label
    except (ValueError, AttributeError):
        return key or "old"


async def _run(
    change: Change,
    hub: Hub,
    user: Any,
    new_options: dict[str, Any],
    old_options: dict[str, Any],
    undo: Callable[[], Awaitable[None]] | None = None,
) -> None:
    name = change.server
    await asyncio.sleep(ANSWER_GRACE_SECONDS)
    # the server (and its Lab page) hears that this stop is the user's own change
    hub.spawner(user, name).stop_book.next_because(stops.for_change(change.reason))
    try:
        await hub.stop(user, name)
    except Exception as e:
        why = reason_of(e)
        change.set(FAILED, f"The server could not be stopped ({why}); it was not changed.")
        return
    spawner = hub.spawner(user, name)
    to_label = _label(spawner, change.to_key)
    change.set(STARTING, f"starting the {to_label} server")
    try:
        await start_following_queue(change, hub, user, new_options)
    except Exception as e:
        why = reason_of(e)
        from_label = _label(spawner, change.from_key)
        change.set(
            STARTING,
            f"the {to_label} server did not start ({why}); starting the {from_label} one again",
        )
        try:
            if undo is not None:
                await undo()
            await hub.start(user, name, old_options)
        except Exception as e2:
            change.set(
                FAILED,
                f"The {to_label} server did not start ({why}), nor did the {from_label} one "
                f"({reason_of(e2)}). Start your server again from the hub's home page; "
                "your files are kept.",
            )
        else:
            change.set(
                REVERTED,
                f"The {to_label} server did not start ({why}); you are back on the "
                f"{from_label} server.",
            )
        return
    record = hub.spawner(user, name).record
    change.to_key = record.offering if record else change.to_key
    change.set(DONE, f"Now running on {_label(spawner, change.to_key)}.")


async def start_following_queue(
    change: Change, hub: Hub, user: Any, options: dict[str, Any]
) -> None:
    """Start, showing the spawn's place in the queue as the ``waiting`` state."""
    start = asyncio.ensure_future(hub.start(user, change.server, options))
    while not start.done():
        await asyncio.wait([start], timeout=QUEUE_LOOK_SECONDS)
        spawner = hub.spawner(user, change.server)
        note = getattr(spawner, "queue_note", "")
        if note and change.message != note:
            change.set(WAITING, note)
        elif not note and change.state == WAITING:
            change.set(STARTING, "out of the queue, starting")
    await start
