"""The hub's workers API: a running server's group of workers (docs/scale-out.md).

``{server}/workers`` beside the server API (spawner/api/servers.py), with its scopes: reading
needs ``read:servers`` on the server (the group's token is shown only to holders of
``servers``, who may run jobs on it), growing it ``servers``, stopping workers
``delete:servers`` (billing's enforcer holds it). A server the caller may not see answers 404.
"""

from __future__ import annotations

from jupyterhub import orm
from jupyterhub.scopes import has_scope
from tornado import web

from gputap_common import clock
from gputap_common.bodies import shown

from ..core.form import course_offers
from ..core.placement import RequestError
from ..core.workers import REQUEST_FIELDS, WorkerRequest, parse_worker_request
from ..lifecycle import stops
from ..lifecycle.billing_client import BillingRefused, BillingUnavailable, unavailable_error
from .servers import _SERVER, ServerAPIHandler


class _WorkersAPI(ServerAPIHandler):
    """Who may run jobs on a group, and why a stop happens, from who asks."""

    def _may_run(self, spawner) -> bool:
        owner, name = spawner.user.name, spawner.name
        return has_scope(f"servers!server={owner}/{name}", self.parsed_scopes, db=self.db)

    def _why(self, owner: str) -> str:
        """Why the workers stop, as their state's reason says it."""
        caller = self.current_user
        at = stops.clock_time(clock.utcnow())
        if isinstance(caller, orm.Service):
            if caller.name == stops.BILLING_SERVICE:
                return f"Stopped at {at}: your credit ran out."
            return f"Stopped at {at} by the service {caller.name}."
        if caller.name == owner:
            return f"You stopped it at {at}."
        return f"An admin ({caller.name}) stopped it at {at}."


class WorkersHandler(_WorkersAPI):
    """GET the group, POST to grow (or shrink) it, DELETE to stop it."""

    async def get(self, user_name: str, server_name: str | None = None) -> None:
        _, spawner = self.find_server(user_name, server_name, "read:servers")
        self.write_json(spawner.workers.view(with_token=self._may_run(spawner)))

    async def post(self, user_name: str, server_name: str | None = None) -> None:
        user, spawner = self.find_server(user_name, server_name, "servers")
        body = self.json_body(REQUEST_FIELDS)
        record = spawner.record
        if not spawner.ready or record is None or record.started_at is None:
            raise web.HTTPError(
                409, f"{spawner.who} is not running: start the server, then scale it out."
            )
        if spawner.max_workers < 1:
            raise web.HTTPError(403, "Scale-out is off on this hub (scale_out.max_workers is 0).")
        try:
            wanted = parse_worker_request(
                body,
                spawner.catalog.offering(record.offering),
                record.count,
                spawner.catalog,
                spawner.max_workers,
            )
        except RequestError as e:
            raise web.HTTPError(400, f"Invalid workers request: {e}") from None
        if record.course:
            await self._course_allows(spawner, user.name, record.course, wanted)
        await spawner.workers.scale(wanted)
        self.write_json(spawner.workers.view(with_token=True), 202)

    async def delete(self, user_name: str, server_name: str | None = None) -> None:
        user, spawner = self.find_server(user_name, server_name, "delete:servers")
        stopped = await spawner.workers.stop(self._why(user.name), wait=False)
        if not stopped:
            self.set_status(204)
            return self.finish()
        self.write_json(spawner.workers.view(), 202)

    async def _course_allows(self, spawner, user: str, course: str, wanted: WorkerRequest) -> None:
        """A course pays for the server: its rule says whether (and how many) workers."""
        try:
            offers = course_offers(await spawner.billing.courses(user))
        except (BillingUnavailable, BillingRefused) as e:
            raise unavailable_error(e) from None
        offer = next((c for c in offers if c.slug == course), None)
        name = offer.name if offer else course
        allowed = offer.max_workers if offer else 0
        if allowed < 1:
            raise web.HTTPError(
                403,
                f"The course {name} pays for this server and does not allow scale-out; "
                "ask its instructor, or start a server on your own credit to scale out.",
            )
        if wanted.count > allowed:
            raise web.HTTPError(
                403, f"The course {name} allows at most {allowed} worker(s), not {wanted.count}."
            )


#: what a worker's stop may carry: the billing session it is meant for
STOP_FIELDS = ("session_id",)


class WorkerStopHandler(_WorkersAPI):
    """POST {server}/workers/{wK}/stop: stop one worker (billing, when credit runs out)."""

    async def post(self, user_name: str, server_name: str | None, worker: str) -> None:
        user, spawner = self.find_server(user_name, server_name, "delete:servers")
        # who asks is the reason recorded; a session id makes sure the stop meant for a
        # session that ended does not hit a newer worker of the same name (billing's)
        session_id = self.json_body(STOP_FIELDS).get("session_id")
        if session_id is not None and not isinstance(session_id, str):
            raise web.HTTPError(400, f"session_id must be a string, not {shown(session_id)}")
        group = spawner.workers
        found = next((w for w in group.workers.values() if w.name == worker), None)
        if found is None:
            raise web.HTTPError(404, f"{spawner.who} has no worker {shown(worker)}")
        if session_id is not None and (
            found.record is None or found.record.session_id != session_id
        ):
            raise web.HTTPError(409, f"{worker} now runs another session: nothing stopped.")
        stopped = await group.stop(self._why(user.name), names=[worker], wait=False)
        self.set_status(202 if stopped else 204)
        self.finish()


default_handlers = [
    (rf"{_SERVER}/workers/(w[1-9][0-9]{{0,2}})/stop", WorkerStopHandler),
    (rf"{_SERVER}/workers", WorkersHandler),
]
