"""What both backends share on the hub side: the form, option validation, placement against
live prices, admission and billing sessions.

A backend (``GPULocalSpawner``, later the Kubernetes one) mixes :class:`GPUSpawnerMixin` in
before its JupyterHub spawner class and provides ``async gpu_free_view() -> (FreeView, simulated)``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from tornado import web
from traitlets import Dict, Integer, Unicode, default
from traitlets.config import LoggingConfigurable

from .billing_client import BillingClient, BillingRefused, BillingUnavailable
from .catalog import CPU_KEY, Catalog
from .disks import Disk, DiskError
from .form import Choice, course_offers, options_from_form, preview_answer, render_form
from .placement import (
    CardRequest,
    FreeView,
    Placement,
    Refusal,
    Request,
    RequestError,
    ServerOptions,
    SharedRequest,
    SliceRequest,
    parse_options,
    parse_request,
    place,
    request_for,
)
from .queue import WaitQueues, ordinal

log = logging.getLogger(__name__)

PREVIEW_PATH = "gputap/preview"
#: how long the hub keeps trying to close a billing session while billing is unreachable
CLOSE_RETRY_SECONDS = 3600
_retries: set[asyncio.Task] = set()
_queues = WaitQueues()
_CATALOGS: dict[str, Catalog] = {}


def utcnow() -> datetime:
    """The one clock of the hub side (tests may move it)."""
    return datetime.now(UTC)


def load_catalog(cards: dict[str, Any]) -> Catalog:
    """The catalog with operator edits, built once per distinct configuration."""
    key = json.dumps(cards, sort_keys=True)
    if key not in _CATALOGS:
        _CATALOGS[key] = Catalog.load({"cards": cards})
    return _CATALOGS[key]


def wanted_key(request: Request) -> str | None:
    """The offering a request waits for when sold out (specs and CPU never wait)."""
    if isinstance(request, CardRequest):
        return request.card
    if isinstance(request, SliceRequest | SharedRequest):
        return request.key
    return None


def _count(request: Request) -> int:
    return request.count if isinstance(request, CardRequest) else 1


def build_choices(view: FreeView, catalog: Catalog, prices: dict[str, int]) -> list[Choice]:
    """Every offering the inventory holds with its live numbers, cheapest first, then CPU;
    sold-out ones with the free alternatives a request for them would be offered."""
    result = []
    for key in view.keys():
        offering = catalog.offering(key)
        alternatives: tuple = ()
        if view.max_free(key) == 0 and key in prices:
            answer = place(request_for(offering), view, catalog, prices)
            alternatives = answer.alternatives if isinstance(answer, Refusal) else ()
        result.append(
            Choice(
                offering,
                view.free(key),
                view.total(key),
                view.max_capacity(key),
                prices.get(key),
                alternatives,
            )
        )
    result.sort(key=lambda c: (c.price_per_hour_micro or 0, c.offering.key))
    result.append(Choice(catalog.cpu, 1, 1, 1, prices.get(CPU_KEY)))
    return result


def billing_unavailable(e: Exception) -> web.HTTPError:
    return web.HTTPError(
        503,
        "Billing is unreachable, so no server can start now (nothing is charged). "
        f"Try again in a minute; if it persists, tell an operator. ({e})",
    )


def apply_gpu_options(spawner: GPUSpawnerMixin, user_options: dict[str, Any]) -> None:
    """JupyterHub's apply_user_options hook: validate the options before anything starts.

    A bad request is refused by ``start()`` with a 400 (JupyterHub logs that as one line;
    an exception raised here would be logged with a traceback).
    """
    try:
        options = spawner.parse_server_options(user_options)
        spawner.server_options, spawner.options_error = options, None
    except RequestError as e:
        spawner.server_options, spawner.options_error = None, str(e)
    else:
        spawner.options_applied(options)


class GPUSpawnerMixin(LoggingConfigurable):
    """Form, validation, placement and billing glue shared by gputap's spawners."""

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
        help="""Cards to add or edit, merged over spawner/catalog.yaml (same keys).

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
        return options_from_form

    @default("apply_user_options")
    def _default_apply_user_options(self):
        return apply_gpu_options

    #: the validated options of the spawn in progress, or why they are invalid
    server_options: ServerOptions | None = None
    options_error: str | None = None
    #: what the spawn is doing while it waits, and what it was matched to (spawn progress)
    queue_note: str = ""
    progress_note: str = ""
    #: backends whose servers can be interrupted (Kubernetes priority classes)
    offers_spot = False
    #: shown on the next form: why the last server stopped, when it was not the user's doing
    notice: str = ""
    #: the server's record (session_id, offering, count; backends add theirs); ``hold_id``
    #: while the admission's hold has not become the billing session, ``started_at`` once
    #: metering may have begun
    gpu: dict[str, Any] | None = None

    #: the disks this server mounted at its start: [{"name", "path"}] (kept in its state)
    mounted_disks: list[dict[str, str]] | None = None

    _base_start_timeout: int | None = None

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

    @property
    def catalog(self) -> Catalog:
        return load_catalog(self.catalog_cards)

    @property
    def billing(self) -> BillingClient:
        return BillingClient(self.billing_url, self.billing_token)

    @property
    def _log_name(self) -> str:
        return f"{self.user.name}/{self.name}" if self.name else self.user.name

    # -- data disks ----------------------------------------------------------------------

    # each backend provides ``disk_store`` (a DiskStore of spawner/disks.py) and
    # ``disk_path(name)``, where disk ``name`` appears inside this user's servers

    async def disks_to_mount(self) -> tuple[list[Disk], set[str]]:
        """The disks attached to this server, read as it starts (they become its
        ``mounted_disks`` and $GPUTAP_DISKS), and the names of the user's disks attached to
        their other servers (whose links in the shared home must stay)."""
        try:
            every = await self.disk_store.list(self.user.name)
        except DiskError as e:
            raise web.HTTPError(e.status, e.message) from None
        disks = [d for d in every if d.attached_to == self.name]
        elsewhere = {d.name for d in every if d.attached_to not in (None, self.name)}
        self.mounted_disks = [{"name": d.name, "path": self.disk_path(d.name)} for d in disks]
        if disks:
            names = ", ".join(d.name for d in disks)
            self.log.info("%s: mounting disks %s", self._log_name, names)
        return disks, elsewhere

    async def attached_disks_view(self) -> list[dict[str, Any]]:
        """The data disks of the running server, as the server API shows them:
        ``[{"name", "path"}]``, the disks it mounted at its start (none once stopped)."""
        return [dict(d) for d in self.mounted_disks or []]

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        # the Lab extension shows the server's disks from here
        env["GPUTAP_DISKS"] = json.dumps(self.mounted_disks or [])
        return env

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self.mounted_disks is not None:
            state["gputap_disks"] = self.mounted_disks
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        disks = state.get("gputap_disks")
        self.mounted_disks = [dict(d) for d in disks] if disks is not None else None

    def clear_state(self) -> None:
        super().clear_state()
        self.mounted_disks = None

    # -- prices and choices --------------------------------------------------------------

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
            raise billing_unavailable(e) from None

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
        except (BillingUnavailable, BillingRefused) as e:
            raise billing_unavailable(e) from None
        choices, simulated, spot_discount = await self.choices()
        return render_form(
            choices,
            available_micro=account["available_micro"],
            currency=account.get("currency", "credits"),
            simulated=simulated,
            preview_url=self.hub.base_url + PREVIEW_PATH,
            spot_discount_percent=spot_discount if self.offers_spot else None,
            notice=self.notice,
            courses=courses,
        )

    # -- requests ------------------------------------------------------------------------

    def validated_options(self) -> ServerOptions:
        """The options ``apply_user_options`` validated; 400 saying what is wrong otherwise."""
        if self.server_options is None and self.options_error is None:
            apply_gpu_options(self, self.user_options)
        if self.options_error is not None:
            raise web.HTTPError(400, f"Invalid server options: {self.options_error}")
        return self.server_options

    def decide(
        self, request: Request, view: FreeView, prices: dict[str, int]
    ) -> Placement | Refusal:
        try:
            return place(request, view, self.catalog, prices)
        except RequestError as e:
            raise web.HTTPError(400, f"Invalid server options: {e}") from None

    async def place_or_wait(
        self, options: ServerOptions, free_view: Callable[[], FreeView], prices: dict[str, int]
    ) -> Placement:
        """Place now, or, when the user asked to wait, wait first come first served (at most
        queue_timeout seconds).

        Returns without yielding to the event loop after the decision, so the caller takes
        the devices (or reserves the units) before any other spawn can decide.
        """
        request, holder = options.request, self._log_name
        wanted = wanted_key(request)
        deadline = asyncio.get_running_loop().time() + self.queue_timeout
        try:
            while True:
                answer = self._decide_in_turn(request, holder, wanted, free_view(), prices)
                if isinstance(answer, Placement):
                    return answer
                if not options.queue or wanted is None:
                    hint = " Ask to wait in the queue, or pick" if wanted else " Pick"
                    raise web.HTTPError(409, f"{answer.message}{hint} a free option.")
                waiter = _queues.join_if_absent(holder, wanted, _count(request))
                label = self.catalog.offering(wanted).label
                self.queue_note = (
                    f"waiting for a free {label}: {ordinal(_queues.position(holder))} in queue"
                )
                self.log.info("%s: %s", holder, self.queue_note)
                waiter.woken.clear()
                remaining = deadline - asyncio.get_running_loop().time()
                try:
                    async with asyncio.timeout(max(0, remaining)):
                        await waiter.woken.wait()
                except TimeoutError:
                    raise web.HTTPError(
                        409,
                        f"Still no {label} free after waiting {self.queue_timeout // 60} "
                        "minutes; pick another option or try again later.",
                    ) from None
        finally:
            _queues.leave(holder)
            self.queue_note = ""
            self.wake_queue()  # the next in line may fit in what is left

    def _decide_in_turn(
        self,
        request: Request,
        holder: str,
        wanted: str | None,
        view: FreeView,
        prices: dict[str, int],
    ) -> Placement | Refusal:
        """Decide, never taking what others wait in line for (nobody jumps the line, spec
        requests included)."""
        line = _queues.waiting(wanted) if wanted else 0
        if line and not _queues.is_head(holder, wanted):
            label = self.catalog.offering(wanted).label
            return Refusal(f"No {label} free for you now: {line} waiting before you")
        answer = self.decide(request, view, prices)
        if isinstance(answer, Placement) and wanted is None:
            waiting = _queues.waiting(answer.offering.key)
            if waiting:
                return Refusal(
                    f"The {answer.offering.label} that fits is promised to "
                    f"{waiting} waiting in line"
                )
        return answer

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
        price_class = "spot" if options.spot else "on-demand"
        prices = await self.prices_for(view, price_class)
        request = options.request
        return self._decide_in_turn(request, self._log_name, wanted_key(request), view, prices)

    def wake_queue(self) -> None:
        """Wake whoever is first in line if what they wait for fits now (backends say
        what is free: on Kubernetes, what an on-demand server could take)."""
        _queues.poke(self.queue_view())

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

    async def open_billing_session(
        self, record: dict[str, Any], started_at: datetime, price_class: str = "on-demand"
    ) -> None:
        """Start metering ``record`` (session_id, offering, count) at ``started_at``.

        ``started_at`` goes into the record first: if the call fails or is cancelled after
        billing stored the session, settle_billing_session closes it at zero seconds."""
        record["started_at"] = started_at.isoformat()
        await self.billing.start_session(
            record["session_id"],
            self.user.name,
            self.name,
            record["offering"],
            record["count"],
            started_at,
            price_class,
            record.get("hold_id"),
            record.get("course", ""),
        )
        # the hold is the session now: nothing left to release
        record.pop("hold_id", None)

    async def settle_billing_session(
        self, record: dict[str, Any] | None, ended_at: datetime
    ) -> dict[str, Any] | None:
        """Close the record's session at ``ended_at`` (never before it started; clocks of
        nodes and hub may differ). A record whose session never opened gives back the hold
        its admission placed instead."""
        if not record:
            return None
        result = None
        if "started_at" in record:
            started_at = datetime.fromisoformat(record["started_at"])
            result = await self.close_billing_session(
                record["session_id"], max(ended_at, started_at)
            )
        await self.release_hold(record)
        return result

    async def abandon_billing(self, record: dict[str, Any] | None) -> None:
        """Billing's side of a start that failed or was cancelled: a session that may have
        opened is closed at zero seconds, and the admission's hold is released, so the
        user's credit is free again at once."""
        started = (record or {}).get("started_at")
        await self.settle_billing_session(
            record, datetime.fromisoformat(started) if started else utcnow()
        )

    async def release_hold(self, record: dict[str, Any] | None) -> None:
        """Release the hold of a record whose session never opened. Best effort: when billing
        cannot be reached the hold expires by itself (``billing.hold_seconds``)."""
        hold_id = record.pop("hold_id", None) if record else None
        if not hold_id:
            return
        try:
            await self.billing.release_hold(hold_id)
        except BillingRefused as e:
            if e.status != 404:  # 404: the admission whose answer was lost placed none
                self.log.warning(
                    "%s: billing refused to release hold %s: %s", self._log_name, hold_id, e
                )
        except BillingUnavailable as e:
            self.log.warning(
                "%s: hold %s not released, it expires by itself: %s", self._log_name, hold_id, e
            )
        else:
            self.log.info("%s: start abandoned, billing hold %s released", self._log_name, hold_id)

    async def close_billing_session(
        self, session_id: str, ended_at: datetime
    ) -> dict[str, Any] | None:
        """Settle a session at ``ended_at``; if billing is down, keep retrying in the
        background with the same end time (the stop is idempotent, so no double charge)."""
        try:
            return await self.billing.stop_session(session_id, ended_at)
        except BillingRefused as e:
            if e.status == 404:  # the start never reached billing: nothing to close
                return None
            self.log.error("%s: billing refused to close %s: %s", self._log_name, session_id, e)
        except BillingUnavailable as e:
            self.log.warning("%s: closing %s later: %s", self._log_name, session_id, e)
            task = asyncio.ensure_future(self._retry_close(session_id, ended_at))
            _retries.add(task)
            task.add_done_callback(_retries.discard)
        return None

    async def _retry_close(self, session_id: str, ended_at: datetime) -> None:
        delay, waited = 1.0, 0.0
        while waited < CLOSE_RETRY_SECONDS:
            await asyncio.sleep(delay)
            waited += delay
            try:
                await self.billing.stop_session(session_id, ended_at)
                self.log.info("%s: billing session %s closed", self._log_name, session_id)
                return
            except BillingUnavailable:
                delay = min(delay * 2, 60)
            except BillingRefused as e:
                if e.status != 404:  # 404: the start never reached billing, nothing to close
                    self.log.error(
                        "%s: billing refused to close %s: %s", self._log_name, session_id, e
                    )
                return
        self.log.error("%s: gave up closing billing session %s", self._log_name, session_id)

    async def admit(self, placement: Placement, price_class: str = "on-demand") -> None:
        """Ask billing whether the user's credit covers the minimum billable period. Billing
        holds that much until the session opens; the hold's id goes on the server record
        (``self.gpu["hold_id"]``), to be released if the start fails."""
        # the session id names the hold: if the answer is lost, the hold can still be released
        key = self.gpu["session_id"]
        try:
            answer = await self.billing.admit(
                self.user.name,
                placement.offering.key,
                placement.count,
                price_class,
                key,
                self.gpu.get("course", ""),
            )
        except BillingRefused as e:
            raise web.HTTPError(402 if e.status == 402 else 400, e.message) from None
        except BillingUnavailable as e:
            self.gpu["hold_id"] = key  # billing may have placed it before failing to answer
            raise billing_unavailable(e) from None
        self.gpu["hold_id"] = answer["hold_id"]
