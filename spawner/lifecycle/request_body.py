"""The options of a server start as the spawner sees them, the same on JupyterHub 5 and 6.

JupyterHub 6 reads the body of ``POST /hub/api/users/{name}/server[s/{server}]`` as
``{"user_options": {...}, "display_name": "..."}``, and a body with neither key as the options
themselves (``get_server_json_body`` in jupyterhub/apihandlers/users.py, 6.0). JupyterHub 5
passes the whole body on as the options: on 5.5.0, which zero-to-jupyterhub 4.4.0's hub image
and so gputap's chart runs, the documented request (README, "Asking for a server through the
REST API") reached the spawner as ``{"user_options": {"kind": ...}}`` and was refused for
having no ``kind``. Read here as JupyterHub 6 reads it, one request means the same on both.
"""

from __future__ import annotations

from typing import Any

from ..core.placement import RequestError, asks_to_wait, canonical_options

#: the keys of JupyterHub 6's body for starting a server
BODY_KEYS = frozenset({"user_options", "display_name"})


def start_options(user_options: dict[str, Any] | None) -> dict[str, Any]:
    """``user_options`` unwrapped from JupyterHub 6's body where JupyterHub 5 left it wrapped,
    in their canonical form (:func:`~spawner.core.placement.canonical_options`).

    RequestError, as JupyterHub 6's 400, when the wrapped ``user_options`` is no object."""
    options = dict(user_options or {})
    if "user_options" in options and set(options) <= BODY_KEYS:
        inner = options["user_options"]
        if not (inner is None or isinstance(inner, dict)):
            raise RequestError("user_options must be an object or null")
        options = dict(inner or {})
    return canonical_options(options)


def apply_gpu_options(spawner: Any, user_options: dict[str, Any]) -> None:
    """JupyterHub's apply_user_options hook, before anything starts: the options as
    :func:`start_options` reads them (the same on JupyterHub 5 and 6, so the
    backend's spawner class never sees gputap's older ``profile`` key, KubeSpawner's), and a
    start that may wait in the queue gets ``queue_timeout`` more to start.

    They are parsed once, by ``start()`` (after the backend has read what it holds: a card
    NVML found may be what they ask for), which refuses a bad request with a 400 (JupyterHub
    logs that as one line; an exception raised here would be logged with a traceback)."""
    try:
        spawner.user_options = start_options(user_options)
    except RequestError as e:
        spawner.user_options, spawner.options_error = {}, str(e)
    else:
        spawner.options_error = None
    spawner.allow_queue_time(asks_to_wait(spawner.user_options))
