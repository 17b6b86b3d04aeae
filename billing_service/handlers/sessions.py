"""Sessions and what comes before them: the hub's admission (with its hold), a session's
start and stop, listing sessions, releasing and listing holds."""

from __future__ import annotations

import asyncio
import logging

from tornado import web

from gputap_common.money import format_credits
from gputap_common.names import worker_label

from .. import metrics
from .base import APIHandler
from .fields import (
    SPAWN_FIELDS,
    optional_text,
    spawn_fields,
    text_field,
    time_field,
    worker_field,
)
from .views import hold_view, session_view

log = logging.getLogger("billing")

#: how long a stop the hub reports waits for the pod meter's first list of the cluster before
#: billing answers 503 (the spawner retries it; its calls give up after 10 s)
METER_WAIT_SECONDS = 5


class AdmissionHandler(APIHandler):
    @web.authenticated
    async def post(self) -> None:
        self.require_hub()
        body = self.body((*SPAWN_FIELDS, "idempotency_key"))
        spawn = spawn_fields(body)
        key = optional_text(body, "idempotency_key")
        admission = await self.blocking(
            self.store.admit, now=self.now(), idempotency_key=key, **spawn
        )
        if not admission.allowed:
            log.info(
                "Refused admission of %s for %s x %s",
                spawn["username"],
                admission.count,
                admission.sku,
            )
            raise web.HTTPError(402, admission.message)
        self.write_json(
            {
                "allowed": True,
                "sku": admission.sku,
                "count": admission.count,
                "price_per_hour_micro": admission.price_per_hour_micro,
                "price_per_hour": format_credits(admission.price_per_hour_micro),
                "seconds_left": admission.seconds_left,
                "message": admission.message,
                "hold_id": admission.hold.id,
                "hold_expires_at": admission.hold.expires_at.isoformat(),
            }
        )


class SessionsHandler(APIHandler):
    @web.authenticated
    async def get(self) -> None:
        username = self.get_argument("username", None)
        state = self.get_argument("state", None)
        if state not in (None, "running", "ended"):
            raise web.HTTPError(400, f"state must be 'running' or 'ended', not {state!r}")
        if username is None and not self.sees_everyone:
            username = self.caller
        if username is not None:
            self.require_reader_of(username)
        now = self.now()
        sessions = await self.blocking(self.store.sessions, username, state)
        paid = await self.blocking(self.store.session_funding, [s.id for s in sessions])
        views = [session_view(s, now, paid.get(s.id, ())) for s in sessions]
        self.write_json({"sessions": views})

    @web.authenticated
    async def post(self) -> None:
        self.require_hub()
        body = self.body(
            (*SPAWN_FIELDS, "id", "server_name", "started_at", "hold_id", "environment", "worker")
        )
        session_id = text_field(body, "id")
        spawn = spawn_fields(body)
        server_name = text_field(body, "server_name", empty_ok=True)
        started_at = time_field(body, "started_at")
        hold_id = optional_text(body, "hold_id")
        environment = optional_text(body, "environment") or ""
        worker = worker_field(body)
        now = self.now()
        session, created = await self.blocking(
            self.store.start_session,
            session_id,
            server_name=server_name,
            started_at=started_at,
            now=now,
            hold_id=hold_id,
            environment=environment,
            worker=worker,
            **spawn,
        )
        if created and session.is_storage:
            log.info(
                "Started storage session %s of %s/%s: %s GB at %s per GB-hour",
                session.id,
                session.username,
                session.server_name,
                session.count,
                format_credits(session.price_per_hour_micro),
            )
        elif created:
            log.info(
                "Started session %s of %s: %s x %s at %s/h",
                session.id,
                worker_label(session.username, session.server_name, session.worker),
                session.count,
                session.sku,
                format_credits(session.price_per_hour_micro),
            )
        self.write_saved(session_view(session, now), created)


class SessionStopHandler(APIHandler):
    @web.authenticated
    async def post(self, session_id: str) -> None:
        self.require_hub()
        ended_at = time_field(self.body(("ended_at",)), "ended_at")
        await self.meter_first()
        now = self.now()
        session = await self.blocking(self.store.stop_session, session_id, ended_at, now)
        if session.ended_at == ended_at:
            metrics.CHARGES_POSTED.labels("final").inc()
        log.info(
            "Settled session %s of %s: %s s, %s credits",
            session.id,
            worker_label(session.username, session.server_name, session.worker),
            session.billed_seconds,
            format_credits(session.cost_micro or 0),
        )
        self.write_json(session_view(session, now))

    async def meter_first(self) -> None:
        """On Kubernetes the pod meter has the first word: a pod that vanished while billing
        was down ended at its Killing event, which only the meter looks up, and the first
        stop written wins. A hub that reports the stop before the meter has listed the pods
        waits, then is asked to try again (the spawner does, with the same end time)."""
        listed: asyncio.Event = self.settings["meter_listed"]
        try:
            await asyncio.wait_for(listed.wait(), METER_WAIT_SECONDS)
        except TimeoutError:
            self.set_header("Retry-After", str(METER_WAIT_SECONDS))
            raise web.HTTPError(
                503,
                "billing has just started and its pod meter has not yet listed the servers' "
                "pods, which dates the end of pods that vanished meanwhile; try the stop again "
                "in a few seconds",
            ) from None


class HoldHandler(APIHandler):
    @web.authenticated
    async def delete(self, hold_id: str) -> None:
        self.require_hub()
        hold = await self.blocking(self.store.release_hold, hold_id, self.now())
        self.write_json(hold_view(hold))


class HoldsHandler(APIHandler):
    @web.authenticated
    async def get(self, username: str) -> None:
        self.require_reader_of(username)
        await self.write_records("holds", hold_view, self.store.holds, username, self.now())


default_handlers = [
    (r"api/admission", AdmissionHandler),
    (r"api/sessions", SessionsHandler),
    (r"api/sessions/([^/]+)/stop", SessionStopHandler),
    (r"api/holds/([^/]+)", HoldHandler),
    (r"api/accounts/([^/]+)/holds", HoldsHandler),
]
