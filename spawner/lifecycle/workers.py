"""A server's worker group: its workers placed, admitted, launched, watched and stopped, each
with a billing session of its own (docs/scale-out.md).

Backend-neutral: a :class:`WorkerBackend` (spawner/local/workers.py, spawner/kube/workers.py)
takes and gives back devices and starts and stops one worker. A worker is *ready* when its
agent (``gputap-worker``) answers; its billing session opens then and closes at its end, once:
at the stop's request when it was asked to stop, at its exit when it died. The group is kept
in the server's spawner state, so a hub restart finds its workers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from tornado import web

from gputap_common import clock
from gputap_common.bodies import shown
from gputap_common.money import format_credits

from ..core.catalog import Catalog
from ..core.placement import FreeView, Placement, Refusal, Request
from ..core.record import ServerRecord
from ..core.workers import (
    ACTIVE,
    FAILED,
    LIVE,
    PLACING,
    READY,
    STARTING,
    STOPPED,
    STOPPING,
    WAITING,
    Worker,
    WorkerRequest,
    request_view,
    worker_holder,
)
from .agent import AgentClient, AgentUnavailable, agent_status
from .billing_client import BillingClient
from .machine import Machine
from .metering import Metering
from .starting import Start

#: how often the group asks its agents how they are (busy, GPU use)
STATUS_SECONDS = 2.0
#: how long a launched worker has to answer before it counts as failed
READY_TIMEOUT_SECONDS = 120.0


class WorkerBackend(Protocol):
    """What a backend does for workers (one machine: processes; Kubernetes: pods)."""

    async def views(self, request: Request) -> tuple[Callable[[], FreeView], FreeView]:
        """What is free for a worker (a callable placement reads) and the view priced."""

    async def launch(self, worker: Worker, token: str) -> tuple[str, int]:
        """Start the worker's agent; where it will answer (host, port)."""

    async def wait(self, worker: Worker) -> tuple[datetime, str]:
        """Return when the worker has ended: when, and how ("exited with code 1")."""

    async def stop(self, worker: Worker) -> None:
        """Ask the worker to end (``wait`` returns once it has)."""

    def still_runs(self, worker: Worker) -> bool:
        """After a hub restart: whether the worker saved in the state still runs (its
        devices are then claimed again)."""

    def rendezvous_host(self) -> str:
        """The notebook's address as the workers reach it."""


class GroupOwner(Protocol):
    """What a group needs of its server's spawner (GPUSpawnerMixin provides it)."""

    who: str
    name: str
    record: ServerRecord | None
    log: Any
    catalog: Catalog
    billing: BillingClient
    worker_idle_seconds: int

    @property
    def machine(self) -> Machine: ...

    def worker_backend(self) -> WorkerBackend: ...

    async def prices_for(self, view: FreeView, price_class: str = "on-demand") -> dict: ...

    def wake_queue(self) -> None: ...

    def save_state_now(self) -> None: ...


class WorkerGroup:
    """The workers of one server: at most one group, resized by asking again."""

    def __init__(self, owner: GroupOwner, user: str):
        self.owner = owner
        self.user = user
        self.workers: dict[int, Worker] = {}
        self.request: WorkerRequest | None = None
        self.token = ""
        self._lock = asyncio.Lock()
        self._watch: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        #: each worker's life (placing, launching, watching it), by index
        self._lives: dict[int, asyncio.Task] = {}
        #: each starting worker's way through the start pipeline, by index
        self._starts: dict[int, Start] = {}
        #: workers whose agent sent a malformed status (logged once each)
        self._garbled: set[int] = set()
        #: how the workers that ended under an earlier spawner object ended (their views, by
        #: index): JupyterHub drops a stopped server's spawner, and the group's state outlives it
        self.ended: dict[int, dict[str, Any]] = {}

    # -- views ----------------------------------------------------------------------------

    @property
    def active(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.state in ACTIVE]

    def view(self, with_token: bool = False) -> dict[str, Any]:
        """The group as ``GET {server}/workers`` answers (docs/scale-out.md)."""
        live = [w for w in self.workers.values() if w.state in LIVE and w.record]
        rate = sum(self._rate(w) for w in live)
        placed = [w.record for w in self.active if w.record]
        views = {**self.ended, **{w.index: w.view() for w in self.workers.values()}}
        view: dict[str, Any] = {
            "server": self.owner.name,
            "workers": [views[i] for i in sorted(views)],
            "count": len(self.active),
            "request": request_view(self.request.request) if self.request else None,
            "offering": placed[0].offering if placed else None,
            "rate_per_hour_micro": rate,
            "price_per_hour": format_credits(rate),
            "idle_seconds": self.owner.worker_idle_seconds,
            "rendezvous_host": self.owner.worker_backend().rendezvous_host(),
        }
        if with_token:
            view["token"] = self.token
        return view

    def _rate(self, worker: Worker) -> int:
        return worker.handle.get("price_per_hour_micro", 0) * (
            worker.record.count if worker.record else 0
        )

    def holder(self, worker: Worker) -> str:
        return worker_holder(self.owner.who, worker.name)

    def metering(self, worker: Worker) -> Metering:
        owner = self.owner
        return Metering(owner.billing, self.user, owner.name, self.holder(worker), owner.log)

    def _start_of(self, worker: Worker) -> Start:
        """The worker's start (spawner/lifecycle/starting.py), made as it is placed."""
        start = self._starts.get(worker.index)
        if start is None:
            owner = self.owner
            start = Start(
                owner.machine, self.metering(worker), owner.catalog, self.holder(worker), owner.log
            )
            self._starts[worker.index] = start
        return start

    # -- asking for workers -----------------------------------------------------------------

    async def scale(self, wanted: WorkerRequest) -> None:
        """Grow the group to ``wanted.count`` workers (placed and admitted now unless they
        may wait in the queue), or shrink it; 409 when the server does not run or the group
        runs something else, or (not queued) what is asked is not free; 402 credit."""
        async with self._lock:
            server = self.owner.record
            if server is None or server.started_at is None:
                raise web.HTTPError(409, f"{self.owner.who} is not running: start it first")
            active = sorted((w for w in self.active if w.state != STOPPING), key=lambda w: w.index)
            if active and self.request and wanted.request != self.request.request:
                raise web.HTTPError(
                    409,
                    "The group runs other workers; stop it first to change what they run on.",
                )
            self.request = wanted
            if not self.token or not active:
                # a group growing from empty gets a new token: the last one was dropped from
                # the saved state when its last worker ended (to_state)
                self.token = secrets.token_urlsafe(32)
            if len(active) > wanted.count:
                extra = [w.index for w in active[wanted.count :]]
                self._stop_now(extra, "The group was made smaller.")
                return
            new = [self._new_worker() for _ in range(wanted.count - len(active))]
            if not new:
                return
            try:
                if wanted.queue:
                    for worker in new:
                        self._spawn(self._place_and_run(worker, server), worker)
                else:
                    await self._place_all(new, server)
                    for worker in new:
                        if worker.state == STARTING:
                            self._spawn(self._run(worker), worker)
                        else:  # stopped while it was placed or admitted: it has no life
                            self._give_back(worker)  # task a stop could cancel
            except BaseException:
                for worker in new:
                    self.workers.pop(worker.index, None)
                raise
            self._ensure_watch()
            self.owner.save_state_now()

    def _new_worker(self) -> Worker:
        index = 1
        while index in self.workers and self.workers[index].state in ACTIVE:
            index += 1
        worker = Worker(index)
        self.workers[index] = worker
        return worker

    async def _place_all(self, new: list[Worker], server: ServerRecord) -> None:
        """Place and admit every new worker now, or none: a refusal gives back what the
        others took."""
        request = self.request.request
        free_view, price_view = await self.owner.worker_backend().views(request)
        prices = await self.owner.prices_for(price_view)
        taken: list[Worker] = []
        try:
            for n, worker in enumerate(new):
                if worker.state != PLACING:
                    continue  # stopped while the views and prices were asked for
                # no await between deciding and taking: no other spawn decides in between
                answer = self._start_of(worker).decide(request, free_view(), prices)
                if isinstance(answer, Refusal):
                    placed = f" ({n} could be placed)" if n else ""
                    raise web.HTTPError(
                        409,
                        f"Not enough free for {len(new)} more worker(s){placed}: "
                        f"{answer.message} Ask to wait in the queue, or ask for fewer.",
                    )
                self._take(worker, answer, server)
                taken.append(worker)
            for worker in taken:
                if worker.state == STARTING:
                    await self._start_of(worker).admit()
        except BaseException:
            for worker in taken:
                await self._starts.pop(worker.index).give_back()
            raise

    def _take(self, worker: Worker, placement: Placement, server: ServerRecord) -> None:
        worker.record = ServerRecord(
            session_id=str(uuid.uuid4()),
            offering=placement.offering.key,
            count=placement.count,
            course=server.course,
            environment=server.environment,
            worker=worker.name,
        )
        worker.label = placement.offering.label
        worker.placement = placement
        worker.handle["price_per_hour_micro"] = placement.price_per_hour_micro
        self._start_of(worker).take(placement, worker.record)
        worker.set(STARTING, f"placed on {placement.offering.label}")

    async def _place_and_run(self, worker: Worker, server: ServerRecord) -> None:
        """A worker that may wait in the queue: placed when its offering is free, then run."""
        request = self.request.request
        start = self._start_of(worker)
        try:
            free_view, price_view = await self.owner.worker_backend().views(request)
            prices = await self.owner.prices_for(price_view)

            def note(text: str) -> None:
                if text and worker.state in (PLACING, WAITING):
                    worker.set(WAITING, text)

            placement = await start.place(
                request,
                free_view=free_view,
                prices=prices,
                may_wait=True,
                wait_seconds=3600,
                note=note,
            )
            self._take(worker, placement, server)
            await start.admit()
        except asyncio.CancelledError:
            self._give_back(worker)
            raise
        except Exception as e:
            self._give_back(worker)
            worker.set(FAILED, _why(e))
            self.owner.log.info("%s: %s not placed: %s", self.owner.who, worker.name, worker.reason)
            return
        await self._run(worker)

    def _give_back(self, worker: Worker) -> None:
        """The failure path of a start that cannot wait (a cancelled one): the devices back
        now, billing's hold released in the background."""
        start = self._starts.pop(worker.index, None)
        if start is not None:
            start.give_back_soon(self._spawn)

    # -- one worker's life ------------------------------------------------------------------

    async def _run(self, worker: Worker) -> None:
        """Launch, wait until its agent answers, open its session (the start pipeline's
        last steps), then watch it to its end."""
        backend = self.owner.worker_backend()
        log, who = self.owner.log, self.holder(worker)
        ended: asyncio.Future | None = None

        async def stop() -> None:
            if ended is None or not ended.done():
                with contextlib.suppress(Exception):
                    await backend.stop(worker)
            if ended is not None:
                ended.cancel()

        async def launch() -> datetime:
            nonlocal ended
            try:
                worker.host, worker.port = await backend.launch(worker, self.token)
                ended = asyncio.ensure_future(backend.wait(worker))
                await self._until_ready(worker, ended)
            except BaseException:
                await stop()
                raise
            return clock.utcnow()

        async def ready_at(at: datetime) -> datetime:
            return at

        try:
            started = await self._starts.pop(worker.index).run(launch, ready_at, stop)
        except BaseException as e:
            if isinstance(e, asyncio.CancelledError):
                worker.set(STOPPED, worker.reason)
                raise
            worker.set(FAILED, _why(e))
            log.info("%s: did not start: %s", who, worker.reason)
            self.owner.save_state_now()
            return
        worker.started_at = worker.idle_since = worker.seen_at = started
        worker.set(READY)
        log.info("%s: ready at %s:%s, billing session %s", who, worker.host, worker.port,
                 worker.record.session_id)  # fmt: skip
        self.owner.save_state_now()
        await self._watch_until_end(worker, ended)

    async def _until_ready(self, worker: Worker, ended: asyncio.Future) -> None:
        agent = AgentClient(worker.host, worker.port, self.token)
        deadline = asyncio.get_running_loop().time() + READY_TIMEOUT_SECONDS
        try:
            while True:
                if ended.done():
                    _, how = ended.result()
                    raise RuntimeError(f"it {how} before it answered")
                with contextlib.suppress(AgentUnavailable):
                    self._heard(worker, await agent.status())
                    return
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"it did not answer within {READY_TIMEOUT_SECONDS:.0f} s")
                await asyncio.sleep(0.1)
        finally:
            agent.close()

    async def _watch_until_end(self, worker: Worker, ended: asyncio.Future) -> None:
        """Wait for the worker's end; settle its session there: at the stop's request when
        one was asked, else at its exit (it died)."""
        try:
            at, how = await ended
        except asyncio.CancelledError:
            return  # the hub is shutting down: the worker runs on, its state is saved
        await self._ended(worker, at, how)

    async def _ended(self, worker: Worker, at: datetime, how: str) -> None:
        record = worker.record
        asked = worker.stop_asked
        end = min(asked, at) if asked else at
        worker.ended_at = max(end, worker.started_at or end)
        if asked:
            worker.set(STOPPED, worker.reason)
        else:
            worker.set(FAILED, f"It {how} at {end:%H:%M:%S} UTC; the rest of the group runs on.")
        self.owner.machine.release(record, self.holder(worker))
        self.owner.wake_queue()
        result = await self.metering(worker).settle(record, worker.ended_at)
        billed = result.get("billed_seconds") if result else "(pending)"
        self.owner.log.info(
            "%s#%s: %s (%s); billed %s s (session %s)",
            *(self.owner.who, worker.name, worker.state, how, billed, record.session_id),
        )
        self.owner.save_state_now()

    def _heard(self, worker: Worker, status: Any) -> None:
        """Take what the agent said; a status that is not as the agent writes it is ignored
        (logged once per worker) and the worker's last known values stay."""
        heard = agent_status(status)
        if heard is None:
            if worker.index not in self._garbled:
                self._garbled.add(worker.index)
                self.owner.log.warning(
                    "%s#%s: its agent's status is malformed (%s); ignored",
                    *(self.owner.who, worker.name, shown(status)),
                )
            return
        busy, idle_since, gpus, note = heard
        worker.busy = busy
        worker.idle_since = idle_since or worker.idle_since
        worker.gpus = gpus
        worker.gpu_note = note
        worker.seen_at = clock.utcnow()

    # -- watching the group -------------------------------------------------------------------

    def _ensure_watch(self) -> None:
        if self._watch is None or self._watch.done():
            self._watch = asyncio.ensure_future(self._watch_group())

    async def _watch_group(self) -> None:
        """Ask the ready workers how they are; stop the group once none ran a job for the
        idle time. Ends when the group has no active worker."""
        agents: dict[int, AgentClient] = {}
        try:
            while self.active:
                await asyncio.sleep(STATUS_SECONDS)
                ready = [w for w in self.active if w.state == READY]
                for worker in ready:
                    agent = agents.get(worker.index)
                    if agent is None or (agent.host, agent.port) != (worker.host, worker.port):
                        agent = agents[worker.index] = AgentClient(
                            worker.host, worker.port, self.token
                        )
                    with contextlib.suppress(AgentUnavailable):
                        self._heard(worker, await agent.status())
                self._stop_if_idle(ready)
        finally:
            for agent in agents.values():
                agent.close()

    def _stop_if_idle(self, ready: list[Worker]) -> None:
        limit = self.owner.worker_idle_seconds
        if not ready or limit <= 0 or any(w.busy for w in ready):
            return
        last = max(w.idle_since or w.started_at or clock.utcnow() for w in ready)
        idle = (clock.utcnow() - last).total_seconds()
        if idle >= limit:
            took = f"{idle:.0f} s" if idle < 120 else f"{round(idle / 60)} minutes"
            self._stop_now(
                [w.index for w in self.active],
                f"No job ran on the group for {took} (scale_out.idle_seconds).",
            )

    # -- stopping -----------------------------------------------------------------------------

    def _stop_now(
        self, indexes: list[int], reason: str, at: datetime | None = None
    ) -> list[Worker]:
        """Ask the workers to stop (billing ends now, or ``at``: a GPU fault's detection);
        returns those that were active."""
        asked = min(at, clock.utcnow()) if at else clock.utcnow()
        stopping = []
        for index in indexes:
            worker = self.workers.get(index)
            if worker is None or worker.state not in ACTIVE or worker.state == STOPPING:
                continue
            stopping.append(worker)
            if worker.state in (PLACING, WAITING) or worker.started_at is None:
                worker.set(STOPPED, reason)
                life = self._lives.get(worker.index)
                if life is not None:
                    life.cancel()
                continue
            # a fault's detection second, never before the worker's own start
            worker.stop_asked = max(asked, worker.started_at)
            worker.set(STOPPING, reason)
            self.owner.log.info("%s#%s: stopping: %s", self.owner.who, worker.name, reason)
            self._spawn(self.owner.worker_backend().stop(worker))
        return stopping

    async def stop(
        self,
        reason: str,
        names: list[str] | None = None,
        wait: bool = True,
        at: datetime | None = None,
    ) -> int:
        """Stop the named workers (all by default); with ``wait``, until each has ended and
        its session is settled; billed until ``at`` when given (a GPU fault). The number of
        workers asked to stop."""
        indexes = [w.index for w in self.workers.values() if names is None or w.name in names]
        stopping = self._stop_now(indexes, reason, at)
        if wait:
            tasks = [self._lives[w.index] for w in stopping if w.index in self._lives]
            if tasks:
                await asyncio.wait(tasks, timeout=30)
        self.owner.save_state_now()
        return len(stopping)

    # -- tasks and the saved state ----------------------------------------------------------------

    def _spawn(self, coroutine: Any, worker: Worker | None = None) -> asyncio.Task:
        """Run ``coroutine`` in the background (kept referenced); ``worker``: it is that
        worker's life, which a stop before its start cancels."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if worker is not None:
            self._lives[worker.index] = task
        return task

    def to_state(self) -> dict[str, Any] | None:
        if not self.workers and not self.ended:
            return None
        live = [w.to_state() for w in self.workers.values() if w.state in LIVE]
        ended = {**self.ended}
        ended.update((w.index, w.view()) for w in self.workers.values() if w.state not in ACTIVE)
        return {
            # no worker can use the token once none is live: it is not kept at rest
            "token": self.token if live else "",
            "request": self.request
            and {
                "count": self.request.count,
                "queue": self.request.queue,
                "options": request_view(self.request.request),
            },
            "workers": live,
            # how the others ended, for the group's view once the server has stopped too
            "ended": [ended[i] for i in sorted(ended)],
        }

    def keep_ended(self, state: dict[str, Any]) -> None:
        """Show how the saved group's ended workers ended (nothing is watched or billed)."""
        for view in state.get("ended") or []:
            self.ended[int(str(view["name"]).removeprefix("w"))] = dict(view)

    def load_state(self, state: dict[str, Any], parse_request: Callable[[dict], Request]) -> None:
        """The group as saved; workers that still run are watched again (their sessions
        stay open), those that ended meanwhile are settled at the last time they were seen."""
        self.token = str(state.get("token") or "")
        self.keep_ended(state)
        saved = state.get("request")
        if saved:
            self.request = WorkerRequest(
                int(saved["count"]), parse_request(saved["options"]), bool(saved["queue"])
            )
        backend = self.owner.worker_backend()
        for data in state.get("workers") or []:
            worker = Worker.from_state(data)
            self.workers[worker.index] = worker
            if worker.record is None:
                continue
            if worker.state == READY and backend.still_runs(worker):
                self.owner.machine.claim(worker.record, self.holder(worker))
                worker.idle_since = clock.utcnow()
                ended = asyncio.ensure_future(backend.wait(worker))
                self._spawn(self._watch_until_end(worker, ended), worker)
                continue
            seen = worker.seen_at or worker.started_at or clock.utcnow()
            self._spawn(self._ended(worker, seen, "ended while the hub was down"))
        if self.active:
            self._ensure_watch()


def _why(error: BaseException) -> str:
    if isinstance(error, web.HTTPError):
        return error.log_message or str(error)
    return str(error) or type(error).__name__
