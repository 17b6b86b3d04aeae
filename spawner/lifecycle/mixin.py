"""One server lifecycle for every backend: options, placement, admission, launch, metering,
stop, poll and the state kept across hub restarts, written once.

A backend (:mod:`spawner.local.spawner`, :mod:`spawner.kube.spawner`) mixes
:class:`GPUSpawnerMixin` in before its JupyterHub spawner class and provides:

- ``machine``: where devices come from, one per hub (:mod:`spawner.lifecycle.machine`);
- ``async gpu_views(options)``: what is free, as a callable placement reads (again after a
  wait in the queue), and the view prices are asked for;
- ``async launch(placement)``: start the server with the backend's spawner class; its URL;
- ``async launched_at()``: when the server started running (billing starts there);
- ``async still_running()``: after a stop, whether it may still run (``keep_devices``);
- ``async stopped(record, requested)``: when the server really ended (not after ``requested``).

A start walks the one start pipeline (:class:`~.starting.Start`: place, take, admit, launch,
open billing, one failure path) that workers walk too. ``start``, ``stop`` and ``poll`` call the
backend spawner class's own (``super()``) for the process or pod; a backend never overrides
them.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any

from tornado import web
from traitlets import default

from gputap_common import clock
from gputap_common.names import server_label

from ..core.asking import Refused
from ..core.catalog import Catalog, load_catalog
from ..core.choices import build_choices
from ..core.environments import Environment
from ..core.form import (
    Choice,
    options_from_form,
)
from ..core.placement import (
    FreeView,
    Placement,
    Refusal,
    RequestError,
    ServerOptions,
    parse_options,
    parse_request,
)
from ..core.record import ServerRecord
from ..core.time_to_ready import ready_event
from . import faults, offers, placing, refusals, stops
from .billing_client import BillingClient
from .disk_mounts import disks_to_mount
from .environment import EnvironmentChoice
from .machine import Machine
from .metering import Metering
from .request_body import apply_gpu_options
from .scale_out import ScaleOut, save_spawner_state
from .server_apps import apps_env
from .starting import Start
from .stop_reasons import StopBook
from .traits import GPUSpawnerTraits
from .workers import WorkerGroup

PREVIEW_PATH = "gputap/preview"


class GPUSpawnerMixin(GPUSpawnerTraits):
    """The lifecycle, the form and the billing glue shared by gputap's spawners; its settings
    are :class:`~.traits.GPUSpawnerTraits`, its parts collaborators: the start pipeline
    (:class:`~.starting.Start`), the stop book, the worker group (:class:`~.scale_out.ScaleOut`)
    and the environment choice."""

    @default("options_form")
    def _default_options_form(self):
        return self._gputap_options_form

    @default("options_from_form")
    def _default_options_from_form(self):
        return self._gputap_options_from_form

    def _gputap_options_from_form(self, form_data: dict[str, list[str]]) -> dict[str, Any]:
        """The form's fields as ``user_options``; what was typed is kept, for the form to
        show it again if the start is refused."""
        self._typed = {k: v[0] for k, v in form_data.items() if v and isinstance(v[0], str)}
        return options_from_form(form_data)

    @default("apply_user_options")
    def _default_apply_user_options(self):
        return apply_gpu_options

    def options_from_query(self, query_data: dict[str, list[str]]) -> dict[str, Any]:
        """No state change on a GET: the form is shown instead (:class:`~.refusals.SpawnFromLink`);
        servers start from the form's POST or the REST API (docs/security.md)."""
        raise refusals.SpawnFromLink()

    #: why the options of the spawn in progress could not even be read (start() says so)
    options_error: str | None = None
    #: what the spawn is doing while it waits, and what it was matched to (spawn progress)
    queue_note: str = ""
    progress_note: str = ""
    #: backends whose servers can be interrupted (Kubernetes priority classes)
    offers_spot = False
    #: what the running (or starting) server was placed on and is billed as
    record: ServerRecord | None = None
    #: where its devices come from: the backend's machine, one per hub (spawner/*/machine.py)
    machine: Machine
    #: the disks this server mounted at its start: [{"name", "path"}] (kept in its state)
    mounted_disks: list[dict[str, str]] | None = None

    #: while start() launches: a stop asked then is the backend's own (KubeSpawner deletes a
    #: conflicting pod), not the user's
    _launching = False
    #: when the stop in progress was asked for (billing ends there)
    _stop_requested: datetime | None = None
    #: the session this spawner settled last (a stop and a poll never both settle it)
    _settled_session: str | None = None
    _base_start_timeout: int | None = None
    #: the fields of the form that asked for this start (empty for the REST API)
    _typed: dict[str, str] = {}
    #: when a poll last found the server running (a server that dies is billed until then)
    _seen_alive: datetime | None = None
    _stop_book: StopBook | None = None
    _scale_out: ScaleOut | None = None

    # -- collaborators ---------------------------------------------------------------------

    @property
    def stop_book(self) -> StopBook:
        """Why the server stopped last, and why its next stop happens."""
        if self._stop_book is None:
            self._stop_book = StopBook(self.who, self.log)
        return self._stop_book

    @property
    def notice(self) -> str:
        """Why the last server stopped, with what to do (hub home, spawn form; docs/lab.md)."""
        return self.stop_book.notice

    @property
    def stop_reason(self) -> stops.StopReason | None:
        """The same, structured (kind, message, todo, at), or None while none is known."""
        return self.stop_book.reason

    @property
    def scale_out(self) -> ScaleOut:
        if self._scale_out is None:
            self._scale_out = ScaleOut(self, self.user.name)
        return self._scale_out

    @property
    def workers(self) -> WorkerGroup:
        """This server's worker group (docs/scale-out.md)."""
        return self.scale_out.group

    def save_state_now(self) -> None:
        """The spawner's state, its group's with it, written to the hub's database now."""
        save_spawner_state(self)

    @property
    def environment_choice(self) -> EnvironmentChoice:
        """The environments of the settings, and this user's choice among them."""
        return EnvironmentChoice(
            self.environments,
            backend_name=self.backend_name,
            image_pattern=self.image_pattern,
            user=self.user,
            billing=self.billing,
            catalog=self.catalog,
        )

    @property
    def server_environment(self) -> Environment:
        """The environment of the running (or starting) server; the default without one."""
        key = self.record.environment if self.record is not None else ""
        return self.environment_choice.environment_catalog.resolve(key)

    async def environment_for(self, options: ServerOptions) -> tuple[Environment, ServerOptions]:
        """The environment ``options`` ask for and the options fitted to it (400 otherwise:
        :meth:`~.environment.EnvironmentChoice.environment_for`)."""
        return await self.environment_choice.environment_for(options)

    async def disks_to_mount(self) -> tuple[list, set[str]]:
        """The disks attached to this server, read as it starts (they become its
        ``mounted_disks`` and $GPUTAP_DISKS), and those attached to the user's others."""
        disks, elsewhere = await disks_to_mount(self.disk_store, self.user.name, self.name)
        self.mounted_disks = [{"name": d.name, "path": self.disk_path(d.name)} for d in disks]
        if disks:
            self.log.info("%s: mounting disks %s", self.who, ", ".join(d.name for d in disks))
        return disks, elsewhere

    async def attached_disks_view(self) -> list[dict[str, Any]]:
        """The disks the running server mounted at its start, as the server API shows them."""
        return [dict(d) for d in self.mounted_disks or []]

    def _tell_desk(self) -> None:
        """The fault desk posts its recoveries to the hub's API, which spawners know."""
        desk = faults.desk()
        if desk is not None and self.hub is not None and self.hub.api_url:
            desk.api_url = self.hub.api_url

    async def tell_why(
        self, reason: stops.StopReason, wait_seconds: float = stops.ANNOUNCE_TIMEOUT_SECONDS
    ) -> None:
        """Keep why the server stops, and tell it before it goes (best effort)."""
        server = getattr(self, "server", None)
        await self.stop_book.tell(reason, server, self.api_token, wait_seconds)

    # -- names and clients ---------------------------------------------------------------

    @property
    def who(self) -> str:
        """``user`` or ``user/server``, as logs and queues name this server."""
        return server_label(self.user.name, self.name)

    @property
    def _log_name(self) -> str:
        return self.who

    @property
    def catalog(self) -> Catalog:
        return load_catalog(self.catalog_cards)

    @property
    def billing(self) -> BillingClient:
        return BillingClient(self.billing_url, self.billing_token)

    @property
    def metering(self) -> Metering:
        return Metering(self.billing, self.user.name, self.name, self.who, self.log)

    # -- options ---------------------------------------------------------------------------

    def allow_queue_time(self, may_wait: bool) -> None:
        """Before start(): a spawn that may wait in the queue gets queue_timeout more."""
        if self._base_start_timeout is None:
            self._base_start_timeout = self.start_timeout
        extra = self.queue_timeout if may_wait else 0
        self.start_timeout = self._base_start_timeout + extra

    def parse_server_options(self, user_options: dict[str, Any] | None) -> ServerOptions:
        """``user_options`` as this backend can run them; RequestError saying what is wrong."""
        options = parse_options(user_options, self.catalog)
        if options.spot and not self.offers_spot:
            raise RequestError("spot (interruptible) servers need the Kubernetes backend")
        return options

    async def discover(self) -> None:
        """Learn what the backend holds before options are checked: the local backend's GPUs
        that the catalog does not know join it. Nothing by default."""

    async def start_request(self) -> ServerOptions:
        """This start's options, parsed once, after :meth:`discover`; 400 saying what is
        wrong."""
        await self.discover()
        error, self.options_error = self.options_error, None
        try:
            if error is not None:
                raise RequestError(error)
            return self.parse_server_options(self.user_options)
        except RequestError as e:
            raise web.HTTPError(400, f"Invalid server options: {e}") from None

    # -- the lifecycle ---------------------------------------------------------------------

    async def start(self):
        """Place (or wait in the queue), take the devices, admit with billing, launch, and
        open the billing session once the server runs. A failure anywhere gives back what
        was taken and held; billing down is a 503 that says nothing was charged.

        A refusal (4xx: invalid options, sold out, not enough credit) reads on the spawn
        page as its sentence, not as "HTTP 409: Conflict (...)", and the next form shows it
        with what was picked selected again and the alternatives to pick instead."""
        began = time.monotonic()
        typed, self._typed = self._typed, {}
        self._tell_desk()
        new_named = refusals.new_named(self)
        try:
            return await self._start_placed(began)
        except web.HTTPError as e:
            if 400 <= e.status_code < 500 and e.log_message:
                e.jupyterhub_message = e.log_message
                options = dict(self.user_options or {})
                refused = Refused(e.log_message, options, typed=typed)
                refusals.remember(self.user.name, refused)
                if new_named:
                    asyncio.ensure_future(refusals.remove_refused(self))
            raise

    async def _start_placed(self, began: float):
        # not `_start`: KubeSpawner.start calls its own `_start`, which this would shadow
        options = await self.start_request()
        environment, options = await self.environment_for(options)
        free_view, price_view = await self.gpu_views(options)
        price_class = "spot" if options.spot else "on-demand"
        prices = await self.prices_for(price_view, price_class)
        start = Start(self.machine, self.metering, self.catalog, self.who, self.log, began)
        placement = await self.place_or_wait(start, options, free_view, prices)
        # no await since the decision: the devices are taken before any other spawn decides
        record = ServerRecord(
            session_id=str(uuid.uuid4()),
            offering=placement.offering.key,
            count=placement.count,
            course=options.course,
            environment=environment.key,
            price_class=price_class,
        )
        self.record = start.take(placement, record)
        self.before_launch(placement)
        where = f" on node {placement.node}" if placement.node else ""
        self.progress_note = f"matched {placement.offering.label}{where}"
        self.log.info(
            "%s: placed %s ×%d%s (%s; %s)",
            *(self.who, record.offering, record.count, where, price_class),
            ",".join(record.devices) or "no devices taken by the hub",
        )

        async def launch() -> Any:
            self.stop_book.set(None)  # admitted: why the last server stopped is old news
            self.stop_book.next_because(None)
            self._seen_alive = None
            return await self.launch(placement)

        self._launching = True
        try:
            url = await start.run(
                launch, lambda _url: self.launched_at(), partial(super().stop, now=True)
            )
        except BaseException:
            self.record = None
            raise
        finally:
            self._launching = False
        self.log.info(
            "%s: up, billing session %s started; %s",
            *(self.who, record.session_id, record.time_to_ready.message.lower()),
        )
        return url

    async def stop(self, now: bool = False) -> None:
        """Stop the server; billing ends when the stop is asked for: the user has lost the
        server (its route is gone), so the seconds of a graceful shutdown are not theirs."""
        if self._launching:
            return await super().stop(now=now)  # the backend's own, in the middle of a start
        requested = clock.utcnow()
        reason, billed_until = self.stop_book.take_next()
        # a GPU fault ended billing at its detection second, before the stop was asked
        if billed_until is not None:
            requested = min(requested, billed_until)
        self._stop_requested = requested
        record = self.record
        if record is not None:  # a running server (a dead one was settled by poll)
            why = reason(requested)
            if why is not self.stop_reason:  # a fault's reason was told before its grace
                await self.tell_why(why)
            await self.scale_out.stop(f"The server stopped: {self.stop_reason.message}")
        try:
            await super().stop(now=now)
        finally:
            # even if stopping failed the user has lost the server: billing ends now
            self._stop_requested = None
            if record is not None:
                if self.record is record:
                    self.record = None
                await self._finish(
                    record,
                    requested,
                    still_running=await self.still_running(),
                    billed_until=billed_until,
                )

    async def poll(self):
        """The backend's poll; a server found gone without a stop (crashed, preempted) is
        settled here, the hub calls no stop for it."""
        record = self.record
        self._tell_desk()
        self.scale_out.resume()
        status = await super().poll()
        now = clock.utcnow()
        if status is None and record is not None:
            self._seen_alive = now
        if status is not None and record is not None and self._stop_requested is None:
            if self.record is record:
                self.record = None
            # billed until it was last seen alive, not until this poll noticed, unless the
            # backend saw when it ended (stopped(), died=True)
            alive = min(max(self._seen_alive or now, record.started_at or now), now)
            self.stop_book.set(stops.died(alive))
            self.log.info("%s: exited by itself (last seen alive %s)", self.who, alive)
            await self.scale_out.stop("The server exited by itself.")
            await self._finish(record, alive, died=True)
        return status

    async def _finish(
        self,
        record: ServerRecord,
        requested: datetime,
        still_running: bool = False,
        died: bool = False,
        billed_until: datetime | None = None,
    ) -> None:
        """The end of a server: its devices back (``still_running``: kept under a name of
        their own), its billing session closed when it really ended, once. ``requested``:
        when the stop was asked, or (``died``) when a server found gone was last seen
        alive."""
        if still_running:
            self.keep_devices(record)
        else:
            await self.end_leftovers(record)
            self.machine.release(record, self.who)
        self.wake_queue()
        if record.session_id == self._settled_session:
            return
        self._settled_session = record.session_id
        ended_at = await self.stopped(record, requested, died)
        if billed_until is not None:  # the backend's end (a pod's) is later than a fault's
            ended_at = min(ended_at, billed_until)
        result = await self.metering.settle(record, ended_at)
        if record.started_at is None:  # stopped before it was up: only its hold was released
            return
        billed = result.get("billed_seconds") if result else "(pending)"
        self.log.info("%s: stopped; billed %s s (session %s)", self.who, billed, record.session_id)

    # -- backend hooks (the module's docstring says what each does) ------------------------

    # required of every backend, with gpu_free_view() and disk_store / disk_path():
    # machine, gpu_views and launch; these have defaults:

    def before_launch(self, placement: Placement) -> None:
        """Right after the devices were taken: nothing by default."""

    async def end_leftovers(self, record: ServerRecord) -> None:
        """Before an ended server's devices go back: end what is left of it (nothing by
        default: a pod's processes end with it)."""

    def keep_devices(self, record: ServerRecord) -> None:
        """After a stop, the server may still run: its devices stay taken unless the backend
        cannot tell (then they go back)."""
        self.machine.release(record, self.who)

    async def launched_at(self) -> datetime:
        """When the server started running (billing starts there): now, unless the backend
        knows better."""
        return clock.utcnow()

    async def still_running(self) -> bool:
        return False

    async def stopped(
        self, record: ServerRecord, requested: datetime, died: bool = False
    ) -> datetime:
        """When the server ended: when the stop was asked (``died``: when the server found
        gone was last seen alive), unless the backend knows better."""
        return requested

    # -- state across hub restarts -----------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self.record is not None:
            state["gputap"] = self.record.to_state()
        if self.mounted_disks is not None:
            state["gputap_disks"] = self.mounted_disks
        self.stop_book.to_state(state)
        self.scale_out.to_state(state)
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        saved = state.get("gputap")
        self.record = ServerRecord.from_state(saved) if saved else None
        disks = state.get("gputap_disks")
        self.mounted_disks = [dict(d) for d in disks] if disks is not None else None
        self.stop_book.load_state(state)
        if self.record is not None:
            self.machine.claim(self.record, self.who)
        self.scale_out.load_state(state)

    def clear_state(self) -> None:
        super().clear_state()
        self.record = None
        self.mounted_disks = None

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        # the Lab extension shows the server's disks from here
        env["GPUTAP_DISKS"] = json.dumps(self.mounted_disks or [])
        # which environment the server runs, for the Lab extension and the user's own code
        env["GPUTAP_ENVIRONMENT"] = self.server_environment.key
        env.update(apps_env(self.apps, self.record.environment if self.record else ""))
        return env

    # -- placement and the queue -------------------------------------------------------------

    async def place_or_wait(
        self,
        start: Start,
        options: ServerOptions,
        free_view: Callable[[], FreeView],
        prices: dict[str, int],
    ) -> Placement:
        """Place now, or (``queue`` asked) wait first come first served for at most
        queue_timeout seconds; see :func:`spawner.lifecycle.placing.place_or_wait`."""
        return await start.place(
            options.request,
            free_view=free_view,
            prices=prices,
            may_wait=options.queue,
            wait_seconds=self.queue_timeout,
            note=self._queue_note,
        )

    def _queue_note(self, note: str) -> None:
        self.queue_note = note
        if note:
            self.log.info("%s: %s", self.who, note)

    async def change_free_view(self, spot: bool = False) -> tuple[FreeView, bool]:
        """What this server could take if it stopped first (a ``spot`` server: without
        preempting anyone): the free view with its own devices counted as free. Backends
        that cannot tell (Kubernetes) count them as taken."""
        return await self.gpu_free_view()

    async def fits_after_stop(self, options: ServerOptions) -> Placement | Refusal:
        """Where ``options`` would go now if this server stopped first (its devices count as
        free), by the rules a spawn follows: nobody jumps the line of a sold-out offering.
        400 for options no machine here could serve; 503 when billing has no prices."""
        view, _ = await self.change_free_view(options.spot)
        prices = await self.prices_for(view, "spot" if options.spot else "on-demand")
        return placing.decide_in_turn(options.request, self.who, view, self.catalog, prices)

    def wake_queue(self) -> None:
        """Wake whoever is first in line if what they wait for fits now (the machine says
        what is free: on Kubernetes, what an on-demand server could take)."""
        placing.queues.poke(self.machine.queue_view())

    @default("progress_ready_hook")
    def _default_progress_ready_hook(self) -> Callable[[Any, dict[str, Any]], dict[str, Any]]:
        # the spawn page's last line says how long the start took
        return lambda spawner, event: ready_event(
            event, spawner.record.time_to_ready if spawner.record else None
        )

    async def progress(self):
        """Spawn progress: where the spawn stands in the queue, what it was matched to."""
        shown = None
        while True:
            note = self.queue_note or self.progress_note
            if note and note != shown:
                shown = note
                yield {"progress": 10 if self.queue_note else 30, "message": note}
            await asyncio.sleep(0.5)

    # -- prices, choices and the form (spawner/lifecycle/offers.py) ----------------------------

    async def prices_for(self, view: FreeView, price_class: str = "on-demand") -> dict[str, int]:
        """Prices of everything this inventory holds, from billing (503 if unreachable)."""
        return (await offers.price_book(self.billing, view, price_class))[0]

    async def choices(self, own_free: bool = False) -> tuple[list[Choice], bool, int]:
        """The form's options, whether the cards are simulated, and the spot discount.

        ``own_free``: count what this server holds as free (what it could change to)."""
        view, simulated = await (self.change_free_view() if own_free else self.gpu_free_view())
        prices, spot_discount = await offers.price_book(self.billing, view)
        return build_choices(view, self.catalog, prices), simulated, spot_discount

    async def _gputap_options_form(self, spawner=None) -> str:
        return await offers.options_form(
            self.billing,
            self.user.name,
            self.choices,
            self.environment_choice.environment_picker,
            preview_url=self.hub.base_url + PREVIEW_PATH,
            offers_spot=self.offers_spot,
            offer_similar_on_fault=self.fault_restart == "allowed",
            notice=self.notice,
        )

    async def preview(self, options: dict[str, Any]) -> dict[str, Any]:
        """Which card a request would get now, without taking anything."""
        try:
            request = parse_request(options, self.catalog)
        except RequestError as e:
            return {"ok": False, "message": f"Invalid request: {e}"}
        view, simulated = await self.gpu_free_view()
        prices = await self.prices_for(view)
        return offers.preview(request, self.catalog, view, simulated, prices)
