"""This server's worker group, through the hub's workers API with the server's own token
(``$JUPYTERHUB_API_TOKEN``; it is sent in a header only and never printed)."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

#: how long scale() waits for its workers to be ready
READY_TIMEOUT_SECONDS = 600.0


class GroupError(RuntimeError):
    """The hub refused, or a worker failed; the message says what and what to do."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def _server_path(env: Mapping[str, str]) -> str:
    user = quote(env["JUPYTERHUB_USER"], safe="")
    name = env.get("JUPYTERHUB_SERVER_NAME", "")
    return f"users/{user}/servers/{quote(name, safe='')}" if name else f"users/{user}/server"


class Hub:
    """The hub's workers API for this server."""

    def __init__(self, env: Mapping[str, str] = os.environ, timeout: float = 60):
        missing = [
            name
            for name in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_USER")
            if not env.get(name)
        ]
        if missing:
            raise GroupError(
                f"This kernel does not run in a gputap server ({', '.join(missing)} not set): "
                "there is no group to scale."
            )
        base = env["JUPYTERHUB_API_URL"].rstrip("/").removesuffix("/api")
        self.url = f"{base}/gputap/api/{_server_path(env)}/workers"
        self._token = env["JUPYTERHUB_API_TOKEN"]
        self.timeout = timeout

    def call(self, method: str, path: str = "", body: Any = None) -> Any:
        request = urllib.request.Request(
            self.url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"token {self._token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as e:
            try:
                message = json.loads(e.read()).get("message")
            except (ValueError, AttributeError):
                message = None
            raise GroupError(message or f"the hub answered {e.code}", e.code) from None
        except OSError as e:
            raise GroupError(f"the hub could not be reached: {e}") from None
        return json.loads(raw) if raw else None


@dataclass(frozen=True)
class Group:
    """The group as the hub shows it: ``workers`` (each a dict: name, state, host, port…),
    the notebook's address as the workers reach it, and the token their agents want (never
    shown: a cell's output is saved in the notebook)."""

    workers: list[dict[str, Any]]
    rendezvous_host: str
    token: str = field(repr=False)
    price_per_hour: str

    def __repr__(self) -> str:
        states = ", ".join(f"{w['name']} {w['state']}" for w in self.workers)
        return f"<gputap group: [{states}], {self.price_per_hour}/h>"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        """IPython's display: one line per worker."""
        if not self.workers:
            p.text("gputap group: no workers (gputap.scale(2) starts two)")
            return
        p.text(f"gputap group: {len(self.workers)} worker(s), {self.price_per_hour}/h")
        for w in self.workers:
            where = f"{w['host']}:{w['port']}" if w.get("host") else ""
            reason = f" ({w['reason']})" if w.get("reason") else ""
            p.break_()
            p.text(f"  {w['name']:<6} {w['state']:<9} {where}{reason}".rstrip())

    @property
    def ready(self) -> list[dict[str, Any]]:
        return [w for w in self.workers if w["state"] == "ready"]

    @classmethod
    def from_view(cls, view: Mapping[str, Any]) -> Group:
        return cls(
            workers=list(view.get("workers") or []),
            rendezvous_host=str(view.get("rendezvous_host") or "127.0.0.1"),
            token=str(view.get("token") or ""),
            price_per_hour=str(view.get("price_per_hour") or "0"),
        )


def workers(hub: Hub | None = None) -> Group:
    """The group now."""
    return Group.from_view((hub or Hub()).call("GET"))


def scale(
    count: int,
    gpus: int | None = None,
    options: Mapping[str, Any] | None = None,
    queue: bool = False,
    *,
    hub: Hub | None = None,
    say: Callable[[str], None] | None = None,
    timeout: float = READY_TIMEOUT_SECONDS,
) -> Group:
    """Make the group ``count`` workers (``gpus`` each, or ``options`` as a spawn's) and
    return once every one is ready; GroupError when the hub refuses or a worker fails."""
    hub = hub or Hub()
    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    body: dict[str, Any] = {"count": count, "queue": queue}
    if gpus is not None:
        body["gpus"] = gpus
    if options is not None:
        body["options"] = dict(options)
    view = hub.call("POST", "", body)
    shown = ""
    deadline = time.monotonic() + timeout
    while True:
        active = [w for w in view["workers"] if w["state"] not in ("stopped", "stopping")]
        failed = [w for w in active if w["state"] == "failed"]
        live = [w for w in active if w["state"] != "failed"]
        if failed and len(live) < count:
            worker = failed[-1]
            raise GroupError(f"worker {worker['name']} failed: {worker['reason']}")
        states = ", ".join(f"{w['name']} {w['state']}" for w in live)
        if len(live) >= count and all(w["state"] == "ready" for w in live):
            say(f"gputap: {count} worker(s) ready ({view['price_per_hour']}/h for the group)")
            return Group.from_view(view)
        if states != shown:
            say(f"gputap: waiting for workers: {states}")
            shown = states
        if time.monotonic() > deadline:
            raise GroupError(f"workers not ready after {timeout:.0f} s: {states}")
        time.sleep(0.5)
        view = hub.call("GET")


def stop_workers(hub: Hub | None = None) -> None:
    """Stop every worker of the group (billing stops with them)."""
    (hub or Hub()).call("DELETE")
