"""A worker group's life (spawner/lifecycle/workers.py) with a fake backend and a fake billing:
a stop while workers are placed, an agent's malformed status, the token at rest, how the
workers ended kept for the next spawner object."""

import asyncio
import logging
from datetime import UTC, datetime

from spawner.core.catalog import Catalog
from spawner.core.placement import CardRequest, FreeView
from spawner.core.record import ServerRecord
from spawner.core.workers import READY, STOPPED, Worker, WorkerRequest
from spawner.lifecycle.scale_out import STATE_KEY, ScaleOut
from spawner.lifecycle.workers import WorkerGroup

CATALOG = Catalog.load()
PRICES = {"cpu": 100_000, "A100-80GB": 8_000_000}


class Billing:
    """Billing's admission, held until ``admitted`` is set (the test stops the group then)."""

    def __init__(self):
        self.admitted = asyncio.Event()
        self.asked = asyncio.Event()
        self.holds: set[str] = set()

    async def admit(self, user, record):
        self.asked.set()
        await self.admitted.wait()
        self.holds.add(record.session_id)
        return {"hold_id": record.session_id}

    async def release_hold(self, hold_id):
        self.holds.discard(hold_id)

    async def start_session(self, user, server, record):
        pass

    async def stop_session(self, session_id, ended_at):
        return {"billed_seconds": 0}


class Backend:
    """One machine with four free A100s (the workers' backend and the machine they take
    devices from); records what was taken and launched."""

    def __init__(self):
        self.taken: set[str] = set()
        self.launched: list[str] = []

    async def views(self, request):
        view = FreeView()
        view.set("A100-80GB", "node", 4 - len(self.taken), 4)
        return (lambda: view), view

    def take(self, placement, record, holder):
        self.taken.add(holder)

    def release(self, record, holder):
        self.taken.discard(holder)

    def claim(self, record, holder):
        self.taken.add(holder)

    def queue_view(self):
        return FreeView()

    async def launch(self, worker, token):
        self.launched.append(worker.name)
        raise RuntimeError("not in this test")

    async def wait(self, worker):
        await asyncio.Event().wait()

    async def stop(self, worker):
        pass

    def still_runs(self, worker):
        return False

    def rendezvous_host(self):
        return "notebook"


class Owner:
    who = "ada"
    name = ""
    log = logging.getLogger("test_worker_group")
    catalog = CATALOG
    worker_idle_seconds = 900

    def __init__(self):
        self.record = ServerRecord("s", "A100-80GB", 1, started_at=datetime.now(UTC))
        self.billing = Billing()
        self.backend = Backend()

    @property
    def machine(self):
        return self.backend

    def worker_backend(self):
        return self.backend

    async def prices_for(self, view, price_class="on-demand"):
        return PRICES

    def wake_queue(self):
        pass

    def save_state_now(self):
        pass


TWO = WorkerRequest(2, CardRequest("A100-80GB", 1))


async def test_a_stop_while_workers_are_admitted_launches_none_and_gives_all_back():
    owner = Owner()
    group = WorkerGroup(owner, "ada")
    scaling = asyncio.ensure_future(group.scale(TWO))
    await owner.billing.asked.wait()  # placed, billing's answer pending
    assert len(owner.backend.taken) == 2
    assert await group.stop("The server stopped.") == 2
    owner.billing.admitted.set()
    await scaling
    for _ in range(5):  # the holds are released in the background
        await asyncio.sleep(0)
    assert owner.backend.launched == []
    assert owner.backend.taken == set() and owner.billing.holds == set()
    assert {w.state for w in group.workers.values()} == {STOPPED}
    assert group.active == []


def ready_worker() -> Worker:
    worker = Worker(1, READY, record=ServerRecord("s1", "A100-80GB", 1, worker="w1"))
    worker.busy, worker.idle_since = True, datetime(2030, 1, 1, tzinfo=UTC)
    worker.gpus, worker.gpu_note = [{"index": 0}], ""
    return worker


def test_a_malformed_agent_status_leaves_the_worker_as_it_was(caplog):
    group = WorkerGroup(Owner(), "ada")
    worker = ready_worker()
    before = (worker.busy, worker.idle_since, worker.gpus, worker.gpu_note)
    for status in [
        {"busy": False, "idle_since": 12},
        {"busy": False, "idle_since": "yesterday"},
        {"busy": False, "idle_since": "2030-01-01T00:00:00"},  # no zone
        {"busy": False, "idle_since": "x" * 10_000},
        {"busy": "no"},
        {"busy": False, "gpus": "all"},
        {"busy": False, "gpus": [1, 2]},
        ["busy"],
        None,
    ]:
        group._heard(worker, status)
        assert (worker.busy, worker.idle_since, worker.gpus, worker.gpu_note) == before
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and len(warned[0].getMessage()) < 200


def test_a_good_agent_status_is_taken():
    group = WorkerGroup(Owner(), "ada")
    worker = ready_worker()
    group._heard(
        worker,
        {"busy": False, "idle_since": "2030-01-02T00:00:00+00:00", "gpus": [], "gpu_note": "ok"},
    )
    assert not worker.busy and worker.idle_since == datetime(2030, 1, 2, tzinfo=UTC)
    assert worker.gpus == [] and worker.gpu_note == "ok"


async def test_the_token_is_not_kept_once_no_worker_runs_and_a_new_group_gets_a_new_one():
    owner = Owner()
    owner.billing.admitted.set()
    group = WorkerGroup(owner, "ada")
    await group.scale(TWO)
    first = group.token
    assert first and group.to_state()["token"] == first  # w1 and w2 are starting
    await group.stop("done")
    assert group.active == [] and group.to_state()["token"] == ""
    await group.scale(TWO)
    assert group.token and group.token != first
    await group.stop("done")


async def test_how_the_workers_ended_outlives_the_spawner_object():
    """JupyterHub drops a stopped server's spawner: the group's view on the next one still
    says how the last workers ended, and a new group's workers take their places."""
    owner = Owner()
    owner.billing.admitted.set()
    group = WorkerGroup(owner, "ada")
    await group.scale(TWO)
    await group.stop("Stopped: your credit ran out.")
    state = group.to_state()
    assert state["workers"] == [] and state["token"] == ""

    scale_out = ScaleOut(owner, "ada")  # the next spawner object's
    scale_out.load_state({STATE_KEY: state})
    view = scale_out.group.view()
    assert [(w["name"], w["state"]) for w in view["workers"]] == [("w1", STOPPED), ("w2", STOPPED)]
    assert all(w["reason"] == "Stopped: your credit ran out." for w in view["workers"])
    assert view["count"] == 0 and "token" not in view
    saved: dict = {}
    scale_out.to_state(saved)
    assert saved[STATE_KEY]["ended"] == state["ended"]  # kept through the next save

    await scale_out.group.scale(TWO)
    names = [(w["name"], w["state"]) for w in scale_out.group.view()["workers"]]
    assert [n for n, _ in names] == ["w1", "w2"] and STOPPED not in {s for _, s in names}
    await scale_out.group.stop("done")
