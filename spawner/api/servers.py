"""The hub's server API for the JupyterLab extension (docs/lab.md, "The hub's server API"):
a server's facts, what it can change to now, and changing its GPU.

Hub handlers at ``{base_url}hub/gputap/api/``; ``{server}`` is ``users/{user}/server`` (the
default server) or ``users/{user}/servers/{name}``, as in JupyterHub's REST API. Each call
needs a scope on that server (``read:servers`` to read, ``servers`` to change); a server the
caller may not see answers 404 exactly like one that does not exist. Whoever holds the scope
may act: the user, their server's own token, and admins (``admin:servers``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from jupyterhub import orm
from jupyterhub.scopes import has_scope
from tornado import web

from gputap_common import clock
from gputap_common.bodies import shown
from gputap_common.money import format_credits
from gputap_common.names import server_label

from ..core.asking import Credit, credit_of
from ..core.catalog import CPU_KEY
from ..core.environments import Environment
from ..core.form import Choice, CourseOffer, course_offers, offering_options
from ..lifecycle import stops
from ..lifecycle.billing_client import BillingRefused, BillingUnavailable
from ..lifecycle.change import ChangeRefused, HandlerHub, alternatives_view, change_server, status
from .account import account_of
from .base import API_PATH, GPUTapAPIHandler

#: users/{user}/server (default server: no name) or users/{user}/servers/{name}
_SERVER = rf"/{API_PATH}/users/([^/]+)/(?:server|servers/([^/]+))"
CHANGE_KEYS = frozenset({"options", "queue"})


def choice_view(
    choice: Choice, course: CourseOffer | None = None, credit: Credit | None = None
) -> dict[str, Any]:
    """One option the server can change to, with the ``options`` to post for it, and
    whether what would pay for it (the course's hours, else the own ``credit``) can."""
    o = choice.offering
    price = choice.price_per_hour_micro
    if course:
        affordable, shortfall = course.hours_left.get(o.key, 0) > 0, None
        if not affordable:
            shortfall = f"no hours of {course.name} left this week"
    elif credit and price:
        affordable = credit.covers(price)
        shortfall = None if affordable else credit.shortfall(price)
    else:
        affordable, shortfall = bool(price), None if price else "no price set"
    return {
        "key": o.key,
        "label": o.label,
        "kind": o.kind,
        "memory_gb": o.memory_gb,
        "fp16_tflops": o.fp16_tflops if o.known else None,  # None: a GPU of unknown speed
        "free": choice.free,
        "total": choice.total,
        "max_count": choice.max_count,
        "price_per_hour_micro": price,
        "price_per_hour": format_credits(price) if price is not None else None,
        "course": {"slug": course.slug, "name": course.name} if course else None,
        "hours_left": course.hours_left[o.key] if course else None,
        "options": offering_options(o, course=course.slug if course else ""),
        "alternatives": alternatives_view(choice.alternatives),
        "affordable": affordable,
        "shortfall": shortfall,
    }


def environment_view(environment: Environment) -> dict[str, Any]:
    """What a server's environment is, as its user sees it."""
    return {
        "key": environment.key,
        "name": environment.name,
        "description": environment.description,
        "tags": list(environment.tags),
    }


def choices_view(
    choices: Sequence[Choice],
    courses: Sequence[CourseOffer],
    *,
    current: str | None,
    currency: str,
    simulated: bool,
    credit: Credit | None = None,
) -> dict[str, Any]:
    """``GET {server}/choices``: course-funded options first (once per course, those it pays
    for), then every option cheapest first, then CPU (the order of ``choices``)."""
    funded = [
        choice_view(choice, course, credit)
        for course in courses
        for choice in choices
        if choice.offering.key in course.hours_left and choice.offering.kind != "cpu"
    ]
    return {
        "current": current,
        "choices": funded + [choice_view(choice, credit=credit) for choice in choices],
        "currency": currency,
        "simulated": simulated,
    }


class ServerAPIHandler(GPUTapAPIHandler):
    """Finds the server a request names, if the caller may see it; errors as JSON."""

    def find_server(self, user_name: str, server_name: str | None, scope: str) -> tuple[Any, Any]:
        """(user, spawner) of the named server when the caller holds ``scope`` on it; 404
        otherwise, the same answer whether it does not exist or is not theirs to see."""
        server_name = server_name or ""
        if self.current_user is None:
            raise web.HTTPError(403, "Missing or invalid credentials.")
        missing = web.HTTPError(
            404,
            f"No server {server_label(user_name, server_name)}: it does not exist or is not yours",
        )
        wanted = f"{scope}!server={user_name}/{server_name}"
        if not has_scope(wanted, self.parsed_scopes, db=self.db):
            raise missing
        user = self.find_user(user_name)
        if user is None or server_name not in user.orm_spawners:
            raise missing
        return user, user.spawners[server_name]

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = (kwargs.get("exc_info") or (None, None, None))[1]
        if not isinstance(error, ChangeRefused):
            return super().write_error(status_code, **kwargs)
        # a refused change names the free options to change to instead
        self.set_header("Content-Type", "application/json")
        body = {"status": 409, "message": error.log_message, "alternatives": error.alternatives}
        self.finish(json.dumps(body))


def _billing_error(e: Exception, what: str) -> web.HTTPError:
    if isinstance(e, BillingUnavailable):
        return web.HTTPError(
            503,
            f"Billing is unreachable, so {what} cannot be shown now; try again in a minute ({e})",
        )
    return web.HTTPError(502, f"Billing refused to show {what}: {e}")


class ServerHandler(ServerAPIHandler):
    """GET {server}: this server's facts, its billing session and the user's account."""

    async def get(self, user_name: str, server_name: str | None = None) -> None:
        user, spawner = self.find_server(user_name, server_name, "read:servers")
        server_name = server_name or ""
        record = spawner.record
        offering = record.offering if record else None
        try:
            account = await account_of(spawner.billing, user.name)
        except (BillingUnavailable, BillingRefused) as e:
            raise _billing_error(e, "this server's cost and your credit") from None
        session_id = record.session_id if record else None
        session = next(
            (s for s in account.get("running") or [] if session_id and s["id"] == session_id),
            None,
        )
        change = status(user.name, server_name)
        self.write_json(
            {
                "user": user.name,
                "server": server_name,
                "running": spawner.ready,
                "pending": spawner.pending,
                "offering": offering,
                "label": spawner.catalog.offering(offering).label if offering else None,
                "count": record.count if record else None,
                "simulated": bool(record and record.simulated),
                "time_to_ready": ready.view()
                if (ready := record and record.time_to_ready)
                else None,
                "course": record.course if record else "",
                "environment": environment_view(spawner.server_environment) if record else None,
                "disks": await spawner.attached_disks_view(),
                "session": session,
                "account": account,
                "change": change.view() if change else None,
                "stop": spawner.stop_reason.view() if spawner.stop_reason else None,
            }
        )


class ChoicesHandler(ServerAPIHandler):
    """GET {server}/choices: what the server can change to now (its own GPUs count as free)."""

    async def get(self, user_name: str, server_name: str | None = None) -> None:
        user, spawner = self.find_server(user_name, server_name, "read:servers")
        try:
            account = await account_of(spawner.billing, user.name)
            courses = course_offers(await spawner.billing.courses(user.name))
            terms = await spawner.billing.price_list([CPU_KEY])
        except (BillingUnavailable, BillingRefused) as e:
            raise _billing_error(e, "the options and their prices") from None
        credit = credit_of(account, int(terms.get("min_billable_seconds") or 0))
        choices, simulated, _ = await spawner.choices(own_free=True)
        current = spawner.record.offering if spawner.ready and spawner.record else None
        self.write_json(
            choices_view(
                choices,
                courses,
                current=current,
                currency=account.get("currency", "credits"),
                simulated=simulated,
                credit=credit,
            )
        )


class ChangeHandler(ServerAPIHandler):
    """POST {server}/change: change the server's GPU; GET: the change's status."""

    async def get(self, user_name: str, server_name: str | None = None) -> None:
        user, _ = self.find_server(user_name, server_name, "read:servers")
        change = status(user.name, server_name or "")
        if change is None:
            who = server_label(user.name, server_name or "")
            raise web.HTTPError(404, f"No change of {who} was asked for since the hub started")
        self.write_json(change.view())

    async def post(self, user_name: str, server_name: str | None = None) -> None:
        user, _ = self.find_server(user_name, server_name, "servers")
        body = self.json_body(CHANGE_KEYS)
        options = body.get("options")
        if not isinstance(options, dict):
            raise web.HTTPError(
                400, f"options must be an object (the choice's options), not {shown(options)}"
            )
        queue = body.get("queue", False)
        if not isinstance(queue, bool):
            raise web.HTTPError(400, f"queue must be true or false, not {shown(queue)}")
        hub = HandlerHub(self)
        change = await change_server(hub, user, server_name or "", options, queue=queue)
        self.write_json(change.view(), 202)


class StopHandler(ServerAPIHandler):
    """POST {server}/stop: stop the server as JupyterHub's DELETE does, recording why from
    who asks (docs/lab.md, "Why a server stopped"): its user or its own token, billing (credit
    ran out), the idle culler (idle), anyone else holding the scope (an admin). Answers as
    the DELETE does: 204 stopped (or not running), 202 still stopping, 400 while renamed."""

    async def post(self, user_name: str, server_name: str | None = None) -> None:
        user, spawner = self.find_server(user_name, server_name, "delete:servers")
        server_name = server_name or ""
        if self.request.body.strip() not in (b"", b"{}"):
            raise web.HTTPError(400, "stop takes no body: who asks is the reason recorded.")
        if spawner.pending == "stop":
            return self._answer(202)
        if spawner.pending == "rename":
            raise web.HTTPError(400, "Cannot stop a server while it is being renamed")
        spawner.stop_book.next_because(self._why(user, spawner))
        if spawner.pending:  # interrupting a start, as JupyterHub's DELETE does
            self.log.warning("%s: start interrupted by a stop", spawner._log_name)
            if spawner._spawn_future:
                spawner._spawn_future.cancel()
            await self.stop_single_user(user, server_name)
        elif spawner.ready and await spawner.poll_and_notify() is None:
            await self.stop_single_user(user, server_name)
        else:
            spawner.stop_book.next_because(None)  # not running: nothing stops, nothing recorded
        self._answer(202 if spawner._stop_pending else 204)

    def _why(self, user: Any, spawner: Any) -> stops.Pending:
        caller = self.current_user
        if isinstance(caller, orm.Service):
            last = spawner.orm_spawner.last_activity
            idle = (clock.utcnow() - _aware(last)).total_seconds() if last else None
            return stops.asked_by(caller.name, None, user.name, idle)
        return stops.asked_by(None, caller.name, user.name, None)

    def _answer(self, status_code: int) -> None:
        self.set_status(status_code)
        self.finish()


def _aware(at: datetime) -> datetime:
    """JupyterHub's database times are naive UTC."""
    return at if at.tzinfo else at.replace(tzinfo=UTC)


default_handlers = [
    (rf"{_SERVER}/stop", StopHandler),
    (rf"{_SERVER}/choices", ChoicesHandler),
    (rf"{_SERVER}/change", ChangeHandler),
    (_SERVER, ServerHandler),
]
