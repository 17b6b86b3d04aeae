"""GPU faults, the pure parts and the desk without a hub: what counts as a fault, the book of
each device's state, isolation in the device pool, the queue's front, the stop notice."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from spawner.core.catalog import load_catalog
from spawner.core.health import (
    DRAINED,
    FAULTY,
    HEALTHY,
    BookError,
    Fault,
    HealthBook,
    is_critical_xid,
    xid_detail,
)
from spawner.core.placement import Placement
from spawner.core.queue import WaitQueues
from spawner.lifecycle import recovery, stops
from spawner.lifecycle.faults import FaultDesk
from spawner.local.inventory import Device, DevicePool

AT = datetime(2026, 12, 4, 10, 0, 5, tzinfo=UTC)
SETTINGS = {
    "enabled": True,
    "poll_seconds": 2,
    "ignore_xids": [],
    "node_conditions": ["GPUXIDErrors"],
    "restart": "same",
    "max_restarts": 2,
    "restart_window_seconds": 86400,
    "save_grace_seconds": 0,
    "history": 10,
    "max_reports_per_user_per_day": 2,
}


def fault(*devices: str, at: datetime = AT, kind: str = "xid") -> Fault:
    return Fault(kind, xid_detail(79), "nvml", "ws", tuple(devices), at, gpu=devices[0])


def pool() -> DevicePool:
    return DevicePool(
        [Device(f"GPU-{i}", "A100-80GB", None, i, 81920, simulated=True) for i in range(3)], "ws"
    )


def test_application_xids_are_not_faults_and_the_operator_may_ignore_more():
    assert not is_critical_xid(13)
    assert not is_critical_xid(43)
    assert is_critical_xid(79)
    assert not is_critical_xid(79, {79})
    assert xid_detail(79) == "XID 79 (GPU has fallen off the bus)"
    assert xid_detail(1234) == "XID 1234"


def test_a_fault_puts_its_devices_out_until_an_admin_returns_them():
    book = HealthBook()
    assert book.fault(fault("GPU-1")) == ["GPU-1"]
    assert book.state("GPU-1") == FAULTY
    # a second fault on the same device changes nothing: it stays with its first fault
    first = book.devices["GPU-1"].fault
    assert book.fault(fault("GPU-1", kind="ecc")) == []
    assert book.devices["GPU-1"].fault == first
    with pytest.raises(BookError, match="return it instead"):
        book.drain("GPU-1", AT)
    assert book.give_back("GPU-1").state == FAULTY
    assert book.state("GPU-1") == HEALTHY


def test_a_drained_device_that_fails_becomes_faulty():
    book = HealthBook()
    book.drain("GPU-2", AT, "maintenance")
    assert book.out() == {"GPU-2": DRAINED}
    assert book.fault(fault("GPU-2")) == ["GPU-2"]
    assert book.out() == {"GPU-2": FAULTY}


def test_the_book_keeps_its_history_capped_and_reads_back_what_it_wrote():
    book = HealthBook(history=3)
    for i in range(5):
        book.fault(fault(f"GPU-{i}", at=AT + timedelta(seconds=i)))
        if i < 2:
            book.give_back(f"GPU-{i}")
    book.note_outcome(book.faults[-1].id, "alice/gpu", outcome="running")
    assert [f.devices[0] for f in book.faults] == ["GPU-2", "GPU-3", "GPU-4"]
    again = HealthBook.from_json(json.loads(json.dumps(book.to_json())), history=3)
    assert again.faults == book.faults
    assert again.out() == book.out() and len(again.out()) == 3
    assert again.outcomes[book.faults[-1].id] == [{"server": "alice/gpu", "outcome": "running"}]
    # outcomes of faults dropped from the history go with them
    assert set(book.to_json()["outcomes"]) <= {f.id for f in book.faults}


def test_devices_out_of_service_are_never_free_but_still_the_machines():
    devices = pool()
    devices.set_out(["GPU-0"], FAULTY)
    view = devices.free_view()
    # still counted: a start that wants it waits for its return, not "this platform has none"
    assert (view.max_free("A100-80GB"), view.total("A100-80GB")) == (2, 3)
    offering = load_catalog({}).offering("A100-80GB")
    taken = devices.take(Placement(offering, 2, "ws", 0), "alice")
    assert "GPU-0" not in [d.uuid for d in taken]
    with pytest.raises(RuntimeError):
        devices.take(Placement(offering, 1, "ws", 0), "bob")
    devices.set_in(["GPU-0"])
    assert devices.free_view().max_free("A100-80GB") == 1


def test_a_server_moved_off_a_broken_gpu_waits_ahead_of_new_spawns():
    lines = WaitQueues()
    lines.join("bob", "A100-80GB", 1)
    lines.join("carol", "A100-80GB", 1)
    lines.join("alice/gpu", "A100-80GB", 1, front=True)
    lines.join("dave/gpu", "A100-80GB", 1, front=True)
    assert [w.holder for w in lines.lines["A100-80GB"]] == ["alice/gpu", "dave/gpu", "bob", "carol"]
    assert lines.position("alice/gpu") == 1


def test_the_fault_notice_says_billing_stopped_and_what_happens_next():
    restarting = stops.by_fault(xid_detail(79), stops.fault_next(True))(AT)
    view = restarting.view()
    assert view["kind"] == "fault" and view["restarting"] is True
    assert view["message"] == (
        "The GPU of your server failed at 10:00 UTC. Billing stopped at that second. "
        "What failed: XID 79 (GPU has fallen off the bus)."
    )
    limit = stops.by_fault("GPU is lost", stops.fault_next(False, "the limit"))(AT).view()
    assert limit["restarting"] is False
    assert "not started again: the limit" in limit["todo"]


def test_the_desk_isolates_in_the_same_step_and_names_the_servers_hit(tmp_path):
    desk = FaultDesk(tmp_path / "gpu-health.json", SETTINGS, "token")
    devices = pool()
    desk.add_pool(devices)
    devices.holder.update({"GPU-1": "alice/gpu", "GPU-2": "bob/gpu#w1"})
    hit = fault("GPU-1", "GPU-2")
    assert desk.affected(hit) == ["alice/gpu"]
    assert desk.affected_workers(hit) == [("bob/gpu", "w1")]
    desk._write(json.dumps(desk.book.to_json()))  # the report saves through the loop
    desk.book.fault(hit)
    desk._isolate(hit, ["GPU-1", "GPU-2"])
    assert devices.out == {"GPU-1": FAULTY, "GPU-2": FAULTY}
    # a new pool (a hub restart) starts with what the book holds out
    desk.save()
    again = FaultDesk(tmp_path / "gpu-health.json", SETTINGS, "token")
    fresh = pool()
    again.add_pool(fresh)
    assert fresh.out == {"GPU-1": FAULTY, "GPU-2": FAULTY}
    assert (tmp_path / "gpu-health.json").stat().st_mode & 0o077 == 0


def test_a_device_is_returned_only_once_its_servers_stopped_from_it(tmp_path):
    desk = FaultDesk(tmp_path / "gpu-health.json", SETTINGS, "token")
    devices = pool()
    desk.add_pool(devices)
    hit = fault("GPU-1")
    desk.book.fault(hit)
    desk._isolate(hit, ["GPU-1"])
    desk.book.note_outcome(hit.id, "alice/gpu", outcome="stopping")
    with pytest.raises(BookError, match="alice/gpu still stopping from it"):
        desk.give_back("GPU-1")
    with pytest.raises(BookError, match="still lost"):
        desk.give_back("GPU-1", "GPU-1 is still lost: NVML cannot open it")
    # waiting in line for a like device (none left healthy): the return is what it waits for
    desk.book.note_outcome(hit.id, "alice/gpu", outcome="waiting")
    desk.give_back("GPU-1")
    assert devices.out == {} and desk.book.state("GPU-1") == HEALTHY
    with pytest.raises(BookError, match="in service already"):
        desk.give_back("GPU-1")


def test_restarts_after_faults_are_bounded_per_server(tmp_path):
    desk = FaultDesk(tmp_path / "gpu-health.json", SETTINGS, "token")
    now = AT + timedelta(hours=1)
    for i in range(2):
        f = fault(f"GPU-{i}", at=AT + timedelta(minutes=i))
        desk.book.fault(f)
        desk.book.note_outcome(f.id, "alice/gpu", restarted=True)
    assert desk.restart_refusal("bob/gpu", now) is None
    assert "already restarted 2 times" in desk.restart_refusal("alice/gpu", now)
    # outside the window they no longer count
    assert desk.restart_refusal("alice/gpu", AT + timedelta(days=2)) is None
    off = FaultDesk(tmp_path / "off.json", {**SETTINGS, "restart": "off"}, "token")
    assert "turned restarts after GPU faults off" in off.restart_refusal("bob/gpu", now)


def test_an_unreadable_book_is_kept_aside_and_the_pool_starts_healthy(tmp_path):
    path = tmp_path / "gpu-health.json"
    path.write_text("{not json")
    desk = FaultDesk(path, SETTINGS, "token")
    assert desk.book.out() == {}
    assert [p.name for p in tmp_path.iterdir() if "unreadable" in p.name]


def test_a_pod_naming_a_unit_its_node_already_lost_takes_over_that_hold(tmp_path):
    """Kubernetes: the node's allocatable drop came first (one unnamed unit held out), then
    the pod's allocatedResourcesStatus names the device: one entry for the admin to return."""
    desk = FaultDesk(tmp_path / "gpu-health.json", SETTINGS, "token")
    drop = Fault(
        "unhealthy", "1 of 4 lost", "node", "n1", (), AT, resource="nvidia.com/gpu", units=1
    )
    desk.book.fault(drop)
    assert list(desk.book.out()) == [f"n1/nvidia.com/gpu@{drop.id}"]
    named = Fault(
        "unhealthy", "Unhealthy", "pod", "n1", ("n1/GPU-3",), AT,
        resource="nvidia.com/gpu", units=0, pods=("ns/jupyter-ada",),
    )  # fmt: skip
    booked = desk._named(named)
    assert booked.units == 1
    desk.book.fault(booked)
    assert list(desk.book.out()) == ["n1/GPU-3"]
    assert desk._units("n1/GPU-3", booked.id) == 1


def held(inventory, node: str, resource: str) -> int:
    return inventory.held_out.get(node, {}).get(resource, 0)


def kube_desk(tmp_path):
    """A desk on a cluster inventory of one L40S node (4 GPUs) and one H100 node of slices."""
    from types import SimpleNamespace

    from tests.unit.test_kube_inventory import cluster

    desk = FaultDesk(tmp_path / "gpu-health.json", SETTINGS, "token")
    inventory = cluster()
    desk.add_cluster(SimpleNamespace(inventory=inventory, pods=[]))
    return desk, inventory


def test_draining_twice_or_a_fault_on_a_drained_gpu_holds_one_unit(tmp_path):
    desk, inventory = kube_desk(tmp_path)
    desk.drain("gpu-l40s/GPU-1", "noisy fan")
    desk.drain("gpu-l40s/GPU-1", "still noisy")
    assert held(inventory, "gpu-l40s", "nvidia.com/gpu") == 1
    named = Fault(
        "unhealthy", "Unhealthy", "pod", "gpu-l40s", ("gpu-l40s/GPU-1",), AT,
        resource="nvidia.com/gpu", units=1, pods=("ns/jupyter-ada",),
    )  # fmt: skip
    desk.report(named)
    assert held(inventory, "gpu-l40s", "nvidia.com/gpu") == 1
    desk.give_back("gpu-l40s/GPU-1")
    assert held(inventory, "gpu-l40s", "nvidia.com/gpu") == 0


def test_a_slices_fault_holds_out_a_slice_and_its_return_gives_it_back(tmp_path):
    desk, inventory = kube_desk(tmp_path)
    assert inventory.resource_of("gpu-h100", "H100-80GB/1g.10gb") == "nvidia.com/mig-1g.10gb"
    reported = Fault(
        "reported", "GPU lost", "lab", "gpu-h100", ("gpu-h100/MIG-7",), AT,
        resource="nvidia.com/mig-1g.10gb", units=1, pods=("ns/jupyter-bo",),
    )  # fmt: skip
    desk.report(reported)
    assert held(inventory, "gpu-h100", "nvidia.com/mig-1g.10gb") == 1
    assert held(inventory, "gpu-h100", "nvidia.com/gpu") == 0
    desk.give_back("gpu-h100/MIG-7")
    assert held(inventory, "gpu-h100", "nvidia.com/mig-1g.10gb") == 0


def test_a_pod_naming_a_gpu_already_held_takes_over_nothing(tmp_path):
    desk, inventory = kube_desk(tmp_path)
    drop = Fault("unhealthy", "1 of 4 lost", "node", "gpu-l40s", (), AT,
                 resource="nvidia.com/gpu", units=1)  # fmt: skip
    lab = Fault("reported", "GPU lost", "lab", "gpu-l40s", ("gpu-l40s/GPU-2",), AT,
                resource="nvidia.com/gpu", units=1, pods=("ns/jupyter-cy",))  # fmt: skip
    pod = Fault("unhealthy", "Unhealthy", "pod", "gpu-l40s", ("gpu-l40s/GPU-2",), AT,
                resource="nvidia.com/gpu", units=0, pods=("ns/jupyter-cy",))  # fmt: skip
    for fault_ in (drop, lab, pod):
        desk.report(fault_)
    # two units held, two entries to return: each return gives back its own
    assert held(inventory, "gpu-l40s", "nvidia.com/gpu") == 2
    for device in list(desk.book.out()):
        desk.give_back(device)
    assert held(inventory, "gpu-l40s", "nvidia.com/gpu") == 0


def test_the_history_keeps_faults_a_device_is_still_out_for(tmp_path):
    book = HealthBook(history=2)
    old = fault("GPU-0")
    book.fault(old)
    for i in range(1, 5):
        f = fault(f"GPU-{i}", at=AT + timedelta(seconds=i))
        book.fault(f)
        book.give_back(f"GPU-{i}")
    assert book.faults == [old, f]


def test_a_server_reports_at_most_its_own_gpus_and_none_while_it_moves(tmp_path):
    from types import SimpleNamespace

    desk, inventory = kube_desk(tmp_path)
    server = SimpleNamespace(
        node_of_pod=lambda: "gpu-l40s",
        record=SimpleNamespace(count=1, offering="L40S"),
        pod_key="ns/jupyter-ada",
    )
    assert desk.server_report("ada", server, "GPU-1", "lost", "", AT)
    with pytest.raises(BookError, match="already reported its 1 GPU"):
        desk.server_report("ada", server, "GPU-2", "lost", "", AT)
    assert held(inventory, "gpu-l40s", "nvidia.com/gpu") == 1
    desk.recovering["ada"] = "f1"
    with pytest.raises(BookError, match="already being moved"):
        desk.server_report("ada", server, "GPU-3", "lost", "", AT)


def test_a_users_servers_together_report_at_most_the_daily_cap(tmp_path):
    """Each report takes a GPU out until an admin returns it: cycling named servers (each
    within its own count) must not take the cluster's GPUs out one by one."""
    desk, inventory = kube_desk(tmp_path)

    def server(name: str) -> SimpleNamespace:
        return SimpleNamespace(
            node_of_pod=lambda: "gpu-l40s",
            record=SimpleNamespace(count=1, offering="L40S"),
            pod_key=f"ns/jupyter-ada--{name}",
        )

    assert desk.server_report("ada/one", server("one"), "GPU-0", "lost", "", AT)
    assert desk.server_report("ada/two", server("two"), "GPU-1", "lost", "", AT)
    with pytest.raises(BookError, match="ada's servers already reported 2 GPUs .* 24 hours"):
        desk.server_report("ada/three", server("three"), "GPU-2", "lost", "", AT)
    assert held(inventory, "gpu-l40s", "nvidia.com/gpu") == 2
    # another user is not held to ada's count; ada is again a day later
    assert desk.server_report("bo", server("bo"), "GPU-2", "lost", "", AT)
    later = AT + timedelta(days=1, seconds=1)
    assert desk.server_report("ada/four", server("four"), "GPU-3", "lost", "", later)
    # the count survives a hub restart: it is in the book
    desk.save()
    again = FaultDesk(tmp_path / "gpu-health.json", SETTINGS, "token")
    assert again.book.reports_by("ada", later, timedelta(days=1)) == 1
    off = FaultDesk(tmp_path / "off.json", {**SETTINGS, "max_reports_per_user_per_day": 0}, "t")
    off.add_cluster(SimpleNamespace(inventory=inventory, pods=[]))
    with pytest.raises(BookError, match="max_reports_per_user_per_day: 0"):
        off.server_report("cy", server("cy"), "GPU-0", "lost", "", AT)


@pytest.mark.parametrize("backend", ["local", "kubernetes"])
def test_the_desk_posts_recoveries_to_where_the_hub_listens(tmp_path, backend):
    from traitlets.config import Config

    from gputap_common.settings import load_settings
    from hub_config.hub import apply
    from spawner.lifecycle import faults

    c = Config()
    environ = {
        "GPUTAP__DATA_DIR": str(tmp_path),
        "GPUTAP__SPAWNER__BACKEND": backend,
        "GPUTAP__SPAWNER__KUBERNETES__HUB_IP": "10.42.0.1",
    }
    apply(c, load_settings(environ=environ))
    host = "10.42.0.1" if backend == "kubernetes" else "127.0.0.1"
    assert faults.desk().api_url == f"http://{host}:{c.JupyterHub.hub_port}/hub/api"
    [role] = [r for r in c.JupyterHub.load_roles if r["name"] == faults.HEALTH_SERVICE]
    assert role["scopes"] == ["admin:servers"]
    faults.install(None)


def test_a_resumed_recovery_waits_for_the_hubs_check_of_the_server(tmp_path):
    """A hub started under load leaves its check of each running server to finish in the
    background (init_spawners_timeout; the spawner's pending is "check"): the recovery the
    last hub left unfinished decides on what that check found, not on the pending state."""
    desk = FaultDesk(tmp_path / "gpu-health.json", {**SETTINGS, "restart": "off"}, "token")
    hit = fault("GPU-1")
    desk.book.fault(hit)
    desk.book.note_outcome(hit.id, "jo", outcome="stopping", session_id="s-1")
    record = SimpleNamespace(session_id="s-1")
    spawner = SimpleNamespace(pending="check", active=True, record=record, user_options={})
    hub = SimpleNamespace(spawner=lambda user, name: spawner)

    async def found_stopped_later():
        # the check finds the server stopped while no hub ran, and JupyterHub stops it
        await asyncio.sleep(0.3)
        spawner.pending, spawner.active, spawner.record = None, False, None

    async def main():
        check = asyncio.ensure_future(found_stopped_later())
        await recovery.recover(hub, SimpleNamespace(name="jo"), "", hit, desk, resume=True)
        await check

    asyncio.run(main())
    [outcome] = desk.book.outcomes[hit.id]
    assert outcome["outcome"] == "not restarted", outcome
    assert "turned restarts after GPU faults off" in outcome["why"]


def test_one_return_brings_back_everything_its_fault_took_out(tmp_path):
    desk = FaultDesk(tmp_path / "gpu-health.json", SETTINGS, "token")
    devices = pool()
    desk.add_pool(devices)
    card = fault("GPU-1", "GPU-2")
    desk.book.fault(card)
    desk._isolate(card, ["GPU-1", "GPU-2"])  # a card's fault takes all its slices
    other = fault("GPU-0")
    desk.book.fault(other)
    desk._isolate(other, ["GPU-0"])
    desk.give_back("GPU-2")
    assert devices.out == {"GPU-0": FAULTY}
    assert desk.book.state("GPU-1") == HEALTHY and desk.book.state("GPU-0") == FAULTY
