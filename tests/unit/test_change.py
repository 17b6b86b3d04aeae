"""The change of a server's GPU as a state machine, against a stand-in of the hub's stop and
start: done, reverted when the new start fails, failed when nothing starts, and refusals
that stop nothing."""

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from tornado import web

from spawner.core.catalog import Catalog
from spawner.core.placement import Alternative, Placement, Refusal, parse_options
from spawner.core.record import ServerRecord
from spawner.lifecycle import change
from spawner.lifecycle.billing_client import BillingUnavailable
from spawner.lifecycle.change import ChangeRefused, change_server
from spawner.lifecycle.environment import EnvironmentChoice

CATALOG = Catalog.load()
SLICE = {"kind": "slice", "card": "A100-80GB", "profile": "1g.10gb"}
RTX = {"kind": "card", "card": "RTX-4090", "count": 1}
FITS = Placement(CATALOG.offering("RTX-4090"), 1, "ws", 5_000_000)
SOLD_OUT = Refusal(
    "No RTX-4090 free now (0 of 2 free)", (Alternative(CATALOG.offering("T4"), 1, 1_500_000),)
)


class Billing:
    def __init__(self) -> None:
        self.up = True

    async def account(self, username: str) -> dict:
        if not self.up:
            raise BillingUnavailable("billing unreachable: Connection refused")
        return {"username": username}


def running_on(key: str) -> ServerRecord:
    return ServerRecord(session_id="s-1", offering=key, count=1)


#: gputap's own environment (the default) and one that needs a GPU of 20 GB or more
ENVIRONMENTS = {
    "gputap": {"name": "gputap minimal", "default": True},
    "torch": {"name": "PyTorch", "needs": {"gpu": True, "min_gpu_memory_gb": 20}},
}


class Spawner(EnvironmentChoice):
    """What a change reads of a running server's spawner (its environments the real ones)."""

    catalog = CATALOG

    def __init__(self, answer: Placement | Refusal) -> None:
        super().__init__(environments=ENVIRONMENTS, catalog=CATALOG)
        self.user = SimpleNamespace(name="alice", groups=[])
        self.answer = answer
        self.pending: str | None = None
        self.ready = True
        self.user_options = dict(SLICE)
        self.record: ServerRecord | None = running_on("A100-80GB/1g.10gb")
        self.queue_note = ""
        self.billing = Billing()
        self.stop_reasons: list = []  # why each stop happens, as the change recorded it

    @property
    def stop_book(self) -> SimpleNamespace:
        return SimpleNamespace(next_because=self.stop_reasons.append)

    def parse_server_options(self, options):
        return parse_options(options, CATALOG)

    async def fits_after_stop(self, options):
        self.fitted = options
        return self.answer


class Hub:
    """The hub's stop and start: ``failing`` lists the offering keys whose start fails."""

    def __init__(self, spawner: Spawner, failing=(), stop_fails=False, queue_for=0.0) -> None:
        self.the_spawner = spawner
        self.failing = set(failing)
        self.stop_fails = stop_fails
        self.queue_for = queue_for
        self.calls: list[tuple] = []

    def spawner(self, user, server_name):
        return self.the_spawner

    async def stop(self, user, server_name):
        self.calls.append(("stop", server_name))
        self.reasons_at_stop = list(self.the_spawner.stop_reasons)
        if self.stop_fails:
            raise RuntimeError("it did not stop")
        self.the_spawner.ready, self.the_spawner.record = False, None

    async def start(self, user, server_name, options):
        self.calls.append(("start", dict(options)))
        key = "RTX-4090" if options.get("kind") == "card" else "A100-80GB/1g.10gb"
        if self.queue_for:
            self.the_spawner.queue_note = "waiting for a free RTX-4090: 1st in queue"
            await asyncio.sleep(self.queue_for)
            self.the_spawner.queue_note = ""
        await asyncio.sleep(0)
        if key in self.failing:
            raise web.HTTPError(409, f"No {key} free now (0 of 2 free).")
        self.the_spawner.ready, self.the_spawner.record = True, running_on(key)
        self.the_spawner.user_options = options


@pytest.fixture(autouse=True)
def no_changes(monkeypatch):
    monkeypatch.setattr(change, "_changes", {})
    monkeypatch.setattr(change, "QUEUE_LOOK_SECONDS", 0.01)
    monkeypatch.setattr(change, "ANSWER_GRACE_SECONDS", 0)


ALICE = SimpleNamespace(name="alice")


async def finished(record: change.Change) -> change.Change:
    """The record once the change's background task is over."""
    await asyncio.wait_for(asyncio.gather(*change._tasks), 5)
    return record


async def test_a_change_stops_then_starts_with_the_new_options(caplog):
    spawner = Spawner(FITS)
    hub = Hub(spawner)
    caplog.set_level("INFO", logger="tornado.application")
    record = await change_server(hub, ALICE, "", RTX)
    assert record.state == "stopping"
    assert (record.from_key, record.to_key) == ("A100-80GB/1g.10gb", "RTX-4090")
    await finished(record)
    assert record.state == "done" and record.message == "Now running on RTX-4090."
    assert hub.calls == [("stop", ""), ("start", RTX)]
    assert record.view()["finished_at"] is not None
    states = [m.split(": ")[2] for m in caplog.messages if m.startswith("alice: change")]
    assert states == ["stopping", "starting", "done"]
    assert change.status("alice", "") is record


async def test_a_change_records_why_the_server_stops_before_stopping_it():
    spawner = Spawner(FITS)
    hub = Hub(spawner)
    await finished(await change_server(hub, ALICE, "", RTX, reason="mount disk data"))
    # the reason was recorded before the stop was asked for (the server is told it)
    assert hub.calls[0] == ("stop", "")
    [reason] = hub.reasons_at_stop
    why = reason(datetime(2025, 5, 1, 14, 5, tzinfo=UTC))
    assert why.kind == "change"
    assert why.message == "Your server is restarting at 14:05 UTC for a restart (mount disk data)."
    assert why.todo == "It comes back by itself; Lab reloads when it is up."


async def test_a_failed_new_start_goes_back_to_the_old_options():
    spawner = Spawner(FITS)
    spawner.user_options = {**SLICE, "queue": True}
    hub = Hub(spawner, failing={"RTX-4090"})
    record = await finished(await change_server(hub, ALICE, "", RTX))
    assert record.state == "reverted"
    assert record.message == (
        "The RTX-4090 server did not start (No RTX-4090 free now (0 of 2 free)); you are back "
        "on the A100-80GB 1g.10gb slice server."
    )
    # the old server starts again without waiting in any line
    assert hub.calls == [("stop", ""), ("start", RTX), ("start", SLICE)]


async def test_a_failed_restart_undoes_what_its_caller_changed_before_the_old_start():
    spawner = Spawner(FITS)
    spawner.user_options = dict(SLICE)
    hub = Hub(spawner, failing={"RTX-4090"})

    async def undo():
        hub.calls.append(("undo",))

    record = await finished(await change_server(hub, ALICE, "", RTX, undo=undo))
    assert record.state == "reverted"
    assert hub.calls == [("stop", ""), ("start", RTX), ("undo",), ("start", SLICE)]


async def test_when_neither_starts_the_change_failed_and_says_what_to_do():
    hub = Hub(Spawner(FITS), failing={"RTX-4090", "A100-80GB/1g.10gb"})
    record = await finished(await change_server(hub, ALICE, "gpu", RTX))
    assert record.state == "failed" and record.who == "alice/gpu"
    assert "nor did the A100-80GB 1g.10gb slice one" in record.message
    assert "Start your server again from the hub's home page" in record.message


async def test_a_server_that_does_not_stop_is_not_started_again():
    hub = Hub(Spawner(FITS), stop_fails=True)
    record = await finished(await change_server(hub, ALICE, "", RTX))
    assert record.state == "failed" and "could not be stopped (it did not stop)" in record.message
    assert hub.calls == [("stop", "")]


async def test_sold_out_is_refused_with_alternatives_and_nothing_stops():
    hub = Hub(Spawner(SOLD_OUT))
    with pytest.raises(ChangeRefused) as refused:
        await change_server(hub, ALICE, "", RTX)
    assert refused.value.status_code == 409
    assert "Your server was not stopped" in refused.value.log_message
    [alternative] = refused.value.alternatives
    assert alternative["options"] == {"kind": "card", "card": "T4", "count": 1}
    assert alternative["price_per_hour"] == "1.50"
    assert hub.calls == [] and change.status("alice", "") is None


async def test_sold_out_with_the_queue_waits_and_shows_it():
    hub = Hub(Spawner(SOLD_OUT), queue_for=0.2)
    record = await change_server(hub, ALICE, "", RTX, queue=True)
    seen = set()
    while record.active:
        seen.add((record.state, record.message))
        await asyncio.sleep(0.01)
    assert ("waiting", "waiting for a free RTX-4090: 1st in queue") in seen
    assert record.state == "done"
    assert hub.calls[1] == ("start", {**RTX, "queue": True})


@pytest.mark.parametrize(
    "setup,code,message",
    [
        (lambda s: setattr(s, "ready", False), 409, "alice is not running"),
        (lambda s: setattr(s, "pending", "spawn"), 409, "alice is still starting"),
        (lambda s: setattr(s, "pending", "stop"), 409, "alice is busy (stop pending)"),
        (lambda s: setattr(s.billing, "up", False), 503, "yours was not stopped"),
    ],
)
async def test_refusals_stop_nothing(setup, code, message):
    spawner = Spawner(FITS)
    setup(spawner)
    hub = Hub(spawner)
    with pytest.raises(web.HTTPError) as refused:
        await change_server(hub, ALICE, "", RTX)
    assert refused.value.status_code == code and message in refused.value.log_message
    assert hub.calls == []


async def test_bad_options_are_a_400_and_a_second_change_waits_for_the_first():
    hub = Hub(Spawner(FITS))
    with pytest.raises(web.HTTPError) as refused:
        await change_server(hub, ALICE, "", {"kind": "card", "card": "B300"})
    assert refused.value.status_code == 400 and "unknown card 'B300'" in refused.value.log_message
    first = await change_server(hub, ALICE, "", RTX)
    with pytest.raises(web.HTTPError) as busy:
        await change_server(hub, ALICE, "", SLICE)
    assert busy.value.status_code == 409 and "already changing" in busy.value.log_message
    await finished(first)


async def test_a_change_keeps_the_environment_unless_it_names_another():
    spawner = Spawner(FITS)
    spawner.user_options = {**SLICE, "environment": "torch"}
    hub = Hub(spawner)
    await finished(await change_server(hub, ALICE, "", RTX))
    assert hub.calls[1] == ("start", {**RTX, "environment": "torch"})
    # another payer may pin one: the environment is theirs to say
    kept = change.with_environment_kept(
        {**RTX, "course": "dl-2026"}, {**SLICE, "environment": "torch"}
    )
    assert kept == {**RTX, "course": "dl-2026"}
    # naming one changes it too
    await finished(await change_server(hub, ALICE, "", {**SLICE, "environment": "gputap"}))
    assert hub.calls[3] == ("start", {**SLICE, "environment": "gputap"})


async def test_a_change_the_environment_cannot_run_on_is_a_400_and_stops_nothing():
    spawner = Spawner(FITS)
    spawner.user_options = {**RTX, "environment": "torch"}
    hub = Hub(spawner)
    with pytest.raises(web.HTTPError) as refused:
        await change_server(hub, ALICE, "", {"kind": "cpu"})
    assert refused.value.status_code == 400
    assert "environment torch needs a GPU" in refused.value.log_message
    with pytest.raises(web.HTTPError) as refused:
        await change_server(hub, ALICE, "", {**RTX, "environment": "tensorflow"})
    assert "you may use: gputap, torch" in refused.value.log_message
    assert hub.calls == []
    # a spec asks for what the environment needs
    await finished(await change_server(hub, ALICE, "", {"kind": "spec", "min_memory_gb": 8}))
    assert spawner.fitted.request.min_memory_gb == 20
