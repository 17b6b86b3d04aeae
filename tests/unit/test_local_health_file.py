"""GPU faults on a machine without GPUs: the health watcher reads the ``fault`` entries of the
simulated inventory file (hub_config/simulated-inventory.yaml) and reports each new one once,
naming the devices the inventory serves."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from gputap_common import clock
from spawner.core.catalog import Catalog
from spawner.core.health import Fault
from spawner.local.health import LocalHealthWatcher
from spawner.local.inventory import file_devices

CATALOG = Catalog.load()
NOW = datetime(2025, 3, 1, 9, 30, 5, tzinfo=UTC)
POLL = 0.05


def write(path: Path, gpus: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"node": "ws", "gpus": gpus}))
    os.replace(tmp, path)


def devices_of(path: Path, gpu_index: int) -> list[str]:
    return [d.uuid for d in file_devices(path, CATALOG) if d.gpu_index == gpu_index]


class Reports(list):
    """What the watcher reported, each checked to arrive on the loop's thread."""

    def __init__(self):
        super().__init__()
        self.loop_thread = threading.current_thread()
        self.arrived = asyncio.Event()

    def __call__(self, fault: Fault) -> None:
        assert threading.current_thread() is self.loop_thread
        self.append(fault)
        self.arrived.set()

    async def until(self, count: int) -> None:
        """Until ``count`` reports have come (5 s at most)."""
        async with asyncio.timeout(5):
            while len(self) < count:
                self.arrived.clear()
                await self.arrived.wait()


@pytest.fixture
def reports(monkeypatch) -> Reports:
    monkeypatch.setattr(clock, "utcnow", lambda: NOW)
    return Reports()


def watcher_for(path: Path, reports: Reports, ignore_xids=frozenset()) -> LocalHealthWatcher:
    return LocalHealthWatcher(
        report=reports,
        mode="file",
        inventory_file=path,
        catalog=CATALOG,
        exclude=(),
        node="ws",
        poll_seconds=POLL,
        ignore_xids=ignore_xids,
    )


A100_MIG = {"card": "A100-80GB", "mig": ["1g.10gb", "1g.10gb", "2g.20gb"]}


async def test_each_new_fault_entry_is_reported_once_naming_the_inventorys_devices(
    tmp_path, reports
):
    path = tmp_path / "inventory.yaml"
    gpus = [dict(A100_MIG), {"card": "T4"}, {"card": "A100-80GB"}]
    write(path, gpus)
    watcher = watcher_for(path, reports, ignore_xids={92})
    watcher.start()
    await asyncio.sleep(POLL * 5)
    assert reports == []

    gpus[0]["fault"] = {"xid": 79, "mig_slot": 1}
    write(path, gpus)
    await reports.until(1)
    [fault] = reports
    assert (fault.kind, fault.detail, fault.source, fault.node) == (
        "xid",
        "XID 79 (GPU has fallen off the bus)",
        "simulated",
        "ws",
    )
    assert fault.devices == (devices_of(path, 0)[1],)  # the second MIG device only
    assert fault.gpu not in devices_of(path, 0) and fault.gpu.startswith("GPU-")
    assert fault.detected_at == NOW

    # two more: the T4 is lost, the whole A100 counts ECC errors; XIDs of the user's program
    # and those the operator ignores are no faults
    gpus[1]["fault"] = {"lost": True}
    gpus[2]["fault"] = {"xid": 13}
    write(path, gpus)
    await asyncio.sleep(POLL * 4)
    gpus[2]["fault"] = {"xid": 92}
    write(path, gpus)
    await asyncio.sleep(POLL * 4)
    gpus[2]["fault"] = {"ecc": 2}
    write(path, gpus)
    await reports.until(3)
    await asyncio.sleep(POLL * 5)
    assert [(f.kind, f.detail, f.devices) for f in reports[1:]] == [
        ("lost", "GPU is lost: NVML cannot reach it", tuple(devices_of(path, 1))),
        ("ecc", "2 uncorrected ECC errors", tuple(devices_of(path, 2))),
    ]

    # removing an entry returns nothing; writing one already reported again says nothing new
    for gpu in gpus:
        gpu.pop("fault", None)
    write(path, gpus)
    await asyncio.sleep(POLL * 4)
    gpus[1]["fault"] = {"lost": True}
    write(path, gpus)
    await asyncio.sleep(POLL * 4)
    assert len(reports) == 3

    # a different entry on a GPU that had one is new
    gpus[0]["fault"] = {"remap_failed": True}
    write(path, gpus)
    await reports.until(4)
    assert (reports[3].kind, reports[3].devices) == ("remap", tuple(devices_of(path, 0)))
    await watcher.stop()


async def test_faults_the_file_declares_at_the_start_are_reported(tmp_path, reports):
    path = tmp_path / "inventory.yaml"
    write(path, [{"card": "T4", "fault": {"lost": True}}, {"card": "A100-80GB"}])
    watcher = watcher_for(path, reports)
    watcher.start()
    await reports.until(1)
    await asyncio.sleep(POLL * 4)
    assert [(f.kind, f.devices) for f in reports] == [("lost", tuple(devices_of(path, 0)))]
    await watcher.stop()


async def test_a_malformed_fault_entry_is_logged_and_the_watch_goes_on(tmp_path, reports, caplog):
    caplog.set_level(logging.WARNING, logger="spawner.local.health")
    path = tmp_path / "inventory.yaml"
    gpus = [{"card": "A100-80GB", "fault": {"xid": 79, "mig_slot": 0}}, {"card": "T4"}]
    write(path, gpus)
    watcher = watcher_for(path, reports)
    watcher.start()
    await asyncio.sleep(POLL * 5)
    assert reports == []
    assert "mig_slot 0, but the card has no mig list; ignored" in caplog.text

    gpus[1]["fault"] = {"smoke": True}
    write(path, gpus)
    await asyncio.sleep(POLL * 4)
    assert "GPU 1: fault must be {xid: N[, mig_slot: K]}, {ecc: N}" in caplog.text
    assert reports == []

    gpus[1]["fault"] = {"ecc": 1}
    write(path, gpus)
    await reports.until(1)
    assert reports[0].detail == "1 uncorrected ECC error"
    await watcher.stop()


def test_a_fault_entry_changes_nothing_the_inventory_offers(tmp_path):
    path = tmp_path / "inventory.yaml"
    write(path, [dict(A100_MIG), {"card": "T4"}])
    before = file_devices(path, CATALOG)
    write(path, [{**A100_MIG, "fault": {"xid": 79, "mig_slot": 2}}, {"card": "T4", "fault": {}}])
    assert file_devices(path, CATALOG) == before
