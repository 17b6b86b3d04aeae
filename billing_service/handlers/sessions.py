"""Sessions and what comes before them: the hub's admission (with its hold), a session's
start and stop, listing sessions, releasing and listing holds."""

from __future__ import annotations

import logging

from tornado import web

from gputap_common.money import format_credits

from .. import metrics
from .base import APIHandler
from .fields import (
    MAX_LENGTH,
    check_text,
    count_field,
    optional_text,
    price_class_field,
    text_field,
    time_field,
)
from .views import hold_view, session_view

log = logging.getLogger("billing")


class AdmissionHandler(APIHandler):
    @web.authenticated
    async def post(self) -> None:
        self.require_hub()
        body = self.body()
        username = text_field(body, "username")
        sku = text_field(body, "sku")
        count = count_field(body)
        price_class = price_class_field(body)
        key = optional_text(body, "idempotency_key")
        course = optional_text(body, "course") or ""
        if course:
            check_text(course, "course", MAX_LENGTH["course"])
        admission = await self.blocking(
            self.store.admit,
            username,
            sku,
            count,
            self.now(),
            price_class,
            idempotency_key=key,
            course=course,
        )
        if not admission.allowed:
            log.info("Refused admission of %s for %s x %s", username, count, sku)
            raise web.HTTPError(402, admission.message)
        self.write_json(
            {
                "allowed": True,
                "sku": sku,
                "count": count,
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
        sessions = await self.blocking(self.store.sessions, username, state)
        now = self.now()
        self.write_json({"sessions": [session_view(s, now) for s in sessions]})

    @web.authenticated
    async def post(self) -> None:
        self.require_hub()
        body = self.body()
        session_id = text_field(body, "id")
        username = text_field(body, "username")
        server_name = text_field(body, "server_name", empty_ok=True)
        sku = text_field(body, "sku")
        count = count_field(body)
        started_at = time_field(body, "started_at")
        price_class = price_class_field(body)
        hold_id = optional_text(body, "hold_id")
        course = optional_text(body, "course") or ""
        now = self.now()
        session, created = await self.blocking(
            self.store.start_session,
            session_id,
            username,
            server_name,
            sku,
            count,
            started_at,
            now,
            price_class,
            hold_id=hold_id,
            course=course,
        )
        if created and session.is_storage:
            log.info(
                "Started storage session %s of %s/%s: %s GB at %s per GB-hour",
                session.id,
                username,
                server_name,
                count,
                format_credits(session.price_per_hour_micro),
            )
        elif created:
            log.info(
                "Started session %s of %s/%s: %s x %s at %s/h",
                session.id,
                username,
                server_name,
                count,
                sku,
                format_credits(session.price_per_hour_micro),
            )
        self.write_saved(session_view(session, now), created)


class SessionStopHandler(APIHandler):
    @web.authenticated
    async def post(self, session_id: str) -> None:
        self.require_hub()
        ended_at = time_field(self.body(), "ended_at")
        now = self.now()
        session = await self.blocking(self.store.stop_session, session_id, ended_at, now)
        if session.ended_at == ended_at:
            metrics.CHARGES_POSTED.labels("final").inc()
        log.info(
            "Settled session %s of %s/%s: %s s, %s credits",
            session.id,
            session.username,
            session.server_name,
            session.billed_seconds,
            format_credits(session.cost_micro or 0),
        )
        self.write_json(session_view(session, now))


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
        holds = await self.blocking(self.store.holds, username, self.now())
        self.write_json({"holds": [hold_view(h) for h in holds]})


default_handlers = [
    (r"api/admission", AdmissionHandler),
    (r"api/sessions", SessionsHandler),
    (r"api/sessions/([^/]+)/stop", SessionStopHandler),
    (r"api/holds/([^/]+)", HoldHandler),
    (r"api/accounts/([^/]+)/holds", HoldsHandler),
]
