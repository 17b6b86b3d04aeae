"""What exists and what is free on one machine: NVML devices or a declared simulated inventory.

``nvml_devices`` reads real GPUs and MIG devices (blocking: call it in an executor);
``file_devices`` reads a YAML file of simulated cards for machines without GPUs. A
:class:`DevicePool` tracks which device UUIDs each server holds, so two servers never share one,
and (``nvml_busy``) which free devices still run a process no server holds, so that none is
handed out while a process of someone before still runs on it.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pynvml
import yaml

from ..core.catalog import Card, Catalog, discovered_card, offering_key
from ..core.placement import FreeView, Placement
from . import nvml

log = logging.getLogger(__name__)

SIMULATED_NAMESPACE = uuid.UUID("6f1d3a52-8c1e-4d3b-9a57-0c2f6f0e7a10")
_MIG_NAME_RE = re.compile(r"MIG\s+(\d+g\.\d+gb)")


class InventoryUnavailable(RuntimeError):
    """NVML is missing or sees no GPU."""


@dataclass(frozen=True)
class Device:
    """One schedulable device: a whole GPU or a MIG device, by UUID."""

    uuid: str
    card: str
    profile: str | None
    gpu_index: int
    memory_mib: int
    simulated: bool = False
    #: False for a GPU the catalog does not know: its card is ``discovered_card(product, …)``
    known: bool = True
    #: the name NVML gives the GPU ("" for simulated cards)
    product: str = ""

    @property
    def key(self) -> str:
        return offering_key(self.card, self.profile)


def nvml_devices(catalog: Catalog, exclude: Iterable[str] = ()) -> list[Device]:
    """Whole GPUs (MIG off) and MIG devices (MIG on) from NVML. Blocking.

    Each GPU is read on its own: one that fails any call is left out with a warning and the
    rest of the machine is served. ``exclude`` keeps GPUs (UUID or index) or MIG devices
    (UUID) out of gputap. Raises :class:`InventoryUnavailable` only when NVML cannot be used
    or counts no GPU at all; GPUs it counts but cannot serve give an empty list, never
    simulated cards."""
    try:
        with nvml.session():
            count = pynvml.nvmlDeviceGetCount()
            if count == 0:
                raise InventoryUnavailable("NVML found no GPU")
            kept_out = set(exclude)
            devices: list[Device] = []
            for index in range(count):
                devices += _gpu_devices(index, catalog, kept_out)
    except nvml.Unavailable as e:
        raise InventoryUnavailable(str(e)) from None
    for entry in sorted(kept_out):
        log.warning("spawner.exclude_gpus: %s is no GPU or MIG device here", entry)
    if not devices:
        log.warning("NVML found %d GPU(s) but none gputap can serve: CPU-only servers only", count)
    return devices


def _gpu_devices(index: int, catalog: Catalog, kept_out: set[str]) -> list[Device]:
    """The devices of GPU ``index``; [] with a warning when any call for it fails.
    Removes from ``kept_out`` the entries that named it or its MIG devices."""
    where = f"GPU {index}"
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        gpu_uuid = nvml.text(pynvml.nvmlDeviceGetUUID(handle))
        where = f"GPU {index} ({gpu_uuid})"
        named = {str(index), gpu_uuid} & kept_out
        if named:
            kept_out -= named
            log.info("%s kept out of gputap by spawner.exclude_gpus", where)
            return []
        name = nvml.text(pynvml.nvmlDeviceGetName(handle))
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20
        modes = nvml.mig_modes(handle)
        if modes is not None and modes[0] != modes[1]:
            log.warning(
                "%s: MIG mode %s now, %s after the next GPU reset; serving it as it is now",
                where,
                *("on" if m else "off" for m in modes),
            )
        card = _card(catalog, name, memory, where)
        if modes is None or not modes[0]:
            return [Device(gpu_uuid, card.sku, None, index, memory, known=card.known, product=name)]
        if not card.known:
            log.warning("%s: MIG devices of a card the catalog does not know are left out", where)
            return []
        return _mig_devices(handle, index, card, where, kept_out)
    except nvml.DEVICE_ERRORS as e:
        # NVML still counts a GPU that fell off the bus or that we may not open
        log.warning("%s: %s; left out, the other GPUs are served", where, e)
        return []


def _card(catalog: Catalog, name: str, memory_mib: int, where: str) -> Card:
    card = catalog.card_for_product(name)
    if card is not None:
        return card
    card = discovered_card(name, memory_mib)
    log.warning(
        "%s: %s is not in the catalog: offered as %s (%g GB, TFLOPS unknown), unpriced until "
        "billing.prices prices %s; catalog.cards.%s can give its facts",
        where,
        name,
        card.sku,
        card.memory_gb,
        card.sku,
        card.sku,
    )
    return card


def _mig_devices(handle, index: int, card: Card, where: str, kept_out: set[str]) -> list[Device]:
    devices = []
    for mig in nvml.mig_handles(handle):
        mig_uuid = nvml.text(pynvml.nvmlDeviceGetUUID(mig))
        if mig_uuid in kept_out:
            kept_out.discard(mig_uuid)
            log.info("%s: MIG device %s kept out by spawner.exclude_gpus", where, mig_uuid)
            continue
        match = _MIG_NAME_RE.search(nvml.text(pynvml.nvmlDeviceGetName(mig)))
        if not match or card.profile(match[1]) is None:
            log.warning("%s: MIG device %s has an unknown profile; left out", where, mig_uuid)
            continue
        memory = pynvml.nvmlDeviceGetMemoryInfo(mig).total // 2**20
        devices.append(Device(mig_uuid, card.sku, match[1], index, memory, product=card.name))
    return devices


def nvml_busy(uuids: Iterable[str]) -> dict[str, list[int]]:
    """The devices among ``uuids`` that NVML sees compute processes on: UUID -> their pids.
    Blocking. A device NVML cannot answer for counts as idle (it was listed at start)."""
    busy: dict[str, list[int]] = {}
    try:
        with nvml.session():
            for device_uuid in uuids:
                try:
                    pids = nvml.compute_pids(pynvml.nvmlDeviceGetHandleByUUID(device_uuid))
                except nvml.DEVICE_ERRORS as e:
                    log.warning("device %s not checked for processes: %s", device_uuid, e)
                    continue
                if pids:
                    busy[device_uuid] = pids
    except nvml.Unavailable as e:
        log.warning("%s: devices not checked for processes", e)
    return busy


@dataclass(frozen=True)
class SimulatedGpu:
    """One card of a simulated inventory file: where it is in the file, its made-up UUID,
    the devices it offers (itself, or its MIG devices in ``mig`` order) and the ``fault``
    entry it declares (the health watcher's business, spawner/local/health.py), if any."""

    index: int
    uuid: str
    devices: tuple[Device, ...]
    fault: object = None


def simulated_uuid(node: str, index: int, slot: int | None = None) -> str:
    """The stable UUID of simulated GPU ``index`` on ``node``, or of its MIG device in
    ``slot`` (the place in the card's ``mig`` list)."""
    if slot is None:
        return "GPU-" + str(uuid.uuid5(SIMULATED_NAMESPACE, f"{node}/{index}"))
    return "MIG-" + str(uuid.uuid5(SIMULATED_NAMESPACE, f"{node}/{index}/{slot}"))


def file_node(path: str | Path) -> str | None:
    """The ``node:`` the simulated inventory names, or None."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    node = data.get("node") if isinstance(data, dict) else None
    return str(node) if node else None


def file_gpus(path: str | Path, catalog: Catalog) -> list[SimulatedGpu]:
    """The cards declared in a YAML file (see hub_config/simulated-inventory.yaml)."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    gpus = data.get("gpus")
    if not isinstance(gpus, list):
        raise ValueError(f"{path}: 'gpus' must be a list of {{card: SKU, mig: [profiles]}}")
    node = str(data.get("node") or "localhost")
    found: list[SimulatedGpu] = []
    for index, gpu in enumerate(gpus):
        card = catalog.card(str(gpu.get("card")))
        gpu_uuid = simulated_uuid(node, index)
        profiles = gpu.get("mig") or []
        if not profiles:
            memory = int(card.memory_gb * 1024)
            device = Device(gpu_uuid, card.sku, None, index, memory, simulated=True)
            found.append(SimulatedGpu(index, gpu_uuid, (device,), gpu.get("fault")))
            continue
        counts = Counter(profiles)
        used = 0
        for name, n in counts.items():
            profile = card.profile(name)
            if profile is None:
                raise ValueError(f"{path}: GPU {index} ({card.sku}) has no MIG profile {name}")
            if n > profile.max_instances:
                raise ValueError(
                    f"{path}: GPU {index}: at most {profile.max_instances}× {name}, not {n}"
                )
            used += profile.compute_slices * n
        if used > card.mig_slices:
            raise ValueError(
                f"{path}: GPU {index}: MIG slices need {used} of {card.mig_slices} compute slices"
            )
        devices = tuple(
            Device(
                simulated_uuid(node, index, slot),
                card.sku,
                name,
                index,
                card.profile(name).memory_gb * 1024,
                simulated=True,
            )
            for slot, name in enumerate(profiles)
        )
        found.append(SimulatedGpu(index, gpu_uuid, devices, gpu.get("fault")))
    return found


def file_devices(path: str | Path, catalog: Catalog) -> list[Device]:
    """Simulated devices declared in a YAML file (see hub_config/simulated-inventory.yaml).
    A card's ``fault`` entry does not change what it offers: faults are the health
    watcher's, and keep a device out only once reported."""
    return [device for gpu in file_gpus(path, catalog) for device in gpu.devices]


def load_local_devices(
    mode: str, inventory_file: str | Path, catalog: Catalog, exclude: Iterable[str] = ()
) -> list[Device]:
    """``mode`` auto: NVML when it can be used and counts a GPU, else the simulated file;
    nvml; or file. ``exclude``: GPUs kept out of gputap (see :func:`nvml_devices`)."""
    if mode in ("auto", "nvml"):
        try:
            return nvml_devices(catalog, exclude)
        except InventoryUnavailable as e:
            if mode == "nvml":
                raise
            log.info("%s; using simulated inventory %s", e, inventory_file)
    elif mode != "file":
        raise ValueError(f"spawner.inventory must be auto, nvml or file, not {mode!r}")
    return file_devices(inventory_file, catalog)


class DevicePool:
    """Devices of one machine and which server holds each. Synchronous, so one asyncio
    step places and takes devices with no await in between: two spawns never share one."""

    def __init__(self, devices: Iterable[Device], node: str = "localhost"):
        self.node = node
        self.devices: dict[str, Device] = {d.uuid: d for d in devices}
        self.holder: dict[str, str] = {}
        #: free devices that still run processes (pids), counted as taken until they end
        self.busy: dict[str, list[int]] = {}
        #: devices out of service (UUID -> faulty or drained): neither free nor in the total,
        #: kept by UUID across readings (a lost GPU NVML no longer lists stays out)
        self.out: dict[str, str] = {}

    @property
    def simulated(self) -> bool:
        return any(d.simulated for d in self.devices.values())

    def update(self, devices: Iterable[Device]) -> tuple[list[str], list[str]]:
        """Take a new reading of the machine: (UUIDs added, UUIDs gone). A device that is
        gone is never offered again; a server holding it keeps it until it releases it."""
        new = {d.uuid: d for d in devices}
        added = [u for u in new if u not in self.devices]
        gone = [u for u in self.devices if u not in new]
        self.devices = new
        self.busy = {u: pids for u, pids in self.busy.items() if u in new}
        return added, gone

    def unheld(self) -> list[str]:
        """UUIDs no server holds."""
        return [u for u in self.devices if u not in self.holder]

    def mark_busy(self, busy: dict[str, list[int]]) -> dict[str, list[int]]:
        """Set which unheld devices still run processes (``nvml_busy`` of :meth:`unheld`);
        the devices newly found busy."""
        busy = {u: pids for u, pids in busy.items() if u in self.devices and u not in self.holder}
        new = {u: pids for u, pids in busy.items() if self.busy.get(u) != pids}
        self.busy = busy
        return new

    def set_out(self, uuids: Iterable[str], why: str) -> None:
        """Take devices out of service (``why``: faulty or drained); a server holding one
        keeps it until it releases it (the fault desk moves it)."""
        for device_uuid in uuids:
            self.out[device_uuid] = why

    def set_in(self, uuids: Iterable[str]) -> None:
        """Return devices to service (an admin's return)."""
        for device_uuid in uuids:
            self.out.pop(device_uuid, None)

    def _takeable(self, device: Device, as_free: str | None = None) -> bool:
        if device.uuid in self.out:
            return False
        if device.uuid in self.holder:
            return self.holder[device.uuid] == as_free
        return device.uuid not in self.busy

    def free_view(self, as_free: str | None = None) -> FreeView:
        """Free and total devices per offering; ``as_free`` names a holder whose devices
        count as free (what a server could take if it stopped first). Devices out of service
        count in the total, never as free: the machine still has them, and a start that
        wants one waits in line for its return rather than being told none exists."""
        capacity: Counter[str] = Counter(d.key for d in self.devices.values())
        free: Counter[str] = Counter(
            d.key for d in self.devices.values() if self._takeable(d, as_free)
        )
        view = FreeView()
        for key, total in capacity.items():
            view.set(key, self.node, free[key], total)
        return view

    def take(self, placement: Placement, holder: str) -> list[Device]:
        """Take the devices for a placement made from :meth:`free_view`."""
        if placement.offering.kind == "cpu":
            return []
        free = sorted(
            (
                d
                for d in self.devices.values()
                if d.key == placement.offering.key and self._takeable(d)
            ),
            key=lambda d: (d.gpu_index, d.uuid),
        )
        if len(free) < placement.count:
            raise RuntimeError(
                f"{placement.offering.key}: {len(free)} free, {placement.count} asked"
            )
        chosen = free[: placement.count]
        for device in chosen:
            self.holder[device.uuid] = holder
        return chosen

    def claim(self, uuids: Iterable[str], holder: str) -> list[str]:
        """Mark devices held again (a server re-attached after a hub restart).

        Returns the UUIDs that no longer exist or that another server holds."""
        problems = []
        for device_uuid in uuids:
            if device_uuid not in self.devices or self.holder.get(device_uuid, holder) != holder:
                problems.append(device_uuid)
            else:
                self.holder[device_uuid] = holder
        return problems

    def rename(self, holder: str, new_holder: str) -> None:
        """Keep a holder's devices taken under another name (a process that never died)."""
        for device_uuid, name in self.holder.items():
            if name == holder:
                self.holder[device_uuid] = new_holder

    def release(self, holder: str) -> list[str]:
        released = [u for u, h in self.holder.items() if h == holder]
        for device_uuid in released:
            del self.holder[device_uuid]
        return released

    def held_by(self) -> dict[str, list[str]]:
        result: dict[str, list[str]] = defaultdict(list)
        for device_uuid, holder in self.holder.items():
            result[holder].append(device_uuid)
        return dict(result)
