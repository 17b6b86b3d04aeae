"""Which loopback ports a server's ``/proxy/PORT/`` may reach: those its own processes listen on.

On one machine every server shares the machine's loopback, so jupyter-server-proxy's
``/proxy/8080/`` answered whatever listened on 8080, another user's app included. Here the
port must be held by a listening socket of a process in this server's tree (its kernels,
terminals, what they started, and what escaped them to the server's reaper, the subreaper
that adopts them). In a pod, the pod's own network holds only the pod's processes; the rule
holds there too.

Two ways in, one rule: :func:`own_listener` is jupyter-server-proxy's ``host_allowlist`` hook
(``/proxy/HOST:PORT/`` and the apps the server starts itself), and :class:`OwnPortProxy`
takes ``/proxy/PORT/`` and ``/proxy/absolute/PORT/``, which jupyter-server-proxy serves
without asking that hook.

Read from /proc (/proc/net/tcp{,6} and the tree's /proc/PID/fd); elsewhere than Linux
nothing is allowed but the apps the server starts itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from jupyter_server.utils import url_path_join
from jupyter_server_proxy.handlers import LocalProxyHandler
from tornado import web

from .cpu import stat_fields

LOOPBACK_HOSTS = {"localhost", "127.0.0.1", "::1", "[::1]"}
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
#: set by gputap's reaper (spawner/local/reaper.py) for the server it runs
REAPER_ENV = "GPUTAP_REAPER_PID"


def tree_root() -> int:
    """The top of this server's process tree: its reaper when it runs under one (orphans
    of the tree are re-parented there), else the server itself."""
    reaper = os.environ.get(REAPER_ENV, "")
    if reaper.isdigit() and int(reaper) == os.getppid():
        return int(reaper)
    return os.getpid()


def listening_inodes(port: int) -> set[str]:
    """The socket inodes listening on TCP ``port`` (any address, IPv4 or IPv6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)  # the header
                for line in f:
                    fields = line.split()
                    local, state, inode = fields[1], fields[3], fields[9]
                    if state == LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                        found.add(inode)
        except OSError:
            continue
    return found


def _tree(root: int) -> Iterator[int]:
    """``root`` and its live descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        fields = stat_fields(entry) if entry.isdigit() else None
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    todo = [root]
    while todo:
        pid = todo.pop()
        yield pid
        todo.extend(children.get(pid, []))


def _holds(pid: int, sockets: set[str]) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in sockets:
            return True
    return False


def tree_listens_on(root: int, port: int) -> bool:
    """Whether a process of ``root``'s tree holds a socket listening on ``port``."""
    sockets = listening_inodes(port)
    return bool(sockets) and any(_holds(pid, sockets) for pid in _tree(root))


def _port_of(handler) -> int | None:
    """The port a jupyter-server-proxy handler is about to reach: an app's own (``port``),
    or the one in ``/proxy/PORT/`` (its URL arguments)."""
    port = getattr(handler, "port", None)
    if isinstance(port, int) and port:
        return port
    args = [a for a in getattr(handler, "path_args", []) if a and a.isdigit()]
    return int(args[0]) if args else None


def _refusal(port: int) -> web.HTTPError:
    return web.HTTPError(
        403,
        f"Nothing your server started listens on port {port}. Start your app from this "
        "server's terminal or notebook (e.g. python -m http.server "
        f"{port}), then reload; another user's app is never reachable here.",
    )


def own_listener(handler, host: str) -> bool:
    """jupyter-server-proxy's host_allowlist: a loopback port of this server's own tree. A
    refusal of a page says what to do; a websocket's is only closed."""
    if getattr(handler, "unix_socket", None):
        return True  # an app the server itself started on a socket file of its own
    port = _port_of(handler)
    if host not in LOOPBACK_HOSTS or port is None:
        return False
    if tree_listens_on(tree_root(), port):
        return True
    if handler.request.headers.get("Upgrade", "").lower() == "websocket":
        return False
    raise _refusal(port)


class OwnPortProxy(LocalProxyHandler):
    """jupyter-server-proxy's ``/proxy/PORT/``, for ports of this server's tree only."""

    def proxy(self, port, proxied_path):
        if not tree_listens_on(tree_root(), int(port)):
            raise _refusal(int(port))
        return super().proxy(port, proxied_path)

    async def open(self, port, proxied_path):
        if not tree_listens_on(tree_root(), int(port)):
            self.close(4003, f"nothing this server started listens on port {port}")
            return None
        return await super().open(port, proxied_path)


def take_local_ports(web_app) -> None:
    """Serve ``/proxy/PORT/`` and ``/proxy/absolute/PORT/`` with :class:`OwnPortProxy`,
    ahead of jupyter-server-proxy's own handlers for them, whichever extension loaded first."""
    base = web_app.settings["base_url"]
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, r"/proxy/(\d+)(/.*|)"), OwnPortProxy, {"absolute_url": False}),
            (
                url_path_join(base, r"/proxy/absolute/(\d+)(/.*|)"),
                OwnPortProxy,
                {"absolute_url": True},
            ),
        ],
    )
    # tornado puts each host's rules before its own catch-all and after those added earlier;
    # the first rule that matches serves, so these move to the front
    rules = web_app.default_router.rules
    rules.insert(0, rules.pop(-2))
