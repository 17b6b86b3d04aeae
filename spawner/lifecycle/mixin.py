"""One server lifecycle for every backend: options, placement, admission, launch, metering,
stop, poll and the state kept across hub restarts, written once.

A backend (:mod:`spawner.local.spawner`, :mod:`spawner.kube.spawner`) mixes
:class:`GPUSpawnerMixin` in before its JupyterHub spawner class and provides small hooks:

- ``async gpu_views(options)``: what is free, as a callable placement reads (again after a
  wait in the queue), and the view prices are asked for;
- ``take_devices(placement, record)``: take what placement chose, synchronously (no other
  spawn decides in between), and note it on the record;
- ``release_devices(record, still_running)``: give them back (a failed start, an ended server);
- ``async launch(placement)``: start the server with the backend's spawner class; its URL;
- ``async launched_at()``: when the server started running (billing starts there);
- ``async still_running()``: after a stop, whether it may still run (its devices stay taken);
- ``async stopped(record, requested)``: when the server really ended (not after ``requested``);
- ``claim_devices(record)``: a server re-attached after a hub restart holds its devices again.

``start``, ``stop`` and ``poll`` call the backend spawner class's own (``super()``) for the
process or pod; a backend never overrides them. The next ways to start and stop (worker
groups, restarts after GPU faults) plug into the same hooks.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from tornado import web
from traitlets import Dict, Integer, Unicode, default

from gputap_common import clock
from gputap_common.names import server_label

from ..core.asking import Refused, credit_of
from ..core.catalog import CPU_KEY, Catalog, load_catalog
from ..core.choices import build_choices
from ..core.form import (
    Choice,
    course_offers,
    options_from_form,
    preview_answer,
    render_form,
    with_alternatives,
)
from ..core.placement import (
    FreeView,
    Placement,
    Refusal,
    RequestError,
    ServerOptions,
    parse_options,
    parse_request,
    place,
)
from ..core.record import ServerRecord
from . import placing, refusals, server_apps, stops
from .billing_client import BillingClient, BillingRefused, BillingUnavailable, unavailable_error
from .disk_mounts import DiskMounts
from .environment import EnvironmentChoice
from .metering import Metering
from .request_body import start_options
from .scale_out import ScaleOutMixin
from .stop_reasons import StopReasons

PREVIEW_PATH = "gputap/preview"


def apply_gpu_options(spawner: GPUSpawnerMixin, user_options: dict[str, Any]) -> None:
    """JupyterHub's apply_user_options hook: validate the options before anything starts.

    A bad request is refused by ``start()`` with a 400 (JupyterHub logs that as one line;
    an exception raised here would be logged with a traceback). The options are kept as
    :func:`~.request_body.start_options` reads them (the same on JupyterHub 5 and 6), so the
    backend's spawner class never sees gputap's older ``profile`` key (KubeSpawner's)."""
    try:
        spawner.user_options = start_options(user_options)
        options = spawner.parse_server_options(spawner.user_options)
        spawner.server_options, spawner.options_error = options, None
    except RequestError as e:
        spawner.server_options, spawner.options_error = None, str(e)
    else:
        spawner.options_applied(options)


class GPUSpawnerMixin(
    StopReasons, ScaleOutMixin, server_apps.AppsMixin, EnvironmentChoice, DiskMounts
):
    """The lifecycle, the form and the billing glue shared by gputap's spawners."""

    billing_url = Unicode(
        "",
        config=True,
        help="""Base URL of the billing service as the hub reaches it.

        c.GPULocalSpawner.billing_url = "http://127.0.0.1:8091/services/billing/"
        """,
    )

    billing_token = Unicode(
        config=True,
        help="""API token the hub uses for billing (scope custom:gputap-billing:hub).

        Defaults to $GPUTAP_BILLING_TOKEN. c.GPULocalSpawner.billing_token = "..."
        """,
    )

    @default("billing_token")
    def _default_billing_token(self) -> str:
        return os.environ.get("GPUTAP_BILLING_TOKEN", "")

    catalog_cards = Dict(
        config=True,
        help="""Cards to add or edit, merged over spawner/core/catalog.yaml (same keys).

        c.GPULocalSpawner.catalog_cards = {"RTX-5090": {"memory_gb": 32, "fp16_tflops": 209.5,
                                           "products": ["NVIDIA-GeForce-RTX-5090"]}}
        """,
    )

    queue_timeout = Integer(
        3600,
        config=True,
        help="""Seconds a spawn may wait in the queue for a sold-out card or slice.

        c.GPULocalSpawner.queue_timeout = 7200
        """,
    )

    disk_max_size_gb = Integer(
        100,
        config=True,
        help="""Largest data disk a user may create, in GB.

        c.GPULocalSpawner.disk_max_size_gb = 500
        """,
    )

    max_disks = Integer(
        5,
        config=True,
        help="""Most data disks one user may have.

        c.GPULocalSpawner.max_disks = 10
        """,
    )

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

    #: the validated options of the spawn in progress, or why they are invalid
    server_options: ServerOptions | None = None
    options_error: str | None = None
    #: what the spawn is doing while it waits, and what it was matched to (spawn progress)
    queue_note: str = ""
    progress_note: str = ""
    #: backends whose servers can be interrupted (Kubernetes priority classes)
    offers_spot = False
    #: why the last server stopped, with what to do (hub home, spawn form; docs/lab.md)
    notice: str = ""
    #: the same, structured (kind, message, todo, at), or None while none is known
    stop_reason: stops.StopReason | None = None
    #: what the running (or starting) server was placed on and is billed as
    record: ServerRecord | None = None
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

    def options_applied(self, options: ServerOptions) -> None:
        """Called with valid options before start(): a spawn that may wait in the queue gets
        queue_timeout more to start."""
        if self._base_start_timeout is None:
            self._base_start_timeout = self.start_timeout
        extra = self.queue_timeout if options.queue else 0
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

    def validated_options(self) -> ServerOptions:
        """The options ``apply_user_options`` validated; 400 saying what is wrong otherwise."""
        if self.server_options is None and self.options_error is None:
            apply_gpu_options(self, self.user_options)
        if self.options_error is not None:
            raise web.HTTPError(400, f"Invalid server options: {self.options_error}")
        return self.server_options

    # -- the lifecycle ---------------------------------------------------------------------

    async def start(self):
        """Place (or wait in the queue), take the devices, admit with billing, launch, and
        open the billing session once the server runs. A failure anywhere gives back what
        was taken and held; billing down is a 503 that says nothing was charged.

        A refusal (4xx: invalid options, sold out, not enough credit) reads on the spawn
        page as its sentence, not as "HTTP 409: Conflict (...)", and the next form shows it
        with what was picked selected again and the alternatives to pick instead."""
        typed, self._typed = self._typed, {}
        self._tell_desk()
        try:
            return await self._start_placed()
        except web.HTTPError as e:
            if 400 <= e.status_code < 500 and e.log_message:
                e.jupyterhub_message = e.log_message
                options = dict(self.user_options or {})
                refused = Refused(e.log_message, options, typed=typed)
                refusals.remember(self.user.name, refused)
            raise

    async def _start_placed(self):
        # not `_start`: KubeSpawner.start calls its own `_start`, which this would shadow
        await self.discover()
        options = self.validated_options()
        environment, options = await self.environment_for(options)
        free_view, price_view = await self.gpu_views(options)
        price_class = "spot" if options.spot else "on-demand"
        prices = await self.prices_for(price_view, price_class)
        placement = await self.place_or_wait(options, free_view, prices)
        # no await since the decision: the devices are taken before any other spawn decides
        record = ServerRecord(
            session_id=str(uuid.uuid4()),
            offering=placement.offering.key,
            count=placement.count,
            course=options.course,
            environment=environment.key,
            price_class=price_class,
        )
        self.take_devices(placement, record)
        self.record = record
        where = f" on node {placement.node}" if placement.node else ""
        self.progress_note = f"matched {placement.offering.label}{where}"
        self.log.info(
            "%s: placed %s ×%d%s (%s; %s)",
            *(self.who, record.offering, record.count, where, price_class),
            ",".join(record.devices) or "no devices taken by the hub",
        )
        self._launching, launched = True, False
        try:
            await self.metering.admit(record)
            self.set_stop_reason(None)  # admitted: why the last server stopped is old news
            self._seen_alive = self._next_stop = self._billed_until = None
            url = await self.launch(placement)
            launched = True
            await self.metering.open(record, await self.launched_at())
        except BaseException as e:
            self.record = None
            if launched:
                await super().stop(now=True)
            self.release_devices(record)
            released = ",".join(record.devices) or "-"
            self.log.info("%s: start failed, released %s", self.who, released)
            self.wake_queue()
            await self.metering.abandon(record)
            if isinstance(e, BillingUnavailable | BillingRefused):
                raise unavailable_error(e) from None
            raise
        finally:
            self._launching = False
        self.log.info("%s: up, billing session %s started", self.who, record.session_id)
        return url

    async def stop(self, now: bool = False) -> None:
        """Stop the server; billing ends when the stop is asked for: the user has lost the
        server (its route is gone), so the seconds of a graceful shutdown are not theirs."""
        if self._launching:
            return await super().stop(now=now)  # the backend's own, in the middle of a start
        requested = clock.utcnow()
        # a GPU fault ended billing at its detection second, before the stop was asked
        billed_until, self._billed_until = self._billed_until, None
        if billed_until is not None:
            requested = min(requested, billed_until)
        self._stop_requested = requested
        record = self.record
        reason, self._next_stop = self._next_stop or stops.from_hub, None
        if record is not None:  # a running server (a dead one was settled by poll)
            why = reason(requested)
            if why is not self.stop_reason:  # a fault's reason was told before its grace
                await self._tell_why(why)
            await self.stop_group(f"The server stopped: {self.stop_reason.message}")
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
        self.resume_group()
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
            self.set_stop_reason(stops.died(alive))
            self.log.info("%s: exited by itself (last seen alive %s)", self.who, alive)
            await self.stop_group("The server exited by itself.")
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
        self.release_devices(record, still_running)
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
    # gpu_views, take_devices, release_devices and launch; these have defaults:

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

    def claim_devices(self, record: ServerRecord) -> None:
        """A re-attached server's devices: nothing to claim unless the backend holds some."""

    # -- state across hub restarts -----------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self.record is not None:
            state["gputap"] = self.record.to_state()
        if self.mounted_disks is not None:
            state["gputap_disks"] = self.mounted_disks
        if self.notice:
            state["gputap_notice"] = self.notice
        if self.stop_reason is not None:
            state["gputap_stop"] = self.stop_reason.view()
        self.group_state(state)
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        saved = state.get("gputap")
        self.record = ServerRecord.from_state(saved) if saved else None
        disks = state.get("gputap_disks")
        self.mounted_disks = [dict(d) for d in disks] if disks is not None else None
        self.notice = state.get("gputap_notice", "")
        saved_stop = state.get("gputap_stop")
        self.stop_reason = stops.StopReason.from_view(saved_stop) if saved_stop else None
        if self.record is not None:
            self.claim_devices(self.record)
        self.load_group_state(state)

    def clear_state(self) -> None:
        super().clear_state()
        self.record = None
        self.mounted_disks = None

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        # the Lab extension shows the server's disks from here
        env["GPUTAP_DISKS"] = json.dumps(self.mounted_disks or [])
        return env

    # -- placement and the queue -------------------------------------------------------------

    async def place_or_wait(
        self, options: ServerOptions, free_view: Callable[[], FreeView], prices: dict[str, int]
    ) -> Placement:
        """Place now, or (``queue`` asked) wait first come first served for at most
        queue_timeout seconds; see :func:`spawner.lifecycle.placing.place_or_wait`."""
        return await placing.place_or_wait(
            options.request,
            holder=self.who,
            may_wait=options.queue,
            catalog=self.catalog,
            free_view=free_view,
            prices=prices,
            wait_seconds=self.queue_timeout,
            note=self._queue_note,
            wake=self.wake_queue,
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
        """Wake whoever is first in line if what they wait for fits now (backends say
        what is free: on Kubernetes, what an on-demand server could take)."""
        placing.queues.poke(self.queue_view())

    def queue_view(self) -> FreeView:
        """What waiting spawns may take; backends override (the mixin knows no inventory)."""
        return FreeView()

    async def progress(self):
        """Spawn progress: where the spawn stands in the queue, what it was matched to."""
        shown = None
        while True:
            note = self.queue_note or self.progress_note
            if note and note != shown:
                shown = note
                yield {"progress": 10 if self.queue_note else 30, "message": note}
            await asyncio.sleep(0.5)

    # -- prices, choices and the form ----------------------------------------------------------

    async def prices_for(self, view: FreeView, price_class: str = "on-demand") -> dict[str, int]:
        """Prices of everything this inventory holds, from billing (503 if unreachable)."""
        return (await self.price_book_for(view, price_class))[0]

    async def price_book_for(
        self, view: FreeView, price_class: str = "on-demand"
    ) -> tuple[dict[str, int], int]:
        """Prices of everything this inventory holds and billing's spot discount (percent)."""
        try:
            return await self.billing.price_book(sorted(view.keys()) + [CPU_KEY], price_class)
        except BillingUnavailable as e:
            raise unavailable_error(e) from None
        except BillingRefused as e:
            raise web.HTTPError(
                502, f"Billing refused to give prices, so no server can start now: {e.message}"
            ) from None

    async def choices(self, own_free: bool = False) -> tuple[list[Choice], bool, int]:
        """The form's options, whether the cards are simulated, and the spot discount.

        ``own_free``: count what this server holds as free (what it could change to)."""
        view, simulated = await (self.change_free_view() if own_free else self.gpu_free_view())
        prices, spot_discount = await self.price_book_for(view)
        return build_choices(view, self.catalog, prices), simulated, spot_discount

    async def _gputap_options_form(self, spawner=None) -> str:
        try:
            account = await self.billing.open_account(self.user.name)
            courses = course_offers(await self.billing.courses(self.user.name))
            terms = await self.billing.price_list([CPU_KEY])
        except (BillingUnavailable, BillingRefused) as e:
            raise unavailable_error(e) from None
        choices, simulated, spot_discount = await self.choices()
        credit = credit_of(account, int(terms.get("min_billable_seconds") or 0))
        # the refusal of this user's last start from the form, shown once
        refused = refusals.take(self.user.name)
        return render_form(
            choices,
            credit=credit,
            simulated=simulated,
            preview_url=self.hub.base_url + PREVIEW_PATH,
            spot_discount_percent=spot_discount if self.offers_spot else None,
            offer_similar_on_fault=self.fault_restart == "allowed",
            notice=self.notice,
            courses=courses,
            refused=refused and with_alternatives(refused, choices, credit),
            picker=self.environment_picker(
                [c.slug for c in courses], dict(refused.options) if refused else None
            ),
        )

    async def preview(self, options: dict[str, Any]) -> dict[str, Any]:
        """Which card a request would get now, without taking anything."""
        try:
            request = parse_request(options, self.catalog)
        except RequestError as e:
            return {"ok": False, "message": f"Invalid request: {e}"}
        view, simulated = await self.gpu_free_view()
        prices = await self.prices_for(view)
        try:
            answer = place(request, view, self.catalog, prices)
        except RequestError as e:
            return {"ok": False, "message": str(e)[:1].upper() + str(e)[1:] + "."}
        return preview_answer(answer, simulated)
