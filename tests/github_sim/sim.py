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

from .server import make_app
from .state import GitHubState, Org, Team, User


class GitHubSim:
    """A stand-in GitHub (OAuth web flow + REST under /api/v3) on 127.0.0.1.

    Keyword arguments go to :class:`GitHubState`: `client_id`, `client_secret`,
    `callback_url` (empty: any redirect_uri), `max_per_page` (GitHub caps at 100).
    Declarations are thread-safe and may change while the server runs.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, **state: Any):
        self.state = GitHubState(**state)
        self.host = host
        self.port = port
        self._server: tornado.httpserver.HTTPServer | None = None

    @property
    def url(self) -> str:
        """What `GitHubOAuthenticator.github_url` is set to."""
        return f"http://{self.host}:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api/v3"

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
        sockets = bind_sockets(self.port, self.host)
        self.port = sockets[0].getsockname()[1]
        self._server = tornado.httpserver.HTTPServer(make_app(self.state), xheaders=False)
        self._server.add_sockets(sockets)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            await self._server.close_all_connections()
            self._server = None

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
