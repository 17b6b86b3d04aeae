"""Hub page handler answering "which card would this spec get now?" for the spawn form."""

from __future__ import annotations

import json

from jupyterhub.handlers import BaseHandler
from tornado import web

from ..lifecycle.mixin import PREVIEW_PATH


class PlacementPreviewHandler(BaseHandler):
    """GET /hub/gputap/preview?min_memory_gb=32&min_tflops=80&count=1 (logged-in users)."""

    @web.authenticated
    async def get(self) -> None:
        if self.current_user.kind != "user":
            raise web.HTTPError(403, "The spawn preview is for users, not services")
        options = {
            "kind": "spec",
            "min_memory_gb": self.get_argument("min_memory_gb", "0"),
            "min_tflops": self.get_argument("min_tflops", "0"),
            "count": self.get_argument("count", "1"),
        }
        spawner = self.current_user.get_spawner("", replace_failed=True)
        answer = await spawner.preview(options)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(answer))


default_handlers = [(rf"/{PREVIEW_PATH}", PlacementPreviewHandler)]
