"""Servers of people GitHub says are no longer members stop within the membership refresh.

JupyterHub asks GitHub again about a user only at their own next request: a removed member
whose server runs on (a training job, an open app) kept using it until it stopped. Here,
every ``hub.github.refresh_seconds``, the hub asks GitHub about each user with a running
server and stops the servers of those GitHub answers are no longer members of
``allowed_organizations``, each with its reason ("no longer a member"). An outage, a rate
limit or a revoked token says nothing about membership and stops nothing; the user's own
next request signs them out as before (github_auth.py).

Inside the hub (the running event loop, as the GPU fault desk's watchers) a loop posts to
:class:`MembershipHandler` as the ``gputap-github-members`` service, with a token made at
each start.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from typing import Any

from jupyterhub import orm
from jupyterhub.apihandlers.base import APIHandler
from jupyterhub.scopes import needs_scope
from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from spawner.lifecycle import stops

SERVICE = "gputap-github-members"
PATH = "gputap/api/admin/github-memberships"

log = logging.getLogger("gputap.github")


class MembershipHandler(APIHandler):
    """POST: stop the servers of users GitHub says are no longer members; answers who was
    asked about and whose servers stopped."""

    @needs_scope("admin:servers")
    async def post(self) -> None:
        authenticator = self.authenticator
        asked, stopped = [], []
        for orm_user in list(self.db.query(orm.User)):
            user = self.users[orm_user]
            running = [s for s in user.spawners.values() if s.ready]
            if not running:
                continue
            asked.append(user.name)
            if not await authenticator.membership_lost(user):
                continue
            orgs = ", ".join(sorted(authenticator.allowed_organizations))
            for spawner in running:
                log.warning("%s: stopping: no longer a member of %s", spawner._log_name, orgs)
                book = getattr(spawner, "stop_book", None)
                if book is not None:
                    book.next_because(stops.by_membership(orgs))
                await self.stop_single_user(user, spawner.name)
                stopped.append(spawner._log_name)
        self.write(json.dumps({"asked": asked, "stopped": stopped}))


async def watch_members(url: str, token: str, every_seconds: float) -> None:
    """Ask the hub to check its running users' memberships every ``every_seconds``."""
    client = AsyncHTTPClient(force_instance=True)
    while True:
        await asyncio.sleep(every_seconds)
        request = HTTPRequest(
            url,
            method="POST",
            body="{}",
            headers={"Authorization": f"token {token}"},
            request_timeout=max(60.0, every_seconds),
        )
        try:
            await client.fetch(request)
        except Exception as e:  # the hub starting or stopping: the next round asks again
            log.info("membership check not done this round: %s", e)


def configure_member_watch(c: Any, every_seconds: float, api_url: str) -> None:
    """The service, its role and (inside a running hub) the loop; nothing when
    ``every_seconds`` is 0 (no refresh)."""
    if every_seconds <= 0:
        return
    token = secrets.token_hex(32)
    c.JupyterHub.services = [
        *c.JupyterHub.get("services", []),
        {"name": SERVICE, "api_token": token},
    ]
    c.JupyterHub.load_roles = [
        *c.JupyterHub.get("load_roles", []),
        {
            "name": SERVICE,
            "description": "Stops the servers of people GitHub says are no longer members",
            "scopes": ["admin:servers"],
            "services": [SERVICE],
        },
    ]
    url = api_url.removesuffix("/api") + "/" + PATH
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # the config read outside a hub (a check of it): nothing watches
        return
    task = loop.create_task(watch_members(url, token, every_seconds))
    _tasks.add(task)  # kept: a task only the loop holds may be collected


_tasks: set[asyncio.Task] = set()
