"""`GitHubSim`: the GitHub stand-in as a server, in the caller's event loop or in a thread.

async with GitHubSim() as github:            # in the test's loop
    github.add_user("alice")

with GitHubSim(max_per_page=2).in_thread() as github:   # for sync tests and subprocesses
    github.add_org("acme", members=["alice"])
    ... GitHubOAuthenticator(github_url=github.url) ...
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import tornado.httpserver
from tornado.netutil import bind_sockets

from .server import make_apps
from .state import Fault, GitHubState, Org, Team, User


class GitHubSim:
    """A stand-in GitHub (OAuth web flow + REST API) on 127.0.0.1.

    ``layout`` "server": the REST API under ``{url}/api/v3`` (GitHub Enterprise Server);
    "ghe.com": at the root of a port of its own, ``api_url`` (api.github.com, and GitHub
    Enterprise Cloud with data residency, api.SUB.ghe.com). Keyword arguments go to
    :class:`GitHubState`: `client_id`, `client_secret`, `callback_url` (the app's registered
    callback; by default http://127.0.0.1/hub/oauth_callback, which loopback hubs on any port
    match), `max_per_page` (GitHub caps at 100). Declarations are thread-safe and may change
    while the server runs.
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, layout: str = "server", **state: Any
    ):
        if layout not in ("server", "ghe.com"):
            raise ValueError(f"layout must be server or ghe.com, not {layout!r}")
        self.state = GitHubState(**state)
        self.host = host
        self.port = port
        self.layout = layout
        self.api_port = 0
        self._servers: list[tornado.httpserver.HTTPServer] = []

    @property
    def url(self) -> str:
        """What `GitHubOAuthenticator.github_url` is set to."""
        return f"http://{self.host}:{self.port}"

    @property
    def api_url(self) -> str:
        """Where the REST API is (`GitHubOAuthenticator.github_api`)."""
        if self.layout == "ghe.com":
            return f"http://{self.host}:{self.api_port}"
        return f"{self.url}/api/v3"

    def register_callback(self, url: str) -> None:
        """The OAuth app's one registered callback URL."""
        self.state.callback_url = url

    def restrict_apps(self, org: str) -> None:
        self.state.restrict_apps(org)

    def approve_app(self, org: str) -> None:
        self.state.approve_app(org)

    def require_saml(self, org: str) -> None:
        self.state.require_saml(org)

    def authorize_sso(self, login: str, org: str) -> None:
        self.state.authorize_sso(login, org)

    def rename_user(self, old: str, new: str) -> User:
        return self.state.rename_user(old, new)

    def fail(self, path: str, status: int | None, **kwargs: Any) -> Fault:
        """Answer requests to ``path`` (exact or glob, e.g. ``/api/v3/orgs/*``) with
        ``status``; kwargs ``times``, ``retry_after``, ``delay``, ``rate_limited``."""
        return self.state.fail(path, status, **kwargs)

    def clear_faults(self) -> None:
        self.state.clear_faults()

    @property
    def client_id(self) -> str:
        return self.state.client_id

    @property
    def client_secret(self) -> str:
        return self.state.client_secret

    @property
    def requests(self) -> list[tuple[str, str]]:
        """(method, path) of every REST call so far."""
        return self.state.requests

    def add_user(self, login: str, **kwargs: Any) -> User:
        return self.state.add_user(login, **kwargs)

    def add_org(self, login: str, **kwargs: Any) -> Org:
        return self.state.add_org(login, **kwargs)

    def add_member(self, org: str, login: str, **kwargs: Any) -> None:
        self.state.add_member(org, login, **kwargs)

    def add_team(self, org: str, slug: str, **kwargs: Any) -> Team:
        return self.state.add_team(org, slug, **kwargs)

    def load(self, spec: dict[str, Any]) -> None:
        self.state.load(spec)

    async def start(self) -> None:
        sockets = [bind_sockets(self.port, self.host)]
        self.port = sockets[0][0].getsockname()[1]
        if self.layout == "ghe.com":
            sockets.append(bind_sockets(self.api_port, self.host))
            self.api_port = sockets[1][0].getsockname()[1]
        for app, bound in zip(make_apps(self.state, self.layout, self.url), sockets, strict=True):
            server = tornado.httpserver.HTTPServer(app, xheaders=False)
            server.add_sockets(bound)
            self._servers.append(server)

    async def stop(self) -> None:
        for server in self._servers:
            server.stop()
            await server.close_all_connections()
        self._servers.clear()

    async def __aenter__(self) -> GitHubSim:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @contextlib.contextmanager
    def in_thread(self) -> Iterator[GitHubSim]:
        """Serve from a daemon thread with its own event loop, for the length of the block."""
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="github-sim", daemon=True)
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.start(), loop).result(10)
            yield self
        finally:
            asyncio.run_coroutine_threadsafe(self.stop(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()
