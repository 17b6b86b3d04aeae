"""Why this server stops, as the hub tells it just before (docs/lab.md, "Why a server stopped").

The hub posts ``{"kind", "message", "todo", "at", "notice"}`` to ``gputap/stopping`` with the
server's own token a moment before it stops the server; for a GPU fault (kind ``fault``) also
``"restarting": true`` when it starts the server again by itself (absent: false), so Lab
follows the restart instead of saying the server stopped. The extension keeps it (the page's
next ``GET gputap/stopping`` reads it) and emits it as a Jupyter Server event, which an open
Lab page receives at once on its events stream.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import tornado.web

SCHEMA_ID = "https://events.gputap.io/gputap_lab/stopping/v1"
KINDS = ("credit", "idle", "change", "admin", "user", "hub", "died", "preempted", "fault")
FIELDS = ("kind", "message", "todo", "at", "notice")
#: fields the hub may add: each one's type (absent is false)
OPTIONAL = {"restarting": bool}
#: the longest text a field may carry (the hub's sentences are far shorter)
MAX_TEXT = 500

SCHEMA: dict[str, Any] = {
    "$id": SCHEMA_ID,
    "version": "1",
    "title": "gputap: this server stops",
    "personal-data": False,
    "description": "The hub tells the server why it is about to stop, and what to do.",
    "type": "object",
    "required": list(FIELDS),
    "properties": {
        "kind": {"enum": list(KINDS), "description": "Who or what stopped the server."},
        "message": {"type": "string", "description": "What happened, with the time."},
        "todo": {"type": "string", "description": "What the user can do next."},
        "at": {"type": "string", "description": "When the stop was asked for (ISO 8601)."},
        "notice": {"type": "string", "description": "message and todo as one sentence."},
        "restarting": {
            "type": "boolean",
            "description": "Whether the hub starts the server again by itself (a GPU fault).",
        },
    },
}


def stopping_body(body: Any) -> dict[str, Any]:
    """The hub's announcement checked, or 400 saying what is wrong (never echoing it)."""
    if not isinstance(body, dict):
        raise tornado.web.HTTPError(400, f"Send a JSON object with {', '.join(FIELDS)}.")
    missing = [key for key in FIELDS if key not in body]
    unknown = sorted(set(body) - set(FIELDS) - set(OPTIONAL))
    if missing or unknown:
        what = [f"missing {', '.join(missing)}"] if missing else []
        what += [f"{len(unknown)} unknown field(s)"] if unknown else []
        raise tornado.web.HTTPError(400, f"Bad announcement ({'; '.join(what)}): send {FIELDS}.")
    for key in FIELDS:
        if not isinstance(body[key], str) or len(body[key]) > MAX_TEXT:
            raise tornado.web.HTTPError(400, f"{key} must be text of at most {MAX_TEXT} characters")
    if body["kind"] not in KINDS:
        raise tornado.web.HTTPError(400, f"kind must be one of {', '.join(KINDS)}.")
    for key, kind in OPTIONAL.items():
        if key in body and not isinstance(body[key], kind):
            raise tornado.web.HTTPError(400, f"{key} must be true or false.")
    try:
        datetime.fromisoformat(body["at"])
    except ValueError:
        raise tornado.web.HTTPError(400, "at must be a time in ISO 8601.") from None
    return {key: body[key] for key in (*FIELDS, *OPTIONAL) if key in body}
