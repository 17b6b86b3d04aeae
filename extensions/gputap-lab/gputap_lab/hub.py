"""The client of the hub's server API (``{hub}/hub/gputap/api/``), with the server's own token.

Everything comes from the environment JupyterHub gives a single-user server:
``JUPYTERHUB_API_URL`` (``…/hub/api``), ``JUPYTERHUB_API_TOKEN``, ``JUPYTERHUB_USER`` and
``JUPYTERHUB_SERVER_NAME`` (empty for the default server). The token goes in the
``Authorization`` header only and is never logged.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from .bodies import NotJSON, read_json


class HubError(Exception):
    """The hub answered with an error (or something that is not the API's JSON).

    ``status``, ``message`` and the rest of the hub's error body (a sold-out change's
    ``alternatives``) are passed on to the browser as they are.
    """

    def __init__(self, status: int, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body or {}

    def to_json(self) -> dict[str, Any]:
        return {**self.body, "status": self.status, "message": self.message}


class HubNotConfigured(HubError):
    """The server was not started by a hub (no ``JUPYTERHUB_API_URL``)."""


def gputap_api_url(hub_api_url: str) -> str:
    """``http://hub:8081/hub/api`` → ``http://hub:8081/hub/gputap/api/``."""
    base = hub_api_url.rstrip("/")
    if base.endswith("/api"):
        base = base[: -len("/api")]
    return f"{base}/gputap/api/"


def server_path(user: str, server_name: str) -> str:
    """``users/{user}/server`` or ``users/{user}/servers/{name}``, as in JupyterHub's API."""
    if server_name:
        return f"users/{quote(user, safe='')}/servers/{quote(server_name, safe='')}"
    return f"users/{quote(user, safe='')}/server"


def _error(status: int, body: bytes) -> HubError:
    """The hub's error answer as a HubError; one that is not the API's JSON still says what
    happened."""
    try:
        data = read_json(body)
    except NotJSON:
        data = None
    if not isinstance(data, dict):
        data = {}
    message = data.get("message")
    if not isinstance(message, str) or not message:
        message = f"The hub answered {status} without saying why; try again in a minute."
    return HubError(status, message, data)


class HubClient:
    """Calls the hub's server API for this server (``server_path``) and its user's disks."""

    def __init__(
        self,
        api_url: str,
        token: str,
        user: str,
        server_name: str = "",
        *,
        timeout_seconds: float = 20,
        log: logging.Logger | None = None,
    ) -> None:
        self.base = gputap_api_url(api_url)
        self._token = token
        self.user = user
        self.server_name = server_name
        self.timeout_seconds = timeout_seconds
        self.log = log or logging.getLogger(__name__)

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] = os.environ, **kwargs: Any
    ) -> HubClient | HubNotConfigured:
        """A client, or the reason there can be none (the server runs outside a hub)."""
        missing = [
            name
            for name in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_USER")
            if not env.get(name)
        ]
        if missing:
            return HubNotConfigured(
                503,
                f"This server was not started by gputap's hub ({', '.join(missing)} not set), "
                "so there is no cost, change of GPU or disk to show here.",
            )
        return cls(
            env["JUPYTERHUB_API_URL"],
            env["JUPYTERHUB_API_TOKEN"],
            env["JUPYTERHUB_USER"],
            env.get("JUPYTERHUB_SERVER_NAME", ""),
            **kwargs,
        )

    @property
    def who(self) -> str:
        """``user`` or ``user/server`` for log lines, as JupyterHub names servers."""
        return f"{self.user}/{self.server_name}" if self.server_name else self.user

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Call ``{base}{path}``; answer (status, JSON) for 2xx, raise HubError otherwise.

        A hub that cannot be reached is a 502 with what to do; an answer that is not JSON
        (a proxy's error page) is a 502 too.
        """
        request = HTTPRequest(
            self.base + path,
            method=method,
            headers={
                "Authorization": f"token {self._token}",
                "Accept": "application/json",
                "Content-Type": "application/json",
            },
            body=None if body is None else json.dumps(body),
            allow_nonstandard_methods=True,
            request_timeout=self.timeout_seconds,
            follow_redirects=False,
        )
        try:
            response = await AsyncHTTPClient().fetch(request)
        except HTTPClientError as e:
            if e.response is None or e.code == 599:
                self.log.warning(
                    "gputap %s: hub unreachable for %s %s: %s", self.who, method, path, e
                )
                raise HubError(
                    502,
                    f"The hub could not be reached ({e.message or e}); try again in a minute.",
                ) from e
            self.log.info("gputap %s: hub answered %s to %s %s", self.who, e.code, method, path)
            raise _error(e.code, e.response.body) from e
        except OSError as e:
            self.log.warning("gputap %s: hub unreachable for %s %s: %s", self.who, method, path, e)
            raise HubError(
                502, f"The hub could not be reached ({e}); try again in a minute."
            ) from e
        if response.code == 204 or not response.body:
            return response.code, None
        try:
            return response.code, read_json(response.body)
        except NotJSON as e:
            raise HubError(
                502, f"The hub answered {response.code} with something that is not JSON."
            ) from e

    # -- this server --------------------------------------------------------------------

    async def server(self) -> tuple[int, Any]:
        return await self.request("GET", server_path(self.user, self.server_name))

    async def choices(self) -> tuple[int, Any]:
        return await self.request("GET", server_path(self.user, self.server_name) + "/choices")

    async def change(self, body: dict[str, Any]) -> tuple[int, Any]:
        return await self.request(
            "POST", server_path(self.user, self.server_name) + "/change", body
        )

    async def stop(self) -> tuple[int, Any]:
        """Stop this server through gputap's stop endpoint (the hub records who asked)."""
        return await self.request("POST", server_path(self.user, self.server_name) + "/stop", {})

    async def change_status(self) -> tuple[int, Any]:
        return await self.request("GET", server_path(self.user, self.server_name) + "/change")

    async def gpu_fault(self, body: dict[str, str]) -> tuple[int, Any]:
        """Report a fault of one of this server's own devices (``health.Finding``)."""
        return await self.request(
            "POST", server_path(self.user, self.server_name) + "/gpu-fault", body
        )

    # -- this server's workers (docs/scale-out.md) ---------------------------------------

    def _workers(self, name: str | None = None) -> str:
        path = server_path(self.user, self.server_name) + "/workers"
        return path if name is None else f"{path}/{quote(name, safe='')}/stop"

    async def workers(self) -> tuple[int, Any]:
        """The group, without its token (the page never needs it)."""
        code, view = await self.request("GET", self._workers())
        if isinstance(view, dict):
            view.pop("token", None)
        return code, view

    async def scale(self, body: dict[str, Any]) -> tuple[int, Any]:
        code, view = await self.request("POST", self._workers(), body)
        if isinstance(view, dict):
            view.pop("token", None)
        return code, view

    async def stop_workers(self) -> tuple[int, Any]:
        return await self.request("DELETE", self._workers())

    async def stop_worker(self, name: str) -> tuple[int, Any]:
        return await self.request("POST", self._workers(name), {})

    # -- the user's disks ---------------------------------------------------------------

    def _disks(self, name: str | None = None) -> str:
        path = f"users/{quote(self.user, safe='')}/disks"
        return path if name is None else f"{path}/{quote(name, safe='')}"

    async def disks(self) -> tuple[int, Any]:
        return await self.request("GET", self._disks())

    async def create_disk(self, body: dict[str, Any]) -> tuple[int, Any]:
        return await self.request("POST", self._disks(), body)

    async def delete_disk(self, name: str) -> tuple[int, Any]:
        return await self.request("DELETE", self._disks(name))

    async def attach_disk(self, name: str) -> tuple[int, Any]:
        return await self.request(
            "POST", self._disks(name) + "/attach", {"server": self.server_name}
        )

    async def detach_disk(self, name: str) -> tuple[int, Any]:
        return await self.request(
            "POST", self._disks(name) + "/detach", {"server": self.server_name}
        )
