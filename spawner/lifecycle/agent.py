"""The hub's side of a worker's agent (``gputap-worker``, extensions/gputap-lab): whether it
answers, and how it is (busy with a job, since when idle, its GPU use).

The group's token goes in the ``Authorization`` header only, and is never logged. Each client
has its own HTTP connection pool: probes of starting workers never wait behind the hub's other
calls (tornado's shared client runs 10 at a time).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from ..core.workers import parse_time

#: how long one status request may take
STATUS_TIMEOUT_SECONDS = 3.0


class AgentUnavailable(Exception):
    """The agent did not answer (yet), or not with its status."""


class AgentClient:
    """Asks one worker's agent at ``host:port``."""

    def __init__(self, host: str, port: int, token: str):
        self.host, self.port = host, port
        self._token = token
        self._http = AsyncHTTPClient(force_instance=True, max_clients=2)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    async def status(self) -> dict[str, Any]:
        """``GET /status``: ``{"busy", "idle_since", "gpus", "gpu_note", …}``."""
        request = HTTPRequest(
            self.url + "status",
            headers={"Authorization": f"token {self._token}"},
            request_timeout=STATUS_TIMEOUT_SECONDS,
            connect_timeout=STATUS_TIMEOUT_SECONDS,
        )
        try:
            response = await self._http.fetch(request)
            answer = json.loads(response.body)
        except (HTTPClientError, OSError, ValueError) as e:
            raise AgentUnavailable(str(e)) from None
        if not isinstance(answer, dict):
            raise AgentUnavailable("the agent answered something else than its status")
        return answer

    def close(self) -> None:
        self._http.close()


def agent_status(
    status: Any,
) -> tuple[bool, datetime | None, list[dict[str, Any]] | None, str] | None:
    """An agent's status (``busy``: true or false, ``idle_since``: an ISO time with its zone
    or null, ``gpus``: a list of objects or null, ``gpu_note``: text) as (busy, idle_since,
    gpus, note), or None when it is not that."""
    if not isinstance(status, dict):
        return None
    busy, since, gpus = status.get("busy", False), status.get("idle_since"), status.get("gpus")
    note = status.get("gpu_note") or ""
    if not isinstance(busy, bool) or not isinstance(note, str):
        return None
    if gpus is not None and not (isinstance(gpus, list) and all(isinstance(g, dict) for g in gpus)):
        return None
    idle_since = None
    if since is not None:
        if not isinstance(since, str) or len(since) > 40:
            return None
        try:
            idle_since = parse_time(since)
        except ValueError:
            return None
        if idle_since is not None and idle_since.utcoffset() is None:
            return None  # a naive time cannot be compared with the hub's clock
    return busy, idle_since, gpus, note[:200]
