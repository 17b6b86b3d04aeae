"""The cluster as the hub holds it: one :class:`KubeMachine` per hub (per event loop), shared by
every server, worker and the fault desk, owned by none of them.

It holds the cluster watcher (list and watch of nodes and pods, started on first use, with
the fault desk's health watch), the reservations of GPUs placed but not yet seen bound, and
turns a placement into the pod settings that ask for it (spawner/kube/objects.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from kubernetes_asyncio.client import ApiException
from kubespawner.clients import load_config, shared_client
from tornado import web

from gputap_common import labels

from ..core.catalog import Catalog
from ..core.placement import FreeView, Placement
from ..core.record import ServerRecord
from ..lifecycle import faults, placing
from .health import KubeHealthWatcher
from .objects import gpu_pod_settings
from .placeholders import PlaceholderKeeper, placeholders_to_evict
from .watch import ClusterWatcher

log = logging.getLogger(__name__)


def reservation(holder: str, record: ServerRecord) -> str:
    """The name a start's GPUs are reserved under until the watch sees its pod bound."""
    return f"{holder}#{record.session_id}"


class KubeMachine:
    """The hub's cluster watcher and its reservations; a
    :class:`~spawner.lifecycle.machine.Machine`."""

    def __init__(self) -> None:
        self.watcher: ClusterWatcher | None = None
        self._lock = asyncio.Lock()

    async def started(
        self, catalog: Catalog, tolerations: Sequence[Any] | Mapping[str, Any] = ()
    ) -> ClusterWatcher:
        """The cluster watcher, started on first use (by a spawner, or at hub start for the
        fault desk), with the desk's health watch. ``tolerations`` are those configured for
        every server (KubeSpawner's ``tolerations``, the same for every spawner of the hub):
        a node tainted against them offers nothing (spawner.kube.inventory)."""
        async with self._lock:
            if self.watcher is None:
                watcher = ClusterWatcher(shared_client("CoreV1Api"), catalog, tolerations)
                watcher.on_change.append(
                    lambda _view: placing.queues.poke(watcher.inventory.preemptible_view)
                )
                desk = faults.desk()
                if desk is not None:
                    health = KubeHealthWatcher(
                        report=desk.report, conditions=desk.settings["node_conditions"]
                    )
                    watcher.on_event.append(health.on_event)
                    desk.watchers.append(health)
                    desk.add_cluster(watcher)
                watcher.start()
                self.watcher = watcher
        return self.watcher

    async def ready(
        self,
        catalog: Catalog,
        within_seconds: float,
        tolerations: Sequence[Any] | Mapping[str, Any] = (),
    ) -> ClusterWatcher:
        """The watcher once it has listed the cluster; 503 when that takes longer than
        ``within_seconds``."""
        watcher = await self.started(catalog, tolerations)
        try:
            async with asyncio.timeout(within_seconds):
                await watcher.ready()
        except TimeoutError:
            raise web.HTTPError(
                503,
                "The cluster's GPU inventory could not be read from the Kubernetes API; "
                "try again in a minute, and tell an operator if it persists.",
            ) from None
        return watcher

    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        """A pod as the watch last saw it, if it did."""
        for pod in self.watcher.pods if self.watcher else ():
            meta = pod["metadata"]
            if meta["name"] == name and meta.get("namespace") == namespace:
                return pod
        return None

    def ended(self, pod_key: str) -> datetime | None:
        """When the watch saw pod ``namespace/name`` end (and forget it), or None."""
        return self.watcher.ended.pop(pod_key, None) if self.watcher else None

    # -- taking and giving back (the Machine protocol) ---------------------------------------

    def take(self, placement: Placement, record: ServerRecord, holder: str) -> None:
        """Reserve the placement's GPUs on its node until the watch sees its pod bound."""
        record.node = placement.node
        if placement.offering.kind != "cpu":
            if self.watcher is None:
                raise RuntimeError("GPUs are reserved only after the cluster was read")
            self.watcher.inventory.reserve(
                reservation(holder, record), placement.offering.key, placement.node, placement.count
            )

    def release(self, record: ServerRecord, holder: str) -> None:
        if self.watcher is not None:
            self.watcher.inventory.release(reservation(holder, record))

    def claim(self, record: ServerRecord, holder: str) -> None:
        """Nothing to claim: a running pod's GPUs are counted from the pod itself."""

    def queue_view(self) -> FreeView:
        return self.watcher.inventory.preemptible_view if self.watcher else FreeView()

    # -- pods --------------------------------------------------------------------------------

    async def make_room(self, placement: Placement, log: Any) -> None:
        """Before an on-demand pod is made: delete the placeholders holding the room it was
        placed on (spawner/kube/placeholders.py). The hub does it, not the scheduler's
        preemption, which among pods of one priority (placeholders and spot servers) evicts
        the newest, a spot server as soon as a placeholder."""
        if self.watcher is None or placement.node is None:
            return
        short = self.watcher.inventory.shortfall(placement.node, placement.offering.key)
        if not short:
            return
        resource = self.watcher.inventory.resource_of(placement.node, placement.offering.key)
        for namespace, name in placeholders_to_evict(
            self.watcher.pods, placement.node, resource, short
        ):
            try:
                # its own grace period (0): the kubelet ends it at once and frees its device
                await self.watcher.api.delete_namespaced_pod(name, namespace)
            except ApiException as e:
                if e.status != 404:
                    raise
            log.info("placeholder %s/%s gives its room on %s", namespace, name, placement.node)

    async def pod_settings(
        self,
        placement: Placement,
        record: ServerRecord,
        holder: str,
        catalog: Catalog,
        username: str,
        server_name: str,
    ) -> dict[str, Any]:
        """The pod settings of a placement (a server's, or a worker's), its reservation named
        on the pod so the watch drops it once the pod is bound."""
        inventory = (await self.started(catalog)).inventory
        node = inventory.nodes.get(placement.node) if placement.node else None
        key = placement.offering.key
        settings = gpu_pod_settings(
            placement,
            catalog,
            username=username,
            session_id=record.session_id,
            server_name=server_name,
            product=node.product if node else None,
            hostname=node.hostname if node else None,
            resource=node.resources[key][0] if node and key in node.resources else None,
            room=inventory.room(placement.node) if placement.node else None,
            price_class=record.price_class,
            course=record.course,
            environment=record.environment,
        )
        settings["extra_annotations"][labels.RESERVATION] = reservation(holder, record)
        return settings


_machines: dict[asyncio.AbstractEventLoop, KubeMachine] = {}


def kube_machine() -> KubeMachine:
    """The hub's machine (one per event loop: tests run hubs side by side)."""
    loop = asyncio.get_running_loop()
    machine = _machines.get(loop)
    if machine is None:
        machine = _machines[loop] = KubeMachine()
    return machine


async def start_health_watch(
    desk: faults.FaultDesk,
    catalog: Catalog,
    api: dict[str, Any] | None = None,
    tolerations: Sequence[Any] | Mapping[str, Any] = (),
) -> None:
    """At hub start (spawner/lifecycle/faults.py): the cluster watcher, with the desk's
    health watch, so a fault on a free node is seen before any spawn. No spawner exists yet
    to load the client's configuration, so it is loaded here as KubeSpawner does (``api``:
    its k8s_api_host, k8s_api_ssl_ca_cert and k8s_api_verify_ssl, where configured;
    ``tolerations``: its configured tolerations)."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, lambda: load_config(**(api or {})))
    await kube_machine().started(catalog, tolerations)


async def keep_placeholders(
    *,
    namespace: str,
    wanted: Mapping[str, int],
    catalog: Catalog,
    priority_class: str,
    image: str,
    tolerations: Iterable[Mapping[str, Any]] = (),
    api: Mapping[str, Any] | None = None,
) -> None:
    """From the hub's start: the hub's cluster watch (shared with its spawners), then the
    keeper, woken by every change the watch sees. No spawner exists yet to load the
    client's configuration, so it is loaded here as KubeSpawner does (``api``: its
    k8s_api_host, k8s_api_ssl_ca_cert and k8s_api_verify_ssl, where configured)."""
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, lambda: load_config(**(api or {})))
    watcher = await kube_machine().started(catalog, list(tolerations))
    await watcher.ready()
    keeper = PlaceholderKeeper(
        shared_client("CoreV1Api"),
        namespace=namespace,
        wanted=wanted,
        catalog=catalog,
        nodes=lambda: watcher.inventory.nodes,
        pods=lambda: watcher.pods,
        priority_class=priority_class,
        image=image,
        tolerations=tolerations,
    )
    watcher.on_change.append(lambda _view: keeper.changed.set())
    log.info(
        "keeping placeholders in %s: %s",
        namespace,
        ", ".join(f"{n} × {key}" for key, n in sorted(keeper.wanted.items())),
    )
    await keeper.run()
