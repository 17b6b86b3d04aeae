"""Running servers with their card, price and cost so far, for the hub's home page (the
caller's own) and the hub's admin page (everyone's).

``GET {base_url}hub/gputap/api/running``: the caller's servers that run, start or stop, and
those that stopped with a notice (why, e.g. credit ran out). Needs ``read:servers`` on the
caller's own servers, which every user holds.
``GET {base_url}hub/gputap/api/running/all``: every user's running servers. Needs
``read:servers`` on all users (the hub's admins hold it).

Prices and costs come from billing, asked with the hub's token, as exact credits.
"""

from __future__ import annotations

import asyncio
from typing import Any

from jupyterhub import orm
from jupyterhub.scopes import has_scope
from tornado import web

from gputap_common.money import format_credits

from ..lifecycle.billing_client import BillingRefused, BillingUnavailable
from .account import account_of
from .base import API_PATH, GPUTapAPIHandler

RUNNING_PATH = f"{API_PATH}/running"


def server_view(user_name: str, spawner: Any, session: dict[str, Any] | None) -> dict[str, Any]:
    """One server: what it runs on, and (once billing meters it) its price and cost so far."""
    record = spawner.record
    offering = record.offering if record else None
    count = record.count if record else None
    rate = session["price_per_hour_micro"] * session["count"] if session else None
    return {
        "user": user_name,
        "server": spawner.name,
        "ready": spawner.ready,
        "pending": spawner.pending,
        "offering": offering,
        "label": spawner.catalog.offering(offering).label if offering else None,
        "count": count,
        "simulated": bool(record and record.simulated),
        "course": record.course if record else "",
        "started_at": session["started_at"] if session else None,
        "billed_seconds": session["billed_seconds"] if session else None,
        "price_per_hour_micro": rate,
        "price_per_hour": format_credits(rate) if rate is not None else None,
        "cost_micro": session["cost_micro"] if session else None,
        "cost": session["cost"] if session else None,
        "notice": spawner.notice or "",
        "time_to_ready": ready.view() if (ready := record and record.time_to_ready) else None,
    }


def _session_of(spawner: Any, account: dict[str, Any] | None) -> dict[str, Any] | None:
    session_id = spawner.record.session_id if spawner.record else None
    running = (account or {}).get("running") or []
    return next((s for s in running if session_id and s["id"] == session_id), None)


class RunningHandler(GPUTapAPIHandler):
    """What both lists share: each server with its billing session."""

    async def views(self, servers: list[tuple[str, Any]]) -> dict[str, Any]:
        """``servers``: (user name, spawner) pairs. Billing is asked once per user; when it
        cannot answer, the servers are listed without price and cost, and ``billing`` says
        why."""
        names = sorted({name for name, spawner in servers if spawner.active})
        billing_error = None
        accounts: dict[str, dict[str, Any]] = {}
        if names:
            billing = servers[0][1].billing
            answers = await asyncio.gather(
                *(account_of(billing, name) for name in names), return_exceptions=True
            )
            for name, answer in zip(names, answers, strict=True):
                if isinstance(answer, BillingUnavailable | BillingRefused):
                    billing_error = (
                        f"Billing did not answer, so prices and costs are missing ({answer})"
                    )
                elif isinstance(answer, BaseException):
                    raise answer
                else:
                    accounts[name] = answer
        return {
            "servers": [
                server_view(name, spawner, _session_of(spawner, accounts.get(name)))
                for name, spawner in servers
            ],
            "billing": billing_error,
        }


class OwnServersHandler(RunningHandler):
    async def get(self) -> None:
        user = self.current_user
        if user is None:
            raise web.HTTPError(403, "Log in to see your servers")
        if user.kind != "user":
            raise web.HTTPError(403, "Servers belong to users; services list all of them")
        if not has_scope(f"read:servers!user={user.name}", self.parsed_scopes, db=self.db):
            raise web.HTTPError(403, "Listing your servers needs the scope read:servers")
        servers = [
            (user.name, spawner)
            for _, spawner in sorted(user.spawners.items())
            if spawner.active or spawner.notice
        ]
        self.write_json(await self.views(servers))


class AllServersHandler(RunningHandler):
    async def get(self) -> None:
        if self.current_user is None:
            raise web.HTTPError(403, "Log in as an admin to see every running server")
        if not has_scope("read:servers", self.parsed_scopes, db=self.db):
            raise web.HTTPError(
                403, "Listing every user's servers needs the scope read:servers on all users"
            )
        servers = []
        running = self.db.query(orm.Spawner).filter(orm.Spawner.server_id.isnot(None))
        for orm_spawner in running.order_by(orm.Spawner.user_id, orm.Spawner.name):
            user = self.users[orm_spawner.user]
            spawner = user.spawners[orm_spawner.name]
            if spawner.active:
                servers.append((user.name, spawner))
        servers.sort(key=lambda pair: (pair[0], pair[1].name))
        self.write_json(await self.views(servers))


default_handlers = [
    (rf"/{RUNNING_PATH}", OwnServersHandler),
    (rf"/{RUNNING_PATH}/all", AllServersHandler),
]
