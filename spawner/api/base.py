"""What the hub's gputap API handlers share: where they live and how they answer.

Why not JupyterHub's ``@needs_scope``: a server or disk the caller may not see must answer
exactly as a missing one does, with a message naming it ("No server alice: it does not exist
or is not yours"), where needs_scope answers a generic 404 or a 403 that tells the two apart;
and the disks scope is a custom scope, which JupyterHub defines only once the hub starts,
after these modules are imported. The handlers check their scope with ``has_scope`` first.
"""

from __future__ import annotations

import json
from typing import Any

from jupyterhub.apihandlers.base import APIHandler

#: under the hub's base URL: {base_url}hub/gputap/api/...
API_PATH = "gputap/api"


class GPUTapAPIHandler(APIHandler):
    """A hub API handler answering JSON that is never cached (it changes second by second)."""

    def write_json(self, data: dict[str, Any], status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(data))
