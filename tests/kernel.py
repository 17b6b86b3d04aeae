"""Run code in a kernel of a user's running server, as a notebook does: the Jupyter server's
kernels API and its websocket (the Jupyter messaging protocol), through the hub's proxy."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from dataclasses import dataclass, field

import requests
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect


@dataclass
class Execution:
    """What one ``execute_request`` printed, and how it ended ("ok", "error", "abort")."""

    output: list[str] = field(default_factory=list)
    status: str = ""
    error: str = ""
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def text(self) -> str:
        return "".join(self.output)


class Kernel:
    """One kernel of ``user``'s server, started through its API with ``token``."""

    def __init__(self, url: str, user: str, token: str, server_name: str = ""):
        prefix = f"/user/{user}/{server_name + '/' if server_name else ''}"
        self.base = url + prefix
        self.ws_base = url.replace("http", "ws", 1) + prefix
        self.headers = {"Authorization": f"token {token}"}
        r = requests.post(self.base + "api/kernels", headers=self.headers, json={}, timeout=60)
        assert r.status_code == 201, r.text
        self.id = r.json()["id"]
        self.session = uuid.uuid4().hex

    def run(self, code: str, timeout: float = 120) -> Execution:
        """Execute ``code`` and wait for its end."""
        execution = self.start(code, timeout)
        assert execution.done.wait(timeout + 10), f"still running: {execution.text[-2000:]}"
        return execution

    def start(self, code: str, timeout: float = 120) -> Execution:
        """Execute ``code`` in the background; its Execution fills as output comes."""
        execution = Execution()
        thread = threading.Thread(
            target=lambda: asyncio.run(self._execute(code, execution, timeout)), daemon=True
        )
        thread.start()
        return execution

    def interrupt(self) -> None:
        r = requests.post(
            self.base + f"api/kernels/{self.id}/interrupt", headers=self.headers, timeout=30
        )
        assert r.status_code == 204, r.text

    async def _execute(self, code: str, execution: Execution, seconds: float) -> None:
        url = self.ws_base + f"api/kernels/{self.id}/channels?session_id={self.session}"
        ws = await websocket_connect(HTTPRequest(url, headers=self.headers))
        msg_id = uuid.uuid4().hex
        ws.write_message(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "msg_type": "execute_request",
                        "username": "test",
                        "session": self.session,
                        "version": "5.3",
                    },
                    "parent_header": {},
                    "metadata": {},
                    "content": {
                        "code": code,
                        "silent": False,
                        "store_history": True,
                        "user_expressions": {},
                        "allow_stdin": False,
                    },
                    "channel": "shell",
                }  # fmt: skip
            )
        )
        deadline = time.monotonic() + seconds
        idle = replied = False
        try:
            while not (idle and replied) and time.monotonic() < deadline:
                raw = await asyncio.wait_for(ws.read_message(), deadline - time.monotonic())
                if raw is None:
                    break
                message = json.loads(raw)
                if message.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, content = message["msg_type"], message["content"]
                if kind == "stream":
                    execution.output.append(content["text"])
                elif kind in ("execute_result", "display_data"):
                    execution.output.append(content["data"].get("text/plain", "") + "\n")
                elif kind == "error":
                    execution.error = f"{content['ename']}: {content['evalue']}"
                elif kind == "status" and content["execution_state"] == "idle":
                    idle = True
                elif kind == "execute_reply":
                    execution.status, replied = content["status"], True
        except TimeoutError:
            execution.status = "timeout"
        finally:
            ws.close()
            execution.done.set()
