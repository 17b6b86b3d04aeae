"""The server extension's routes, at ``{base_url}gputap/``.

Every verb is ``@tornado.web.authenticated`` and none counts as user activity
(``_track_activity = False``): an open panel polling these must not keep an idle server
alive. Bad input answers 400 with what was wrong, before the hub is asked anything; the
hub's own errors come back with its status and message. The routes that only relay to the
hub are a table (``hub_route`` at the end): each verb an ``Ask`` that checks its input.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin

from .bodies import NotJSON, read_json
from .hub import HubClient, HubError
from .sampler import Sampler
from .stopping import SCHEMA_ID, stopping_body

DISK_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")
DISK_NAME_RULE = "1 to 32 of a-z, 0-9 and -, starting with a letter"


def check_disk_name(name: Any) -> str:
    """The disk name, or 400 saying what a name looks like."""
    if not isinstance(name, str) or not DISK_NAME.fullmatch(name):
        raise tornado.web.HTTPError(400, f"Disk name {name!r} is not valid: use {DISK_NAME_RULE}.")
    return name


def change_body(body: Any) -> dict[str, Any]:
    """``{"options": {...}, "queue": bool}`` checked, or 400."""
    if not isinstance(body, dict):
        raise tornado.web.HTTPError(400, 'Send a JSON object: {"options": {...}, "queue": false}.')
    unknown = sorted(set(body) - {"options", "queue"})
    if unknown:
        raise tornado.web.HTTPError(400, f"Unknown fields {unknown}: send options and queue.")
    if "options" not in body:
        raise tornado.web.HTTPError(400, "Missing options: the choice's options to change to.")
    if not isinstance(body["options"], dict) or not body["options"]:
        raise tornado.web.HTTPError(400, "options must be a non-empty JSON object (a choice's).")
    queue = body.get("queue", False)
    if not isinstance(queue, bool):
        raise tornado.web.HTTPError(400, "queue must be true or false.")
    return {"options": body["options"], "queue": queue}


def disk_body(body: Any) -> dict[str, Any]:
    """``{"name": str, "size_gb": int}`` checked, or 400 (the size limit is the hub's)."""
    if not isinstance(body, dict):
        raise tornado.web.HTTPError(400, 'Send a JSON object: {"name": "data", "size_gb": 10}.')
    missing = [key for key in ("name", "size_gb") if key not in body]
    if missing:
        raise tornado.web.HTTPError(400, f"Missing {' and '.join(missing)} for the new disk.")
    unknown = sorted(set(body) - {"name", "size_gb"})
    if unknown:
        raise tornado.web.HTTPError(400, f"Unknown fields {unknown}: send name and size_gb.")
    size = body["size_gb"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise tornado.web.HTTPError(
            400, f"size_gb must be a whole number of GB, 1 or more, not {size!r}."
        )
    return {"name": check_disk_name(body["name"]), "size_gb": size}


class GPUTapHandler(ExtensionHandlerMixin, APIHandler):
    """Base of the routes: JSON bodies, the hub client, hub errors passed through."""

    _track_activity = False

    @property
    def sampler(self) -> Sampler:
        return self.settings["gputap_sampler"]

    @property
    def hub(self) -> HubClient:
        client = self.settings["gputap_hub"]
        if isinstance(client, HubError):
            raise tornado.web.HTTPError(client.status, client.message)
        return client

    def json_body(self, *, required: bool = True) -> Any:
        """The request's JSON, or 400. An empty body is None when not ``required``."""
        if not self.request.body:
            if required:
                raise tornado.web.HTTPError(400, "Send a JSON body.")
            return None
        try:
            return read_json(self.request.body)
        except NotJSON as e:
            raise tornado.web.HTTPError(400, f"The body is not JSON ({e}).") from None

    async def call_hub(self, method: str, *args: Any) -> None:
        """Ask the hub, answer with its status and JSON (or its error's)."""
        try:
            status, answer = await getattr(self.hub, method)(*args)
        except HubError as e:
            self.set_status(e.status)
            self.finish(json.dumps(e.to_json()))
            return
        self.set_status(status)
        if answer is None:
            self.finish()
        else:
            self.finish(json.dumps(answer))


class GPUHandler(GPUTapHandler):
    @tornado.web.authenticated
    def get(self) -> None:
        self.finish(json.dumps(self.sampler.to_json()))


class GPUHealthHandler(GPUTapHandler):
    """GET gputap/gpu-health: the last check of this server's own GPUs for faults
    (health.py); the hub asks it when a node lost GPUs without naming whose."""

    @tornado.web.authenticated
    def get(self) -> None:
        health = self.settings.get("gputap_health")
        if health is not None:
            self.finish(json.dumps(health.to_json()))
            return
        # nothing checked: a simulated card, a CPU-only server, or checks turned off
        message = self.sampler.message or "GPU health checks are off on this server."
        self.finish(json.dumps({"checked_at": None, "message": message, "devices": []}))


class StoppingHandler(GPUTapHandler):
    """POST gputap/stopping: the hub says why this server is about to stop (with the server's
    own token): kept for the page's next GET, and emitted as an event an open page hears at
    once. GET: that announcement, or null before any."""

    @tornado.web.authenticated
    def get(self) -> None:
        self.finish(json.dumps(self.settings.get("gputap_stopping")))

    @tornado.web.authenticated
    async def post(self) -> None:
        body = stopping_body(self.json_body())
        self.settings["gputap_stopping"] = body
        self.log.info("gputap %s: the hub says this server stops (%s)", self._who, body["kind"])
        self.event_logger.emit(schema_id=SCHEMA_ID, data=body)
        # the events websocket writes in listener tasks: answer (and so let the hub stop
        # this server) only once they have written the event to the open pages
        await self.event_logger.gather_listeners()
        self.set_status(204)
        self.finish()

    @property
    def _who(self) -> str:
        hub = self.settings["gputap_hub"]
        return hub.who if isinstance(hub, HubClient) else "-"


# What a verb asks the hub: the HubClient method and its arguments. An ``Ask`` makes it from
# the handler and the path's groups, checking the input first: bad input is a 400 the hub
# never sees.
Asked = tuple[str, tuple[Any, ...]]
Ask = Callable[..., Asked]


def hub_route(pattern: str, **verbs: Ask) -> tuple[str, type[GPUTapHandler]]:
    """A route relaying each of ``verbs`` (``get=...``) to the hub.

    Each route gets its own class holding only its verbs, so any other verb is Tornado's
    405 as on a handler written by hand.
    """
    methods = {verb: _relay(ask) for verb, ask in verbs.items()}
    return pattern, type("HubRouteHandler", (GPUTapHandler,), methods)


def _relay(ask: Ask) -> Callable[..., Awaitable[None]]:
    @tornado.web.authenticated
    async def verb(self: GPUTapHandler, *groups: str) -> None:
        method, args = ask(self, *groups)
        await self.call_hub(method, *args)

    return verb


def as_is(method: str) -> Ask:
    """A verb without input: the hub's answer to ``method``."""
    return lambda handler: (method, ())


def ask_change(handler: GPUTapHandler) -> Asked:
    """POST gputap/change: the checked body (options, queue), logged without any token."""
    body = change_body(handler.json_body())
    handler.log.info(
        "gputap %s: change asked (queue=%s): %s",
        handler.hub.who,
        body["queue"],
        json.dumps(body["options"], sort_keys=True),
    )
    return "change", (body,)


def ask_create_disk(handler: GPUTapHandler) -> Asked:
    """POST gputap/disks: the checked name and size."""
    return "create_disk", (disk_body(handler.json_body()),)


def ask_delete_disk(handler: GPUTapHandler, name: str) -> Asked:
    """DELETE gputap/disks/NAME."""
    return "delete_disk", (check_disk_name(name),)


def ask_move_disk(handler: GPUTapHandler, name: str, action: str) -> Asked:
    """POST gputap/disks/NAME/attach or detach: no body, the disk moves to or from here."""
    name = check_disk_name(name)
    if handler.json_body(required=False) not in (None, {}):
        raise tornado.web.HTTPError(
            400, f"{action} takes no body: the disk goes to or from this server."
        )
    return f"{action}_disk", (name,)


def ask_stop(handler: GPUTapHandler) -> Asked:
    """POST gputap/stop: no body; the hub records that the user stopped it."""
    if handler.json_body(required=False) not in (None, {}):
        raise tornado.web.HTTPError(400, "stop takes no body: it stops this server.")
    handler.log.info("gputap %s: stop asked", handler.hub.who)
    return "stop", ()


def scale_body(body: Any) -> dict[str, Any]:
    """``{"count": N, "gpus": G}`` checked, or 400 (the limits are the hub's)."""
    if not isinstance(body, dict):
        raise tornado.web.HTTPError(400, 'Send a JSON object: {"count": 2, "gpus": 1}.')
    unknown = sorted(set(body) - {"count", "gpus", "options", "queue"})
    if unknown:
        raise tornado.web.HTTPError(400, f"Unknown fields {unknown}: send count and gpus.")
    for key in ("count", "gpus"):
        value = body.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise tornado.web.HTTPError(400, f"{key} must be a whole number, 1 or more.")
    if "count" not in body:
        raise tornado.web.HTTPError(400, "Missing count: how many workers.")
    return body


def ask_scale(handler: GPUTapHandler) -> Asked:
    """POST gputap/workers: scale this server out (or in) to count workers."""
    body = scale_body(handler.json_body())
    handler.log.info("gputap %s: %s worker(s) asked", handler.hub.who, body["count"])
    return "scale", (body,)


def ask_stop_worker(handler: GPUTapHandler, name: str) -> Asked:
    """POST gputap/workers/wK/stop: no body."""
    if handler.json_body(required=False) not in (None, {}):
        raise tornado.web.HTTPError(400, "stop takes no body: it stops that worker.")
    return "stop_worker", (name,)


default_handlers = [
    (r"gputap/gpu", GPUHandler),
    (r"gputap/gpu-health", GPUHealthHandler),
    (r"gputap/stopping", StoppingHandler),
    hub_route(r"gputap/stop", post=ask_stop),
    hub_route(r"gputap/server", get=as_is("server")),
    hub_route(r"gputap/choices", get=as_is("choices")),
    hub_route(r"gputap/change", get=as_is("change_status"), post=ask_change),
    hub_route(r"gputap/disks", get=as_is("disks"), post=ask_create_disk),
    hub_route(r"gputap/disks/([^/]+)", delete=ask_delete_disk),
    hub_route(r"gputap/disks/([^/]+)/(attach|detach)", post=ask_move_disk),
    hub_route(
        r"gputap/workers", get=as_is("workers"), post=ask_scale, delete=as_is("stop_workers")
    ),
    hub_route(r"gputap/workers/(w[1-9][0-9]{0,2})/stop", post=ask_stop_worker),
]
