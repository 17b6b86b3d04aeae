"""``gputap-worker``: the agent on each worker of a server's group (docs/scale-out.md).

The hub starts it on the worker (a process of the user's on one machine, a pod on
Kubernetes), in the server's environment, with the user's home as the working folder. It runs
one job at a time for the notebook (``gputap.run`` starts ``torchrun`` through it) and says how
it is. Every request needs the group's token (``$GPUTAP_WORKER_TOKEN``, given by the hub; the
notebook reads it from the hub's workers API), sent as ``Authorization: token …``.

- ``GET /status``: ``{"name", "busy", "job", "idle_since", "gpus", "gpu_note"}``.
- ``POST /run`` ``{"argv": [...], "env": {...}, "cwd": "..."}``: run ``argv`` (a leading
  ``python`` is this environment's interpreter) in a process group of its own; the answer
  streams its output as JSON lines ``{"out": "…"}`` (a line, or an update a progress bar
  ends with ``\\r``) and ends with ``{"exit": code}``. When the caller goes away (an
  interrupted cell, a lost notebook) the job's whole process group is ended: SIGTERM, then
  SIGKILL after ``GRACE_SECONDS``. 409 while a job runs or starts.
- ``DELETE /run``: end the running job the same way.

It imports no GPU library until asked for GPU use, and NVML's calls run in an executor.
"""

from __future__ import annotations

import argparse
import asyncio
import codecs
import contextlib
import hmac
import json
import logging
import os
import re
import signal
import socket
import sys
from datetime import UTC, datetime
from typing import Any

import tornado.web
from tornado.httpserver import HTTPServer
from tornado.iostream import StreamClosedError

from .bodies import TOO_DEEP, NotJSON, read_json

log = logging.getLogger("gputap.worker")

TOKEN_ENV = "GPUTAP_WORKER_TOKEN"
#: between SIGTERM and SIGKILL of a job's process group
GRACE_SECONDS = 3.0
#: the largest request body (a job's argv and environment)
MAX_BODY_BYTES = 64 * 1024
#: a job's output is read this much at a time, and sent at most this long a piece
OUTPUT_CHUNK = 64 * 1024
#: how long a GPU reading is reused
GPU_CACHE_SECONDS = 2.0


def utcnow() -> datetime:
    return datetime.now(UTC)


class Job:
    """The one running job: its process and where its output goes."""

    def __init__(self, proc: asyncio.subprocess.Process, argv: list[str]):
        self.proc = proc
        self.argv = argv
        self.started_at = utcnow()

    def view(self) -> dict[str, Any]:
        return {
            "pid": self.proc.pid,
            "command": os.path.basename(self.argv[0]),
            "started_at": self.started_at.isoformat(),
        }

    async def end(self) -> int:
        """End the job's whole process group (SIGTERM, then SIGKILL); its exit code."""
        if self.proc.returncode is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), GRACE_SECONDS)
            except TimeoutError:
                _signal_group(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()
        # what the job left behind in its group goes too
        _signal_group(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode


class Busy(Exception):
    """A job runs (or is starting) on this worker already."""


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Agent:
    """The worker's state: its job, since when it is idle, its GPUs."""

    def __init__(self, name: str, token: str):
        self.name = name
        self.token = token
        self.job: Job | None = None
        #: a job is being started: the worker is busy before its process exists
        self.starting = False
        self.idle_since = utcnow()
        self._gpus: tuple[float, list[dict[str, Any]] | None, str] | None = None
        self._reader: Any = None

    @property
    def busy(self) -> bool:
        return self.job is not None or self.starting

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "busy": self.busy,
            "job": self.job.view() if self.job else None,
            "idle_since": None if self.busy else self.idle_since.isoformat(),
        }

    async def gpus(self) -> tuple[list[dict[str, Any]] | None, str]:
        """This worker's GPU use (None and why when there are no numbers)."""
        loop = asyncio.get_running_loop()
        if self._gpus and loop.time() - self._gpus[0] < GPU_CACHE_SECONDS:
            return self._gpus[1], self._gpus[2]
        gpus, note = await loop.run_in_executor(None, self._read_gpus)
        self._gpus = (loop.time(), gpus, note)
        return gpus, note

    def _read_gpus(self) -> tuple[list[dict[str, Any]] | None, str]:
        from .gpu import GPUUnavailable, NvmlReader, visible_devices

        if os.environ.get("GPUTAP_SIMULATED") == "1":
            return None, "simulated card: no live numbers"
        devices = visible_devices(os.environ)
        if devices == []:
            return None, "CPU only"
        if self._reader is None:
            self._reader = NvmlReader(devices)
        try:
            return [sample.to_json() for sample in self._reader.read()], ""
        except GPUUnavailable as e:
            return None, str(e)

    async def start(self, argv: list[str], env: dict[str, str], cwd: str) -> Job:
        """Start the job; Busy when one runs or starts (checked and marked before any await,
        so that two requests at once cannot both start one)."""
        if self.busy:
            raise Busy
        if argv[0] == "python":
            argv = [sys.executable, *argv[1:]]
        self.starting = True
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, **env},
                cwd=cwd or None,
                start_new_session=True,  # its own process group, ended as a whole
            )
        finally:
            self.starting = False
        self.job = Job(proc, argv)
        log.info("job started: pid %s, %s", proc.pid, os.path.basename(argv[0]))
        return self.job

    def finished(self, job: Job) -> None:
        if self.job is job:
            self.job = None
            self.idle_since = utcnow()
            log.info("job ended: pid %s, exit %s", job.proc.pid, job.proc.returncode)


class Handler(tornado.web.RequestHandler):
    @property
    def agent(self) -> Agent:
        return self.settings["agent"]

    def prepare(self) -> None:
        sent = self.request.headers.get("Authorization", "")
        scheme, _, token = sent.partition(" ")
        if scheme.lower() != "token" or not hmac.compare_digest(
            token.encode(), self.agent.token.encode()
        ):
            raise tornado.web.HTTPError(403, "this worker answers its group's token only")
        if len(self.request.body or b"") > MAX_BODY_BYTES:
            raise tornado.web.HTTPError(413, f"at most {MAX_BODY_BYTES} bytes")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        error = (kwargs.get("exc_info") or (None, None, None))[1]
        message = getattr(error, "log_message", None) or self._reason
        self.finish({"status": status_code, "message": message})

    def log_exception(self, typ, value, tb) -> None:
        if not isinstance(value, tornado.web.HTTPError):
            super().log_exception(typ, value, tb)


class StatusHandler(Handler):
    async def get(self) -> None:
        gpus, note = await self.agent.gpus()
        self.finish({**self.agent.status(), "gpus": gpus, "gpu_note": note})


def job_body(raw: bytes) -> tuple[list[str], dict[str, str], str]:
    """``{"argv", "env", "cwd"}`` checked, or 400 saying what is wrong."""
    try:
        body = read_json(raw or b"{}")
    except NotJSON as e:
        why = f" ({e})" if str(e) == TOO_DEEP else ""
        raise tornado.web.HTTPError(400, f"send a JSON object {{argv, env, cwd}}{why}") from None
    if not isinstance(body, dict) or set(body) - {"argv", "env", "cwd"}:
        raise tornado.web.HTTPError(400, "send a JSON object with argv, env and cwd only")
    argv, env, cwd = body.get("argv"), body.get("env") or {}, body.get("cwd") or ""
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise tornado.web.HTTPError(400, "argv must be a non-empty list of strings")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise tornado.web.HTTPError(400, "env must map names to strings")
    if not isinstance(cwd, str):
        raise tornado.web.HTTPError(400, "cwd must be a folder's path")
    # the operating system takes none of these (subprocess raises ValueError)
    nul = [f"argv[{i}]" for i, a in enumerate(argv) if "\0" in a]
    nul += [f"env {_shown(k)}" for k, v in env.items() if "\0" in k or "\0" in v]
    nul += ["cwd"] if "\0" in cwd else []
    if nul:
        raise tornado.web.HTTPError(400, f"a NUL character cannot be passed: {', '.join(nul)}")
    if bad := [_shown(k) for k in env if not k or "=" in k]:
        raise tornado.web.HTTPError(
            400, f"env names must be non-empty, without '=': {', '.join(bad)}"
        )
    return argv, env, cwd


def _shown(name: str, most: int = 40) -> str:
    """A name in a refusal: quoted (control characters escaped) and cut short."""
    return repr(name if len(name) <= most else name[:most] + "…")


_PIECE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)")


def output_pieces(text: str, final: bool = False) -> tuple[list[str], str]:
    """The pieces of a job's output to send (each up to and with its ``\\n``, ``\\r\\n`` or
    ``\\r``: a progress bar's update is a piece of its own) and what waits for more. A piece
    with no end is sent in parts once it reaches ``OUTPUT_CHUNK``; ``final`` sends the rest."""
    pieces: list[str] = []
    at = 0
    for match in _PIECE.finditer(text):
        if not final and match.end() == len(text) and match.group().endswith("\r"):
            break  # a "\n" may follow in the next read
        pieces.append(match.group())
        at = match.end()
    rest = text[at:]
    while len(rest) >= OUTPUT_CHUNK or (final and rest):
        pieces.append(rest[:OUTPUT_CHUNK])
        rest = rest[OUTPUT_CHUNK:]
    return pieces, rest


class RunHandler(Handler):
    _job: Job | None = None

    async def post(self) -> None:
        argv, env, cwd = job_body(self.request.body)
        try:
            job = self._job = await self.agent.start(argv, env, cwd)
        except Busy:
            raise tornado.web.HTTPError(409, "a job runs on this worker already") from None
        except (OSError, ValueError) as e:  # ValueError: what job_body did not foresee
            raise tornado.web.HTTPError(400, f"cannot run {os.path.basename(argv[0])}: {e}") from e
        self.set_header("Content-Type", "application/x-ndjson")
        self.set_header("Cache-Control", "no-store")
        try:
            await self._stream(job)
        except StreamClosedError:
            pass  # the caller went away: so does its job, below
        finally:
            # whatever ended the stream, nothing of a job the agent forgets runs on: not the
            # job, nor what it left in its process group (a child still holding the GPU)
            await job.end()
            self.agent.finished(job)
        with contextlib.suppress(StreamClosedError):
            self.finish()

    async def _stream(self, job: Job) -> None:
        """The job's output as ``{"out"}`` lines, then its ``{"exit"}``. Read in chunks, not
        lines: a progress bar may write for hours without a newline."""
        assert job.proc.stdout is not None
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        rest = ""
        while True:
            chunk = await job.proc.stdout.read(OUTPUT_CHUNK)
            pieces, rest = output_pieces(rest + decoder.decode(chunk, final=not chunk), not chunk)
            for piece in pieces:
                self.write(json.dumps({"out": piece}) + "\n")
            if pieces:
                await self.flush()
            if not chunk:
                break
        code = await job.proc.wait()
        self.write(json.dumps({"exit": code}) + "\n")
        await self.flush()

    def on_connection_close(self) -> None:
        if self._job is not None and self._job.proc.returncode is None:
            asyncio.ensure_future(self._job.end())

    async def delete(self) -> None:
        job = self.agent.job
        if job is None:
            self.set_status(204)
            return self.finish()
        code = await job.end()
        self.finish({"exit": code})


def make_app(agent: Agent) -> tornado.web.Application:
    return tornado.web.Application(
        [(r"/status", StatusHandler), (r"/run", RunHandler)], agent=agent
    )


async def serve(host: str, port: int, agent: Agent, fd: int | None = None) -> None:
    """Answer on ``host:port``, or on the listening socket ``fd`` the hub bound and handed
    over (one machine: no other local user can take the port between its choice and the
    agent's start, and be sent the group's token)."""
    server = HTTPServer(make_app(agent), max_body_size=MAX_BODY_BYTES)
    if fd is None:
        server.listen(port, host)
    else:
        os.set_inheritable(fd, False)  # the jobs do not get it
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        server.add_sockets([sock])
        host, port = sock.getsockname()[:2]
    log.info("gputap worker %s listening on %s:%s", agent.name, host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.stop()
    if agent.job is not None:
        await agent.job.end()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gputap-worker", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8790, help="port to listen on")
    parser.add_argument("--fd", type=int, help="a listening socket to answer on instead")
    parser.add_argument("--name", default=os.environ.get("GPUTAP_WORKER_NAME", "worker"))
    args = parser.parse_args(argv)
    token = os.environ.get(TOKEN_ENV, "")
    if len(token) < 16:
        print(f"gputap-worker: ${TOKEN_ENV} (the group's token) is missing", file=sys.stderr)
        return 2
    os.environ.pop(TOKEN_ENV)  # jobs do not need it
    logging.basicConfig(
        level=logging.INFO, format="[%(levelname)1.1s %(asctime)s worker] %(message)s"
    )
    asyncio.run(serve(args.host, args.port, Agent(args.name, token), args.fd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
