"""The fault desk: what the hub does when a GPU fails (docs/gpu-faults.md).

One desk per hub. A watcher (spawner/local/health.py, spawner/kube/health.py) or a server's
own report hands it a :class:`~spawner.core.health.Fault` on the event loop; the desk then,
in the same loop step, records it in the book and takes the devices (or the node) out of
the free pool, so no placement after that step can land on them; saves the book
(``{data_dir}/gpu-health.json``); and asks for the recovery of every server on them.

A recovery runs in a hub request handler, as a change of GPU does, so its stop and its start
go through JupyterHub's own machinery: the desk posts ``admin/gpu-faults/{id}/recover`` to the
hub's API with the token of the ``gputap-health`` service. There (:func:`recover`) billing
closes the server's session at the detection second, the server is told why (Lab shows it),
stopped after ``save_grace_seconds``, and started again with its options, its files, disks
and environment, first in line when nothing is free.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from tornado.httpclient import AsyncHTTPClient, HTTPRequest

from gputap_common import clock, labels
from gputap_common.names import server_label, user_of

from ..core.health import DRAINED, FAULTY, BookError, DeviceHealth, Fault, HealthBook
from . import placing
from .machine import ClusterDevices, HealthWatch, LocalDevices, ReportingServer

log = logging.getLogger("gputap.faults")

#: the hub's API path the desk posts each recovery to (spawner/api/gpus.py)
RECOVER_PATH = "gputap/api/admin/gpu-faults/{id}/recover"
#: the JupyterHub service whose token the desk posts with
HEALTH_SERVICE = "gputap-health"
#: the window of a user's daily cap on their servers' own fault reports
REPORT_WINDOW = timedelta(days=1)

_desk: FaultDesk | None = None


def setup(
    settings: dict[str, Any],
    data_dir: Path,
    token: str,
    start: Callable[[FaultDesk], Awaitable[None]] | None = None,
    api_url: str | None = None,
) -> FaultDesk | None:
    """Make this hub's desk (none when ``faults.enabled`` is false) and, inside the running
    hub (JupyterHub loads its config in its event loop), ``start`` its watchers at once, so
    a fault on a free GPU is seen before any spawn asks for one."""
    if not settings["enabled"]:
        install(None)
        return None
    made = FaultDesk(data_dir / "gpu-health.json", settings, token)
    made.api_url = api_url
    install(made)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # the config read outside a hub (a check of it): nothing watches
        return made
    if start is not None:
        loop.call_soon(lambda: made._spawn(_started(start, made)))
    loop.call_soon(lambda: made._spawn(made.resume_unfinished()))
    return made


async def _started(start: Callable[[FaultDesk], Awaitable[None]], made: FaultDesk) -> None:
    try:
        await start(made)
    except Exception:
        log.exception("GPU health watch did not start; GPU faults are not watched")


def desk() -> FaultDesk | None:
    """This hub's desk (None: faults are not watched)."""
    return _desk


def install(desk_: FaultDesk | None) -> None:
    global _desk
    if _desk is not None:
        _desk.stop()
    _desk = desk_


class FaultDesk:
    """Records faults, isolates devices, and asks for recoveries. Synchronous where it
    isolates (one loop step), asynchronous where it talks to the hub."""

    def __init__(self, path: Path, settings: dict[str, Any], token: str):
        self.path = Path(path)
        self.settings = settings
        self.token = token
        self.book = self._load()
        #: local device pools to keep in step with the book (spawner/local/machine.py)
        self.pools: list[LocalDevices] = []
        #: the Kubernetes cluster watcher, once it runs (spawner/kube/machine.py)
        self.cluster: ClusterDevices | None = None
        #: the hub's API URL and how to find a server's holder, learned from spawners
        self.api_url: str | None = None
        self.watchers: list[HealthWatch] = []
        self._tasks: set[asyncio.Task] = set()
        self._saving: asyncio.Task | None = None
        #: servers being recovered ("user/name"), so one fault is acted on once per server
        self.recovering: dict[str, str] = {}

    # -- the book ---------------------------------------------------------------------------

    def _load(self) -> HealthBook:
        history = int(self.settings.get("history", 1000))
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return HealthBook(history)
        except (OSError, ValueError) as e:
            # kept aside, never overwritten: an admin may read it; the pool starts healthy
            aside = self.path.with_suffix(f".unreadable-{int(clock.utcnow().timestamp())}")
            log.error("GPU health file %s unreadable (%s): kept as %s", self.path, e, aside)
            self.path.rename(aside)
            return HealthBook(history)
        return HealthBook.from_json(data, history)

    def _write(self, text: str) -> None:
        temporary = self.path.with_suffix(".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, self.path)

    def save(self) -> None:
        """Write the book (in an executor when a loop runs), the newest state last."""
        text = json.dumps(self.book.to_json(), indent=1)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write(text)
            return
        previous = self._saving

        async def write() -> None:
            if previous is not None:
                await asyncio.shield(previous)
            await loop.run_in_executor(None, self._write, text)

        self._saving = self._spawn(write())

    async def saved(self) -> None:
        if self._saving is not None:
            await asyncio.shield(self._saving)

    # -- isolation -----------------------------------------------------------------------

    def add_pool(self, pool: LocalDevices) -> None:
        """A local device pool: devices the book holds out are out of it from now on."""
        self.pools.append(pool)
        pool.set_out([d for d, state in self.book.out().items() if state == FAULTY], FAULTY)
        pool.set_out([d for d, state in self.book.out().items() if state == DRAINED], DRAINED)

    def add_cluster(self, watcher: ClusterDevices) -> None:
        """The Kubernetes cluster watcher (its health watch is in :attr:`watchers`): nodes
        and units the book holds out stay out."""
        self.cluster = watcher
        inventory = watcher.inventory
        for device, entry in self.book.devices.items():
            node, resource = self._target(device)
            if resource is None:
                inventory.close(node)
            else:
                inventory.hold_out(node, resource, self._units(device, entry.fault))

    def _isolate(self, fault: Fault, newly: list[str], held_already: bool = False) -> None:
        """Out of the pool at once; ``held_already``: drained devices, whose units the
        cluster inventory holds out already."""
        for pool in self.pools:
            pool.set_out([d for d in newly if d in pool.devices or d in pool.out], FAULTY)
            # a lost GPU may already be gone from the reading: keep it out by UUID anyway
            pool.set_out([d for d in newly if not d.startswith("node:")], FAULTY)
        if self.cluster is not None:
            inventory = self.cluster.inventory
            if fault.whole_node:
                inventory.close(fault.node)
            elif fault.resource and not held_already:
                # 0: a pod naming a unit the node's allocatable drop already held out
                inventory.hold_out(fault.node, fault.resource, fault.units)

    def report(self, fault: Fault) -> None:
        """A watcher's finding, on the loop: recorded, isolated in this step, saved, and each
        server on it recovered. A device already faulty is not acted on twice."""
        drained = {d for d in fault.devices if self.book.state(d) == DRAINED}
        newly = self.book.fault(self._named(fault))
        if not newly:
            log.info("GPU fault %s on %s: already out of service", fault.detail, fault.node)
            return
        self._isolate(fault, newly, held_already=bool(newly) and set(newly) <= drained)
        log.warning(
            "GPU fault %s: %s on %s (%s), seen by %s: out of service: %s",
            fault.id,
            fault.detail,
            fault.node,
            fault.kind,
            fault.source,
            ", ".join(newly),
        )
        for label in self.affected(fault):
            self.book.note_outcome(fault.id, label, outcome="stopping")
            self._spawn(self._ask_recovery(fault, {"server": label}))
        for label, worker in self.affected_workers(fault):
            self._spawn(self._ask_recovery(fault, {"server": label, "worker": worker}))
        self.save()
        for pool in self.pools:
            self._wake(pool)

    def _named(self, fault: Fault) -> Fault:
        """Kubernetes: a pod naming a device whose unit a node's allocatable drop already
        held out (``units`` 0) takes over that unnamed hold, so an admin returns one entry,
        the device, not two. What is held out does not change."""
        if not (fault.resource and fault.devices and fault.units == 0):
            return fault
        if any(device in self.book.devices for device in fault.devices):
            return fault  # already held as that device: nothing to take over
        prefix = f"{fault.node}/{fault.resource}@"
        for device, entry in list(self.book.devices.items()):
            held = self.book.find(entry.fault) if entry.fault else None
            if device.startswith(prefix) and held is not None and held.units == 1:
                del self.book.devices[device]
                return replace(fault, units=1)
        return fault

    def _wake(self, pool: LocalDevices) -> None:
        """Waiting spawns see what the pool now offers (the line's heads may no longer fit)."""
        placing.queues.poke(pool.free_view())

    def affected(self, fault: Fault) -> list[str]:
        """The servers ("user/name") whose devices the fault hit (workers are stopped by their
        servers' groups)."""
        servers: set[str] = set()
        devices = set(fault.devices)
        for pool in self.pools:
            for device, holder in pool.holder.items():
                if device in devices and "#" not in holder and " (pid " not in holder:
                    servers.add(holder)
        if self.cluster is not None:
            servers.update(self._pods_hit(fault))
        return sorted(servers)

    def _pods_hit(self, fault: Fault) -> list[str]:
        """Kubernetes: the gputap servers a fault hits: every one on a node gone bad, and the
        pods the fault names (their allocatedResourcesStatus, or their own report). An
        allocatable drop alone names no pod: the server's Lab extension reports its own."""
        found = []
        for pod in self.cluster.pods:
            meta = pod["metadata"]
            notes = meta.get("annotations") or {}
            if labels.USER not in notes or labels.WORKER in notes:
                continue
            if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in (
                "Succeeded",
                "Failed",
            ):
                continue
            key = f"{meta.get('namespace', '')}/{meta['name']}"
            on_node = (pod.get("spec") or {}).get("nodeName") == fault.node
            if (fault.whole_node and on_node) or key in fault.pods:
                found.append(server_label(notes[labels.USER], notes.get(labels.SERVER) or ""))
        return found

    def affected_workers(self, fault: Fault) -> list[tuple[str, str]]:
        """Workers on the fault's devices: (server label, worker name)."""
        found = []
        for pool in self.pools:
            for device, holder in pool.holder.items():
                if device in fault.devices and "#" in holder:
                    server, worker = holder.split("#", 1)
                    found.append((server, worker))
        return found

    # -- drain and return ------------------------------------------------------------------

    def auto_drain(self, device: str, note: str) -> None:
        """A watcher's drain (a GPU that needs a reset): new servers go elsewhere."""
        if self.book.state(device) == "healthy":
            self.book.drain(device, clock.utcnow(), note)
            self._apply_state(device, DRAINED)
            log.warning("GPU %s drained: %s", device, note)
            self.save()

    def drain(self, device: str, note: str = "") -> DeviceHealth:
        was = self.book.state(device)
        entry = self.book.drain(device, clock.utcnow(), note)
        if was != DRAINED:  # drained again: a new note, nothing more held out
            self._apply_state(device, DRAINED)
        log.warning("GPU %s drained by an admin%s", device, f": {note}" if note else "")
        self.save()
        return entry

    def give_back(self, device: str, why_not: str | None = None) -> DeviceHealth | None:
        """Return ``device`` to service; :class:`BookError` (409) when the cause still
        shows (``why_not``) or a server it failed under is still stopping. A server waiting
        in line for its like (the machine's only card of that kind faulted) may take it
        back: that is how its recovery ends."""
        if why_not:
            raise BookError(why_not)
        entry = self.book.devices.get(device)
        if entry is None:
            raise BookError(f"{device} is in service already")
        fault = self.book.find(entry.fault) if entry.fault else None
        together = [device]
        if fault is not None:
            # what one fault took out comes back at once: a card's fault took all its slices
            together = sorted(d for d, e in self.book.devices.items() if e.fault == fault.id)
            busy = [
                o["server"]
                for o in self.book.outcomes.get(fault.id, [])
                if o.get("outcome") == "stopping"
            ]
            if busy:
                raise BookError(
                    f"{device}: {', '.join(busy)} still stopping from it; return it once "
                    "they stopped"
                )
        for each in together:
            self._apply_state(each, None)  # first: it reads the entry's units
            self.book.give_back(each)
            for watcher in self.watchers:
                forget = getattr(watcher, "forget", None)
                if forget is not None:
                    forget(each)
        log.warning("GPU %s returned to service by an admin", ", ".join(together))
        self.save()
        for pool in self.pools:
            self._wake(pool)
        if self.cluster is not None:
            placing.queues.poke(self.cluster.inventory.preemptible_view)
        return entry

    def _apply_state(self, device: str, state: str | None) -> None:
        for pool in self.pools:
            if state is None:
                pool.set_in([device])
            else:
                pool.set_out([device], state)
        if self.cluster is not None:
            node, resource = self._target(device)
            inventory = self.cluster.inventory
            if resource is None:
                (inventory.reopen if state is None else inventory.close)(node)
            else:
                entry = self.book.devices.get(device)
                units = self._units(device, entry.fault if entry else None)
                if state is None:
                    inventory.give_back(node, resource, units)
                elif entry is None or entry.state == DRAINED:
                    inventory.hold_out(node, resource, units)

    def _target(self, device: str) -> tuple[str, str | None]:
        """A Kubernetes book entry's node and resource (None: the whole node); the
        resource is the fault's, where it named one."""
        node, resource = _kube_target(device)
        entry = self.book.devices.get(device)
        fault = self.book.find(entry.fault) if entry and entry.fault else None
        if resource is not None and fault is not None and fault.resource:
            resource = fault.resource
        return node, resource

    def _units(self, device: str, fault_id: str | None) -> int:
        """Units a Kubernetes book entry holds out: a device one, a node's lost units as its
        fault counted them (0: a unit another fault of the same device holds)."""
        fault = self.book.find(fault_id) if fault_id else None
        if fault is None:
            return 1
        return fault.units if "@" in device or fault.units == 0 else 1

    def knows(self, device: str) -> bool:
        """Whether ``device`` is one the admin API may drain or return."""
        if device in self.book.devices or any(device in p.devices for p in self.pools):
            return True
        if self.cluster is not None:
            node, _ = self._target(device)
            return node in self.cluster.inventory.nodes
        return False

    async def still_broken(self, device: str) -> str | None:
        """Why ``device`` cannot be returned yet (its cause still shows), or None."""
        for watcher in self.watchers:
            why = watcher.still_broken(device)
            if asyncio.iscoroutine(why):
                why = await why
            if why:
                return why
        return None

    def cluster_nodes(self) -> list[dict[str, Any]]:
        """Kubernetes nodes with GPUs: their state, units and what health agents say."""
        inventory = self.cluster.inventory
        nodes = []
        for name in sorted(inventory.nodes):
            held = inventory.held_out.get(name, {})
            state = self.book.state(f"node:{name}")
            node = inventory.nodes[name]
            gpus = {
                resource: {
                    "offering": key,
                    "capacity": node.capacity.get(resource, allocatable),
                    "allocatable": allocatable,
                    "held_out": held.get(resource, 0),
                }
                for key, (resource, allocatable) in node.resources.items()
            }
            nodes.append(
                {
                    "name": name,
                    "id": f"node:{name}",
                    "gpus": gpus,
                    "state": state,
                    "held_out": {resource: n for resource, n in held.items() if n},
                    "closed": name in inventory.closed,
                }
            )
        return nodes

    def server_report(
        self,
        label: str,
        spawner: ReportingServer,
        device: str,
        kind: str,
        detail: str,
        at: datetime,
    ) -> bool:
        """A server's own report of a failing device. One machine: nothing is acted on (the
        hub reads NVML itself every ``poll_seconds``). Kubernetes: trusted for the server's
        own devices, at most as many as it holds, and none while it is being moved (a user
        can only move their own server; the unit held out is listed with source lab for an
        admin to return). True when acted on; :class:`BookError` (409) when refused."""
        if self.cluster is None:
            return False
        if label in self.recovering:
            raise BookError(f"{label} is already being moved off a failed GPU; wait for it")
        user = user_of(label)
        cap = int(self.settings["max_reports_per_user_per_day"])
        if cap == 0:
            raise BookError(
                "Servers' own GPU fault reports are off here "
                "(faults.max_reports_per_user_per_day: 0); tell an admin which GPU fails"
            )
        if self.book.reports_by(user, at, REPORT_WINDOW) >= cap:
            raise BookError(
                f"{user}'s servers already reported {cap} GPUs as failing in the last 24 "
                "hours; an admin looks at them (admin/gpu-faults) before more are taken out"
            )
        node = spawner.node_of_pod()
        record = spawner.record
        if not node or record is None:
            return False
        reported = [
            f for f in self.book.faults
            if f.source == "lab" and f.pods == (spawner.pod_key,)
            and any(self.book.state(d) == FAULTY for d in f.devices)
        ]  # fmt: skip
        if len(reported) >= record.count:
            raise BookError(
                f"{label} already reported its {record.count} GPU(s) as failing; an admin "
                "returns them once they are repaired"
            )
        resource = self.cluster.inventory.resource_of(node, record.offering)
        words = detail or {"lost": "GPU lost", "ecc": "uncorrected ECC errors"}.get(kind, kind)
        fault = Fault(
            kind="reported",
            detail=f"{words} (reported by the server on {device})",
            source="lab",
            node=node,
            devices=(f"{node}/{device}",),
            detected_at=at,
            resource=resource,
            units=1,
            pods=(spawner.pod_key,),
        )
        self.report(fault)
        # who reported it, for the user's daily cap (kept in the book across hub restarts)
        self.book.note_outcome(fault.id, label, reported=True)
        self.save()
        return True

    # -- recovery --------------------------------------------------------------------------

    def unfinished(self) -> list[tuple[Fault, str]]:
        """Recoveries a hub restart cut short: (fault, server) stopping or waiting."""
        found = []
        for fault in self.book.faults:
            for entry in self.book.outcomes.get(fault.id, []):
                if entry.get("outcome") in ("stopping", "waiting") and "#" not in entry["server"]:
                    found.append((fault, entry["server"]))
        return found

    async def resume_unfinished(self, wait_seconds: float = 120) -> None:
        """At hub start: ask again for each recovery the last hub left unfinished, once the
        hub's API answers (it starts listening after the config that made this desk)."""
        pending = self.unfinished()
        if not pending:
            return
        log.warning("GPU faults: %d recoveries unfinished at the last hub's end", len(pending))
        deadline = asyncio.get_running_loop().time() + wait_seconds
        while pending and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(1)
            still = []
            for fault, label in pending:
                body = {"server": label, "resume": True}
                if not await self._ask_recovery(fault, body, quiet=True):
                    still.append((fault, label))
            pending = still
        for fault, label in pending:
            log.error("%s: recovery from GPU fault %s not resumed: the hub's API did not "
                      "answer", label, fault.id)  # fmt: skip

    async def _ask_recovery(self, fault: Fault, body: dict[str, Any], quiet: bool = False) -> bool:
        """Post the recovery of ``body``'s server (or its worker) to the hub's API (it runs
        in a request handler there)."""
        label = body["server"] + (f"#{body['worker']}" if "worker" in body else "")
        if self.api_url is None:
            log.error(
                "%s: GPU fault %s: the hub's API is not known; not recovered", label, fault.id
            )
            return False
        # JupyterHub's API is {base}hub/api; gputap's handlers are under {base}hub/
        hub_url = self.api_url.rstrip("/").removesuffix("/api")
        url = f"{hub_url}/{RECOVER_PATH.format(id=fault.id)}"
        request = HTTPRequest(
            url,
            method="POST",
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=json.dumps(body),
            request_timeout=30,
        )
        client = AsyncHTTPClient(force_instance=True)
        try:
            await client.fetch(request)
        except Exception as e:
            if quiet:  # the hub is still starting: asked again
                return False
            log.error("%s: GPU fault %s: recovery not started: %s", label, fault.id, e)
            self.book.note_outcome(fault.id, label, outcome="failed", why=str(e))
            self.save()
            return False
        finally:
            client.close()
        return True

    def restart_refusal(self, label: str, now: datetime) -> str | None:
        """Why the server is not started again (restart off, the limit reached), or None."""
        if self.settings["restart"] == "off":
            return "the operator turned restarts after GPU faults off"
        limit = int(self.settings["max_restarts"])
        if limit == 0:
            return "the operator turned restarts after GPU faults off (faults.max_restarts: 0)"
        seconds = int(self.settings["restart_window_seconds"])
        if self.book.restarts_within(label, timedelta(seconds=seconds), now) >= limit:
            span = "day" if seconds == 86400 else f"{seconds // 3600 or 1} h"
            return f"it was already restarted {limit} times after GPU faults in the last {span}"
        return None

    def stop(self) -> None:
        for watcher in self.watchers:
            stopping = watcher.stop() if hasattr(watcher, "stop") else None
            if asyncio.iscoroutine(stopping):
                self._spawn(stopping)
        self.watchers.clear()

    def _spawn(self, coroutine: Any) -> asyncio.Task:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _kube_target(device: str) -> tuple[str, str | None]:
    """A book id on Kubernetes: ``node:<name>`` (the node) or ``<node>/<resource>…``."""
    if device.startswith("node:"):
        return device.removeprefix("node:"), None
    node, _, rest = device.partition("/")
    resource = rest.split("@", 1)[0] if "@" in rest else "nvidia.com/gpu"
    return node, resource
