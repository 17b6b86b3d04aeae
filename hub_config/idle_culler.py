"""jupyterhub-idle-culler, its stops sent to gputap's stop endpoint (``python -m
hub_config.idle_culler`` takes the culler's own options).

JupyterHub's ``DELETE /hub/api/users/{u}/server[s/{name}]`` does not tell the spawner who
asked, so a culled server could only say "stopped from the hub". gputap's endpoint beside it
(``POST /hub/gputap/api/users/{u}/server[s/{name}]/stop``, spawner/api/servers.py) records
that the idle culler asked and for how long the server was idle, and answers with the
DELETE's status codes (204 stopped, 202 still stopping, 400, 404), which the culler acts on
as before. Every other request goes out unchanged.

The culler builds its client with ``AsyncHTTPClient.configure(None, ...)`` (and tries pycurl
first), which resets whatever class was configured before it; so the default class itself
is replaced (``configurable_default``), which ``configure(None)`` falls back to.
"""

from __future__ import annotations

import re
import sys

from tornado.httpclient import AsyncHTTPClient, HTTPRequest
from tornado.simple_httpclient import SimpleAsyncHTTPClient

#: a server's DELETE in JupyterHub's REST API: {prefix}/hub/api/users/{u}/server[s/{name}]
_SERVER_DELETE = re.compile(r"(?P<hub>.*/)api/(?P<server>users/[^/]+/(?:server|servers/[^/]+))")


def gputap_stop(request: HTTPRequest) -> HTTPRequest:
    """The culler's request as it goes out: a server's DELETE (without a body: the culler
    was not asked to remove named servers) becomes gputap's stop; anything else as it is."""
    match = _SERVER_DELETE.fullmatch(request.url)
    if request.method != "DELETE" or not match or request.body:
        return request
    return HTTPRequest(
        f"{match['hub']}gputap/api/{match['server']}/stop",
        method="POST",
        headers=request.headers,
        body=b"",
        request_timeout=request.request_timeout,
        connect_timeout=request.connect_timeout,
    )


class GPUTapCullerClient(SimpleAsyncHTTPClient):
    """Tornado's HTTP client, sending the culler's stops to gputap's stop endpoint."""

    def fetch(self, request, raise_error=True, **kwargs):  # type: ignore[no-untyped-def]
        if isinstance(request, HTTPRequest):
            request = gputap_stop(request)
        return super().fetch(request, raise_error, **kwargs)


def install() -> None:
    """Make :class:`GPUTapCullerClient` the HTTP client of this process, whatever the
    culler configures: the default class, and no pycurl (its client would bypass it)."""
    AsyncHTTPClient.configurable_default = classmethod(lambda cls: GPUTapCullerClient)  # type: ignore[method-assign]
    AsyncHTTPClient.configure(None)
    sys.modules["pycurl"] = None  # type: ignore[assignment]


def main() -> None:
    from jupyterhub_idle_culler import main as culler_main

    install()
    culler_main()


if __name__ == "__main__":
    main()
