"""What admins and operators use: funding accounts (grants, adjustments), usage in a time
range (JSON or CSV), the ledger check, Prometheus metrics, the OpenAPI description and the
health check."""

from __future__ import annotations

import functools
import json
import logging
import re
from pathlib import Path

import yaml
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from tornado import web

from gputap_common.money import format_credits
from gputap_common.scopes import BILLING_METRICS

from .. import metrics
from ..domain import ledger
from ..domain.money import parse_credits
from ..domain.usage import daily_gpu_hours, usage_csv
from .base import APIHandler, BaseHandler
from .fields import optional_text, text_field, time_argument
from .views import session_view, transaction_view

log = logging.getLogger("billing")

#: the OpenAPI 3 description of the JSON API, kept at the top of the package
OPENAPI_YAML = Path(__file__).parent.parent / "openapi.yaml"
#: where it is served, under the service prefix
OPENAPI_PATH = "api/openapi.json"


class GrantsHandler(APIHandler):
    """Admins fund accounts: top-ups, refunds, adjustments, trial credit, course allowances."""

    #: None: the body names the kind; "adjustment" for the older adjustments path
    fixed_kind: str | None = None

    @web.authenticated
    async def post(self, username: str) -> None:
        self.require_admin()
        allowed = ("amount", "reason", "idempotency_key", "course")
        body = self.body(allowed if self.fixed_kind else (*allowed, "kind"))
        kind = self.fixed_kind or text_field(body, "kind")
        if kind not in ledger.FUNDING_KINDS:
            raise web.HTTPError(
                400, f"Field 'kind' must be one of {', '.join(ledger.FUNDING_KINDS)}, not {kind!r}"
            )
        if "amount" not in body:
            raise web.HTTPError(400, "Missing field 'amount': a decimal string like \"25.00\"")
        try:
            amount = parse_credits(body["amount"], "amount")
        except ValueError as e:
            raise web.HTTPError(400, f"Field {e}") from None
        reason = text_field(body, "reason")
        key = text_field(body, "idempotency_key")
        course = optional_text(body, "course") or ""
        tx, created = await self.blocking(
            self.store.grant,
            username,
            kind,
            amount,
            reason,
            key,
            self.now(),
            created_by=self.caller,
            course=course,
        )
        if created:
            log.info(
                "%s of %s credits to %s by %s",
                kind.capitalize(),
                format_credits(amount),
                username,
                self.caller,
            )
        self.write_saved(transaction_view(tx), created)


class AdjustmentsHandler(GrantsHandler):
    fixed_kind = "adjustment"


class UsageHandler(APIHandler):
    """Sessions in a time range: admins see everyone (or ?username=), users themselves."""

    #: answer as a CSV download (``api/usage.csv``) instead of JSON
    csv = False

    @web.authenticated
    async def get(self) -> None:
        username = self.get_argument("username", None)
        if not self.sees_everyone:
            username = username or self.caller
            self.require_reader_of(username)
        since = time_argument(self, "since")
        until = time_argument(self, "until")
        if since and until and until <= since:
            raise web.HTTPError(400, "until must be after since")
        sessions = await self.blocking(self.store.sessions, username, since=since, until=until)
        now = self.now()
        if self.csv:
            self.write_csv("gputap-usage.csv", usage_csv(sessions, now))
            return
        self.write_json(
            {
                "sessions": [session_view(s, now) for s in sessions],
                "gpu_hours_by_day": daily_gpu_hours(sessions, now, since, until),
            }
        )


class UsageCSVHandler(UsageHandler):
    csv = True


class LedgerCheckHandler(APIHandler):
    @web.authenticated
    async def get(self) -> None:
        self.require_admin()
        problems = await self.blocking(self.store.check_ledger)
        self.write_json({"ok": not problems, "problems": [str(p) for p in problems]})


class MetricsHandler(BaseHandler):
    """Prometheus text format; for the hub, billing admins and holders of BILLING_METRICS."""

    def get_login_url(self) -> str:
        raise web.HTTPError(403, "Not authenticated: send 'Authorization: token <token>'")

    @web.authenticated
    def get(self) -> None:
        if not (self.sees_everyone or BILLING_METRICS in self.scopes):
            raise web.HTTPError(403, f"Reading metrics needs the scope {BILLING_METRICS}")
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(metrics.REGISTRY))


@functools.cache
def openapi_json(prefix: str) -> str:
    """The OpenAPI description as JSON text, its server URL the service's ``prefix``.

    The YAML is read once per prefix (one per process), not per request."""
    document = yaml.safe_load(OPENAPI_YAML.read_text())
    document["servers"] = [{"url": prefix.rstrip("/") or "/"}]
    return json.dumps(document)


class OpenAPIHandler(APIHandler):
    """``GET api/openapi.json``: any logged-in caller may read the description."""

    @web.authenticated
    def get(self) -> None:
        # the route is the service prefix and OPENAPI_PATH, matched whole: the path names it
        self.finish(openapi_json(self.request.path.removesuffix(OPENAPI_PATH)))


class HealthHandler(web.RequestHandler):
    """``GET health``: the service is up; no login (the hub and Kubernetes probe it)."""

    def get(self) -> None:
        self.set_header("Content-Type", "application/json; charset=utf-8")
        self.finish(json.dumps({"ok": True}))


default_handlers = [
    (r"health", HealthHandler),
    (re.escape(OPENAPI_PATH), OpenAPIHandler),
    (r"api/accounts/([^/]+)/grants", GrantsHandler),
    (r"api/accounts/([^/]+)/adjustments", AdjustmentsHandler),
    (r"api/usage", UsageHandler),
    (r"api/usage\.csv", UsageCSVHandler),
    (r"api/ledger/check", LedgerCheckHandler),
    (r"metrics", MetricsHandler),
]
