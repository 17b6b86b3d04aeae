"""The hub's REST API as billing's loops call it: the service's token on every request, and
the URLs of a user, of a server, of gputap's stop endpoint for a server, and of gputap's
workers API of a server (its workers, and the stop of one)."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPRequest, HTTPResponse


def user_url(api_url: str, username: str) -> str:
    """The hub REST URL of ``username``."""
    return f"{api_url.rstrip('/')}/users/{quote(username, safe='')}"


def server_url(api_url: str, username: str, server_name: str) -> str:
    """The hub REST URL that stops ``username``'s server (the default one has name "")."""
    user = user_url(api_url, username)
    if not server_name:
        return f"{user}/server"
    return f"{user}/servers/{quote(server_name, safe='')}"


def gputap_server_url(api_url: str, username: str, server_name: str) -> str:
    """``username``'s server under gputap's API beside the hub's REST API
    (``{base}/hub/gputap/api/users/{user}/server[s/{name}]``)."""
    base = api_url.rstrip("/")
    base = base[: -len("/api")] if base.endswith("/api") else base
    return server_url(f"{base}/gputap/api", username, server_name)


def stop_url(api_url: str, username: str, server_name: str) -> str:
    """gputap's stop endpoint for ``username``'s server, beside the hub's REST API: a stop
    asked there records that billing asked (credit ran out), which the user is then told."""
    return gputap_server_url(api_url, username, server_name) + "/stop"


def workers_url(api_url: str, username: str, server_name: str) -> str:
    """gputap's list of the workers of ``username``'s server (404: no such server)."""
    return gputap_server_url(api_url, username, server_name) + "/workers"


def worker_stop_url(api_url: str, username: str, server_name: str, worker: str) -> str:
    """gputap's stop endpoint for one worker (``wK``) of ``username``'s server."""
    return f"{workers_url(api_url, username, server_name)}/{quote(worker, safe='')}/stop"


class HubAPI:
    """Requests to the hub's REST API at ``api_url`` with billing's ``api_token``."""

    def __init__(
        self, api_url: str, api_token: str, http_client: AsyncHTTPClient | None = None
    ) -> None:
        self.api_url = api_url
        self._api_token = api_token
        self.http_client = http_client or AsyncHTTPClient()

    async def fetch(
        self, url: str, method: str = "GET", json_body: dict[str, Any] | None = None
    ) -> HTTPResponse:
        """``method`` ``url`` with the token (a POST with ``json_body``, or an empty body);
        ``HTTPClientError`` when the hub answers an error, ``OSError`` when it cannot be
        reached."""
        headers = {"Authorization": f"token {self._api_token}"}
        body = b"" if method == "POST" else None
        if json_body is not None:
            headers["Content-Type"] = "application/json"
            body = json.dumps(json_body).encode()
        return await self.http_client.fetch(
            HTTPRequest(url, method=method, headers=headers, body=body)
        )
