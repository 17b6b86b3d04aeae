"""The one start pipeline (spawner/lifecycle/starting.py) on this machine's real device pool
(the simulated inventory) and the billing double: every way a start can fail gives the
devices back and leaves no hold nor open session, whatever step failed, cancelled or not."""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import datetime

import pytest
from tornado import web

from gputap_common import clock
from spawner.core.catalog import CPU_KEY, Catalog
from spawner.core.placement import CardRequest, Placement
from spawner.core.record import ServerRecord
from spawner.lifecycle.metering import Metering
from spawner.lifecycle.starting import Start
from spawner.local.machine import DeviceSource, LocalMachine
from spawner.local.spawner import DEFAULT_INVENTORY_FILE
from tests.doubles.billing import BillingDouble
from tests.waiting import wait_for_async

CATALOG = Catalog.load()
LOG = logging.getLogger("test_start_pipeline")


async def machine() -> LocalMachine:
    made = LocalMachine(DeviceSource("file", str(DEFAULT_INVENTORY_FILE), (), "node"))
    await made.pool(CATALOG)
    return made


def start_on(made: LocalMachine, billing: BillingDouble, holder: str = "ada") -> Start:
    metering = Metering(billing, "ada", "", holder, LOG)
    return Start(made, metering, CATALOG, holder, LOG)


def two_free(made: LocalMachine) -> str:
    """A card the simulated inventory has two whole GPUs of free."""
    view = made.pool_now.free_view()
    return next(k for k in sorted(view.keys()) if "/" not in k and view.free(k) >= 2)


def placed(start: Start, made: LocalMachine, card: str | None = None) -> ServerRecord:
    """One whole GPU of ``card`` (one the inventory has two of free), taken for ``start``."""
    card = card or two_free(made)
    view = made.pool_now.free_view()
    prices = dict.fromkeys([*view.keys(), CPU_KEY], 1_000_000)
    answer = start.decide(CardRequest(card, 1), view, prices)
    assert isinstance(answer, Placement), answer
    record = ServerRecord(str(uuid.uuid4()), answer.offering.key, answer.count)
    return start.take(answer, record)


async def at(_url: str) -> datetime:
    """When the launched server started running: now."""
    return clock.utcnow()


def held(made: LocalMachine) -> dict[str, list[str]]:
    return made.pool_now.held_by()


async def test_a_start_that_runs_holds_its_devices_and_has_an_open_session():
    made, billing = await machine(), BillingDouble()
    start = start_on(made, billing)
    record = placed(start, made)

    async def launch() -> str:
        return "http://127.0.0.1:1/"

    async def stop() -> None:
        raise AssertionError("nothing to stop: the start ran")

    assert await start.run(launch, at, stop) == "http://127.0.0.1:1/"
    assert held(made) == {"ada": list(record.devices)}
    assert billing.sessions == {record.session_id: None} and billing.holds == set()


@pytest.mark.parametrize("fails", ["admission", "launch", "billing's session", "cancelled"])
async def test_a_start_that_fails_anywhere_gives_everything_back(fails):
    made, billing = await machine(), BillingDouble()
    start = start_on(made, billing)
    record = placed(start, made)
    assert held(made) == {"ada": list(record.devices)}
    stopped, launched, launching = [], [], asyncio.Event()
    billing.refuse = 402 if fails == "admission" else None

    async def launch() -> str:
        launched.append(True)
        launching.set()
        if fails == "launch":
            raise RuntimeError("the server exited with code 1")
        if fails == "cancelled":
            await asyncio.Event().wait()
        billing.down = fails == "billing's session"
        return "http://127.0.0.1:1/"

    async def stop() -> None:
        stopped.append(True)

    running = asyncio.ensure_future(start.run(launch, at, stop))
    if fails == "cancelled":
        await launching.wait()
        running.cancel()
    with pytest.raises((web.HTTPError, RuntimeError, asyncio.CancelledError)) as raised:
        await running
    billing.down = False  # a release billing missed is retried in the background
    await wait_for_async(lambda: not billing.holds, "the hold released", timeout=5)
    assert held(made) == {}, "the devices went back"
    assert made.queue_view().free(record.offering) >= 1
    assert billing.holds == set() and billing.sessions == {}
    assert launched == ([] if fails == "admission" else [True])
    # what was launched is stopped only when billing could not open its session: a launch
    # that failed or was cancelled cleans up after itself
    assert stopped == ([True] if fails == "billing's session" else [])
    if fails == "admission":
        assert raised.value.status_code == 402
    if fails == "billing's session":
        assert raised.value.status_code == 503
    assert start.record is None


async def test_two_starts_never_take_the_same_device():
    made, billing = await machine(), BillingDouble()
    first, second = start_on(made, billing, "ada"), start_on(made, billing, "bob")
    card = two_free(made)
    a, b = placed(first, made, card), placed(second, made, card)
    assert a.devices and b.devices and not set(a.devices) & set(b.devices)
    await first.give_back()
    assert list(held(made)) == ["bob"]


async def test_simulated_cards_are_on_the_node_their_inventory_file_names(tmp_path):
    # the admin GPU page and placements named the simulated machine by the host's name
    made = await machine()
    assert made.pool_now.node == "workstation"  # hub_config/simulated-inventory.yaml's node
    bare = tmp_path / "inventory.yaml"
    bare.write_text("gpus:\n  - card: T4\n")
    unnamed = LocalMachine(DeviceSource("file", str(bare), (), "host-name"))
    assert (await unnamed.pool(CATALOG)).node == "host-name"


async def test_a_start_notes_its_time_to_ready_with_its_wait_in_the_queue():
    """The record says how long the start took until its server answered, and how much of it
    was the queue's; the sentence the spawn page, the home page and Lab show says both."""
    made, billing = await machine(), BillingDouble()
    card = two_free(made)
    first, second = start_on(made, billing, "ada"), start_on(made, billing, "bob")
    placed(first, made, card), placed(second, made, card)
    third = start_on(made, billing, "cyd")
    prices = dict.fromkeys([*made.pool_now.free_view().keys(), CPU_KEY], 1_000_000)

    async def free_one_later() -> None:
        await asyncio.sleep(0.8)
        await first.give_back()

    freeing = asyncio.ensure_future(free_one_later())
    placement = await third.place(
        CardRequest(card, 1),
        free_view=made.queue_view,
        prices=prices,
        may_wait=True,
        wait_seconds=10,
        note=lambda _note: None,
    )
    await freeing
    record = third.take(placement, ServerRecord(str(uuid.uuid4()), placement.offering.key, 1))
    assert record.time_to_ready is None, "not ready before it answers"

    async def launch() -> str:
        await asyncio.sleep(0.3)
        return "http://127.0.0.1:1/"

    async def stop() -> None:
        raise AssertionError("nothing to stop: the start ran")

    await third.run(launch, at, stop)
    ready = record.time_to_ready
    assert 0.7 <= ready.queued_seconds < 3
    assert ready.queued_seconds + 0.3 <= ready.seconds < ready.queued_seconds + 3
    assert ready.message.startswith(f"Ready {ready.seconds:.2f} s after Start (")
    assert "waiting in the queue for a GPU" in ready.message
    # the hub's spawner state keeps it across a hub restart
    assert ServerRecord.from_state(record.to_state()).time_to_ready == ready
