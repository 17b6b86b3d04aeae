"""What the hub's gputap API handlers share: where they live and how they answer.

Why not JupyterHub's ``@needs_scope``: a server or disk the caller may not see must answer
exactly as a missing one does, with a message naming it ("No server alice: it does not exist
or is not yours"), where needs_scope answers a generic 404 or a 403 that tells the two apart;
and the disks scope is a custom scope, which JupyterHub defines only once the hub starts,
after these modules are imported. The handlers check their scope with ``has_scope`` first.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from jupyterhub.apihandlers.base import APIHandler
from tornado import web

from gputap_common.bodies import BodyRefused, json_object

#: under the hub's base URL: {base_url}hub/gputap/api/...
API_PATH = "gputap/api"
#: the largest body the gputap API reads (413 above it); the real ones are a few hundred bytes
MAX_BODY_BYTES = 16 * 1024


class GPUTapAPIHandler(APIHandler):
    """A hub API handler answering JSON that is never cached (it changes second by second).

    Bodies are JSON objects of known keys (:meth:`json_body`) and at most MAX_BODY_BYTES."""

    async def prepare(self) -> None:
        await super().prepare()
        if len(self.request.body or b"") > MAX_BODY_BYTES:
            raise web.HTTPError(413, f"Request body too large: at most {MAX_BODY_BYTES} bytes")

    def json_body(self, allowed: Iterable[str]) -> dict[str, Any]:
        """The request's JSON object ({} for none), with no keys but ``allowed``: 400
        naming an unknown key and the allowed ones, or saying the body is no JSON object.
        (JupyterHub's get_json_body logs a traceback for a body nested too deep.)"""
        try:
            return json_object(self.request.body, allowed)
        except BodyRefused as e:
            raise web.HTTPError(400, str(e)) from None

    def write_json(self, data: dict[str, Any], status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(data))
