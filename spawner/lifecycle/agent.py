"""The hub's side of a worker's agent (``gputap-worker``, extensions/gputap-lab): whether it
answers, and how it is (busy with a job, since when idle, its GPU use).

The group's token goes in the ``Authorization`` header only, and is never logged. Each client
has its own HTTP connection pool: probes of starting workers never wait behind the hub's other
calls (tornado's shared client runs 10 at a time).
"""

from __future__ import annotations

import json
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

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
