"""This machine's devices: one :class:`LocalMachine` per hub process (per inventory source),
shared by every server, worker and the fault desk, owned by none of them.

It holds the device pool (read on first use, in an executor: NVML blocks; read again when
older than the spawner's ``inventory_refresh_seconds``), the cards NVML found that the catalog
does not know, and the claims of servers re-attached after a hub restart that arrive before
the pool is read. Taking devices is synchronous, so two starts never get the same device.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from ..core.catalog import Card, Catalog, discovered_card
from ..core.placement import FreeView, Placement
from ..core.record import ServerRecord
from ..lifecycle import faults
from .health import LocalHealthWatcher
from .inventory import (
    Device,
    DevicePool,
    InventoryUnavailable,
    file_node,
    load_local_devices,
    nvml_busy,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceSource:
    """Where this machine's devices are read from (the local spawner's settings)."""

    inventory: str
    inventory_file: str
    exclude: tuple[str, ...]
    node: str


class LocalMachine:
    """The device pool of this machine and what is known about it; a
    :class:`~spawner.lifecycle.machine.Machine`."""

    def __init__(self, source: DeviceSource):
        self.source = source
        self._pool: DevicePool | None = None
        self._lock = asyncio.Lock()
        #: when the pool was last read (monotonic seconds)
        self._read_at = 0.0
        #: cards of the GPUs NVML found that the catalog does not know, by SKU
        self.discovered: dict[str, Card] = {}
        self._with_discovered: dict[tuple[int, tuple[str, ...]], Catalog] = {}
        #: claims of re-attached servers before the pool is read: holder -> UUIDs
        self._pending: dict[str, list[str]] = {}

    # -- reading ----------------------------------------------------------------------------

    @property
    def pool_now(self) -> DevicePool | None:
        """The pool, if it was read already."""
        return self._pool

    async def pool(self, catalog: Catalog) -> DevicePool:
        """The pool, read on first use (by a spawner, or at hub start for the fault desk)."""
        async with self._lock:
            if self._pool is None:
                devices = await self._read(catalog)
                pool = DevicePool(devices, self._node_of(devices))
                for holder, uuids in self._pending.items():
                    for device_uuid in pool.claim(uuids, holder):
                        log.warning("%s: device %s is gone or taken", holder, device_uuid)
                self._pending.clear()
                desk = faults.desk()
                if desk is not None:
                    desk.add_pool(pool)
                self._pool = pool
                kind = "simulated" if pool.simulated else "NVML"
                log.info("GPU inventory of %s: %d %s devices", pool.node, len(devices), kind)
            return self._pool

    def _node_of(self, devices: list[Device]) -> str:
        """The machine's name in placements and pages: the simulated inventory's own ``node:``
        for its cards (the machine the file describes), else the host's."""
        if devices and all(d.simulated for d in devices):
            return file_node(self.source.inventory_file) or self.source.node
        return self.source.node

    async def _read(self, catalog: Catalog) -> list[Device]:
        source = self.source
        loop = asyncio.get_running_loop()
        devices = await loop.run_in_executor(
            None,
            load_local_devices,
            *(source.inventory, source.inventory_file, catalog, list(source.exclude)),
        )
        self._read_at = time.monotonic()
        self.discovered = {
            d.card: discovered_card(d.product, d.memory_mib) for d in devices if not d.known
        }
        return devices

    async def reread(self, catalog: Catalog, refresh_seconds: float) -> DevicePool:
        """The pool, NVML's GPUs read again first when the last reading is older than
        ``refresh_seconds`` (one reading for any number of starts asking): a MIG
        reconfiguration, a GPU lost or back, is seen without a restart."""
        pool = await self.pool(catalog)

        def fresh() -> bool:
            return time.monotonic() - self._read_at < refresh_seconds

        if pool.simulated or fresh():
            return pool
        async with self._lock:
            if fresh():
                return pool
            try:
                devices = await self._read(catalog)
            except InventoryUnavailable as e:
                log.warning("GPU inventory not read again (%s): keeping the last reading", e)
                self._read_at = time.monotonic()
                return pool
            added, gone = pool.update(devices)
            if added or gone:
                log.warning(
                    "GPU inventory of %s changed: %d devices, new %s, gone %s",
                    *(pool.node, len(devices), ",".join(added) or "none"),
                    ",".join(gone) or "none",
                )
        return pool

    async def check_processes(self, pool: DevicePool) -> None:
        """Real GPUs that no server holds but that still run a process (one that outlived
        its server, or was never gputap's) are not handed out until it ends: asked of NVML
        before each start (in an executor: NVML blocks)."""
        if pool.simulated:
            return
        loop = asyncio.get_running_loop()
        busy = await loop.run_in_executor(None, nvml_busy, pool.unheld())
        for device_uuid, pids in pool.mark_busy(busy).items():
            log.warning(
                "device %s is free but runs processes %s: not handed out until they end",
                device_uuid,
                ",".join(map(str, pids)),
            )

    def catalog(self, base: Catalog) -> Catalog:
        """``base`` plus the cards of GPUs it does not know (unpriced until an operator
        prices them)."""
        if not self.discovered:
            return base
        key = (id(base), tuple(sorted(self.discovered)))
        if key not in self._with_discovered:
            self._with_discovered.clear()  # one reading's cards at a time
            self._with_discovered[key] = base.with_cards(self.discovered.values())
        return self._with_discovered[key]

    # -- taking and giving back (the Machine protocol) ---------------------------------------

    def take(self, placement: Placement, record: ServerRecord, holder: str) -> None:
        pool = self._read_pool()
        record.devices = tuple(d.uuid for d in pool.take(placement, holder))
        record.simulated = pool.simulated

    def release(self, record: ServerRecord, holder: str) -> None:
        if self._pool is not None:
            self._pool.release(holder)

    def keep_held(self, holder: str, name: str) -> None:
        """A process that never died may still use its GPUs: they stay held, as ``name``."""
        if self._pool is not None:
            self._pool.rename(holder, name)

    def claim(self, record: ServerRecord, holder: str) -> None:
        if self._pool is None:
            self._pending[holder] = list(record.devices)
            return
        for device_uuid in self._pool.claim(record.devices, holder):
            log.warning("%s: device %s is gone or taken", holder, device_uuid)

    def queue_view(self) -> FreeView:
        return self._pool.free_view() if self._pool is not None else FreeView()

    def _read_pool(self) -> DevicePool:
        if self._pool is None:
            raise RuntimeError("devices are taken only after the pool was read (views first)")
        return self._pool


_machines: dict[tuple[str, str], LocalMachine] = {}


def local_machine(source: DeviceSource) -> LocalMachine:
    """This process's machine for ``source``'s inventory (mode and file)."""
    key = (source.inventory, source.inventory_file)
    machine = _machines.get(key)
    if machine is None:
        machine = _machines[key] = LocalMachine(source)
    return machine


async def start_health_watch(
    desk: faults.FaultDesk, source: DeviceSource, catalog: Catalog
) -> None:
    """At hub start (spawner/lifecycle/faults.py): the device pool and the watcher of its
    GPUs' health (NVML, or the simulated inventory's faults)."""
    pool = await local_machine(source).pool(catalog)
    watcher = LocalHealthWatcher(
        report=desk.report,
        drain=desk.auto_drain,
        mode="file" if pool.simulated else source.inventory,
        inventory_file=source.inventory_file,
        catalog=catalog,
        exclude=list(source.exclude),
        node=pool.node,
        poll_seconds=float(desk.settings["poll_seconds"]),
        ignore_xids=set(desk.settings["ignore_xids"]),
    )
    watcher.start()
    desk.watchers.append(watcher)
