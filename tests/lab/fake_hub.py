"""A stand-in for the hub's server API (docs/lab.md), for the server extension's tests.

It speaks the documented JSON at ``/hub/gputap/api/`` for one user and her servers, checks
the ``Authorization: token …`` header as the hub does (403 otherwise), and records every
request it answered so tests can tell what reached the hub. ``fail_next`` makes the next
request answer a given status and body (the hub's HTML error page, a 500).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application, RequestHandler

DISK_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")
NOW = "2026-11-30T10:00:00+00:00"

ALTERNATIVE_KEYS = ("key", "label", "free", "price_per_hour_micro", "price_per_hour", "options")
CHOICES = [
    {
        "key": "A100-80GB/1g.10gb",
        "label": "A100-80GB 1g.10gb slice",
        "kind": "slice",
        "free": 3,
        "total": 7,
        "max_count": 1,
        "price_per_hour_micro": 1142857,
        "price_per_hour": "1.142857",
        "course": None,
        "hours_left": None,
        "options": {"kind": "slice", "card": "A100-80GB", "profile": "1g.10gb"},
    },
    {
        "key": "H100-80GB",
        "label": "H100-80GB",
        "kind": "card",
        "free": 0,
        "total": 8,
        "max_count": 8,
        "price_per_hour_micro": 9000000,
        "price_per_hour": "9.00",
        "course": None,
        "hours_left": None,
        "options": {"kind": "card", "card": "H100-80GB", "count": 1},
    },
    {
        "key": "cpu",
        "label": "CPU only",
        "kind": "cpu",
        "free": 100,
        "total": 100,
        "max_count": 1,
        "price_per_hour_micro": 50000,
        "price_per_hour": "0.05",
        "course": None,
        "hours_left": None,
        "options": {"kind": "cpu"},
    },
]


@dataclass
class Seen:
    """One request the hub answered."""

    method: str
    path: str
    body: Any
    authorized: bool


@dataclass
class HubState:
    user: str
    token: str
    servers: set[str] = field(default_factory=lambda: {""})
    offering: str = "A100-80GB/1g.10gb"
    change: dict[str, Any] | None = None
    disks: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_disks: int = 3
    max_size_gb: int = 100
    simulated: bool = True
    warnings: list[dict[str, Any]] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    fail_next: tuple[int, str] | None = None

    def server_json(self, name: str) -> dict[str, Any]:
        return {
            "user": self.user,
            "server": name,
            "running": True,
            "pending": None,
            "offering": self.offering,
            "label": "A100-80GB 1g.10gb slice",
            "count": 1,
            "simulated": self.simulated,
            "course": "",
            "disks": [
                {"name": d["name"], "path": f"/home/{self.user}/disks/{d['name']}"}
                for d in self.disks.values()
                if d["attached_to"] == name
            ],
            "session": {
                "id": "5f0c1d2e-0000-4000-8000-000000000001",
                "username": self.user,
                "server_name": name,
                "sku": self.offering,
                "count": 1,
                "price_per_hour_micro": 1142857,
                "price_per_hour": "1.142857",
                "started_at": "2026-11-30T09:00:00+00:00",
                "billed_seconds": 3600,
                "cost_micro": 1142857,
                "cost": "1.142857",
                "course": "",
                "state": "running",
            },
            "account": {
                "username": self.user,
                "currency": "credits",
                "available_micro": 8857143,
                "available": "8.857143",
                "rate_per_hour_micro": 1142857,
                "rate_per_hour": "1.142857",
                "seconds_left": 27900,
                "warnings": self.warnings,
                "running": [],
                "as_of": NOW,
            },
            "change": self.change,
        }


class HubHandler(RequestHandler):
    def initialize(self, state: HubState) -> None:
        self.state = state

    def prepare(self) -> None:
        state = self.state
        authorized = self.request.headers.get("Authorization") == f"token {state.token}"
        try:
            body = json.loads(self.request.body) if self.request.body else None
        except ValueError:
            body = "<not json>"
        state.seen.append(Seen(self.request.method, self.request.path, body, authorized))
        self.body = body
        if state.fail_next is not None:
            status, text = state.fail_next
            state.fail_next = None
            self.set_status(status)
            self.set_header("Content-Type", "text/html")
            self.finish(text)
        elif not authorized:
            self.fail(403, "Missing or invalid credentials.")

    def fail(self, status: int, message: str, **extra: Any) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"status": status, "message": message, **extra}))

    def answer(self, status: int, data: Any) -> None:
        self.set_status(status)
        if data is None:
            self.finish()
            return
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def owned_server(self, user: str, name: str) -> bool:
        if user != self.state.user or name not in self.state.servers:
            self.fail(404, f"No such server: {user}/{name}")
            return False
        return True


def _name(named: str | None) -> str:
    return named or ""


class ServerHandler(HubHandler):
    def get(self, user: str, named: str | None) -> None:
        if self.owned_server(user, _name(named)):
            self.answer(200, self.state.server_json(_name(named)))


class ChoicesHandler(HubHandler):
    def get(self, user: str, named: str | None) -> None:
        if self.owned_server(user, _name(named)):
            self.answer(
                200,
                {
                    "current": self.state.offering,
                    "choices": CHOICES,
                    "currency": "credits",
                    "simulated": True,
                },
            )


class ChangeHandler(HubHandler):
    def get(self, user: str, named: str | None) -> None:
        if not self.owned_server(user, _name(named)):
            return
        if self.state.change is None:
            self.fail(404, "No change of GPU was asked for this server.")
        else:
            self.answer(200, self.state.change)

    def post(self, user: str, named: str | None) -> None:
        if not self.owned_server(user, _name(named)):
            return
        body = self.body
        if not isinstance(body, dict) or not isinstance(body.get("options"), dict):
            self.fail(400, "options missing")
            return
        choice = next((c for c in CHOICES if c["options"] == body["options"]), None)
        if choice is None:
            self.fail(400, f"Unknown options {body['options']}: pick one of the choices.")
            return
        if choice["free"] == 0 and not body.get("queue"):
            self.fail(
                409,
                f"No free {choice['label']} now (0 of {choice['total']}); "
                "A100-80GB 1g.10gb slices are free at 1.14/h. Nothing was stopped.",
                # shaped as the hub's (spawner.lifecycle.change.alternatives_view): no total
                alternatives=[
                    {k: c[k] for k in ALTERNATIVE_KEYS} for c in CHOICES if c["free"] > 0
                ],
            )
            return
        self.state.change = {
            "state": "waiting" if choice["free"] == 0 else "stopping",
            "from": self.state.offering,
            "to": choice["key"],
            "message": "",
            "started_at": NOW,
            "finished_at": None,
        }
        self.answer(202, self.state.change)


class StopHandler(HubHandler):
    def post(self, user: str, named: str | None) -> None:
        if self.owned_server(user, _name(named)):
            self.answer(204, None)


class GPUFaultHandler(HubHandler):
    """``POST {server}/gpu-fault``: the server reports a fault of one of its devices; 202
    (the hub acts on it; the reports are in ``seen``)."""

    def post(self, user: str, named: str | None) -> None:
        if not self.owned_server(user, _name(named)):
            return
        body = self.body
        if not isinstance(body, dict) or sorted(body) != ["detail", "device", "kind"]:
            self.fail(400, "Send device, kind and detail.")
            return
        self.answer(202, None)


class DisksHandler(HubHandler):
    def disks_json(self) -> dict[str, Any]:
        return {
            "disks": list(self.state.disks.values()),
            "limits": {"max_disks": self.state.max_disks, "max_size_gb": self.state.max_size_gb},
            "price_per_gb_hour_micro": 140,
            "price_per_gb_hour": "0.00014",
            "currency": "credits",
        }

    def get(self, user: str) -> None:
        if user != self.state.user:
            self.fail(404, f"No such user: {user}")
            return
        self.answer(200, self.disks_json())

    def post(self, user: str) -> None:
        if user != self.state.user:
            self.fail(404, f"No such user: {user}")
            return
        body = self.body if isinstance(self.body, dict) else {}
        name, size = body.get("name"), body.get("size_gb")
        if not isinstance(name, str) or not DISK_NAME.fullmatch(name):
            self.fail(400, f"Bad disk name {name!r}")
        elif not isinstance(size, int) or not 1 <= size <= self.state.max_size_gb:
            self.fail(400, f"A disk is 1 to {self.state.max_size_gb} GB, not {size}.")
        elif name in self.state.disks:
            self.fail(409, f"You already have a disk named {name}.")
        elif len(self.state.disks) >= self.state.max_disks:
            self.fail(409, f"You have {self.state.max_disks} disks, the most allowed.")
        else:
            disk = {
                "name": name,
                "size_gb": size,
                "created_at": NOW,
                "attached_to": None,
                "attached_running": False,
                "used_bytes": 0,
            }
            self.state.disks[name] = disk
            self.answer(201, disk)


class DiskHandler(HubHandler):
    def disk(self, user: str, name: str) -> dict[str, Any] | None:
        disk = self.state.disks.get(name) if user == self.state.user else None
        if disk is None:
            self.fail(404, f"No disk named {name}.")
        return disk

    def delete(self, user: str, name: str) -> None:
        disk = self.disk(user, name)
        if disk is None:
            return
        if disk["attached_to"] is not None:
            self.fail(409, f"Disk {name} is attached to a server: detach it first.")
            return
        del self.state.disks[name]
        self.answer(204, None)


class DiskActionHandler(DiskHandler):
    def post(self, user: str, name: str, action: str) -> None:
        disk = self.disk(user, name)
        if disk is None:
            return
        server = self.body.get("server") if isinstance(self.body, dict) else None
        if not isinstance(server, str) or server not in self.state.servers:
            self.fail(400, f"No such server {server!r} to {action} to.")
            return
        disk["attached_to"] = server if action == "attach" else None
        disk["attached_running"] = action == "attach"
        self.state.change = {
            "state": "stopping",
            "from": self.state.offering,
            "to": self.state.offering,
            "message": f"{action} {name}: restarting",
            "started_at": NOW,
            "finished_at": None,
        }
        # as the hub: the disk and the restart's status
        self.answer(202, {"disk": disk, "restart": self.state.change})


SERVER = r"/hub/gputap/api/users/([^/]+)/(?:server|servers/([^/]+))"


def make_app(state: HubState) -> Application:
    kwargs = {"state": state}
    return Application(
        [
            (SERVER, ServerHandler, kwargs),
            (SERVER + "/choices", ChoicesHandler, kwargs),
            (SERVER + "/change", ChangeHandler, kwargs),
            (SERVER + "/stop", StopHandler, kwargs),
            (SERVER + "/gpu-fault", GPUFaultHandler, kwargs),
            (r"/hub/gputap/api/users/([^/]+)/disks", DisksHandler, kwargs),
            (r"/hub/gputap/api/users/([^/]+)/disks/([^/]+)", DiskHandler, kwargs),
            (
                r"/hub/gputap/api/users/([^/]+)/disks/([^/]+)/(attach|detach)",
                DiskActionHandler,
                kwargs,
            ),
        ]
    )


@contextmanager
def running_hub(state: HubState) -> Iterator[str]:
    """Serve ``state`` from a thread with its own loop; yields the hub API URL
    (``http://127.0.0.1:PORT/hub/api``, as ``JUPYTERHUB_API_URL`` has it)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake-hub", daemon=True)
    thread.start()
    sockets = bind_sockets(0, "127.0.0.1")
    port = sockets[0].getsockname()[1]

    async def start() -> HTTPServer:
        server = HTTPServer(make_app(state))
        server.add_sockets(sockets)
        return server

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield f"http://127.0.0.1:{port}/hub/api"
    finally:

        async def stop() -> None:
            server.stop()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
