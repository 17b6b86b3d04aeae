"""gputap inside JupyterLab: the server extension and the prebuilt front end."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "gputap-lab"}]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    # imported here, not above: gputap-worker (gputap_lab.worker) starts without
    # jupyter_server's import, seconds of CPU on each worker
    from .app import GPUTapLab

    return [{"module": "gputap_lab.app", "app": GPUTapLab}]
