"""The Kubernetes backend: GPUKubeSpawner, KubeSpawner with live GPU availability.

The form and the REST API take the same options as on one machine, and the lifecycle is the
shared one (spawner.lifecycle.mixin). A placement becomes the pod through KubeSpawner's public
``get_pod_manifest``: the pod KubeSpawner builds from its configuration, plus GPU or MIG
limits, a node selector on the chosen node's GPU product and host name, the GPU toleration,
CPU and memory from the catalog, the attached data disks, the priority class, and
``gputap.io/`` labels naming user, server, card, slice, count and price class
(spawner.kube.objects). One ClusterWatcher per hub keeps the inventory current from the API.
Sold-out requests may wait first come first served; spot servers run with a low priority
class and may be preempted, which the user is told on their next visit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any

from jupyterhub.utils import url_path_join, wait_for_http_server
from kubernetes_asyncio.client import ApiException
from kubespawner import KubeSpawner
from kubespawner.clients import shared_client
from tornado import web
from traitlets import Unicode

from gputap_common import clock
from gputap_common.times import pod_time

from ..core.placement import FreeView, Placement, ServerOptions
from ..core.record import ServerRecord
from ..lifecycle import stops
from ..lifecycle.mixin import GPUSpawnerMixin
from ..lifecycle.starting import Start
from .disks import MOUNT_ROOT, KubeDiskStore, disk_pod_settings
from .homes import (
    ZONE_LABEL,
    HomeHolder,
    attaches_to_one_node,
    claim_zone,
    home_holder,
    home_note,
    zone_note,
)
from .machine import KubeMachine, kube_machine
from .objects import GPU_TOLERATIONS, HOSTNAME_LABEL, apply_pod_settings
from .watch import ClusterWatcher
from .workers import KubeWorkers


class GPUKubeSpawner(GPUSpawnerMixin, KubeSpawner):
    """KubeSpawner that places each server on the cheapest free GPU, slice or spec match."""

    offers_spot = True
    backend_name = "kubernetes"

    on_demand_priority_class = Unicode(
        "gputap-on-demand",
        config=True,
        help="""PriorityClass of on-demand servers, above spot so that they preempt spot
        servers. It must exist: gputap never creates it (the Helm chart does).

        c.GPUKubeSpawner.on_demand_priority_class = "gputap-on-demand"
        """,
    )

    spot_priority_class = Unicode(
        "gputap-spot",
        config=True,
        help="""PriorityClass of interruptible (spot) servers, below on-demand. It must
        exist: gputap never creates it (the Helm chart does).

        c.GPUKubeSpawner.spot_priority_class = "gputap-spot"
        """,
    )

    disk_storage_class = Unicode(
        "",
        config=True,
        help="""StorageClass of data disks' PersistentVolumeClaims ("": the cluster's default).

        c.GPUKubeSpawner.disk_storage_class = "fast-ssd"
        """,
    )

    #: what this start's pod gets beyond KubeSpawner's configuration (get_pod_manifest)
    _pod_settings: dict[str, Any] | None = None
    #: whether this start has asked for its pod (progress turns to the pod's events)
    _pod_requested = False
    #: when this start asked for its pod (no second before it is billed)
    _pod_asked_at: datetime | None = None
    #: where this start's home reaches (a node's or a zone's node selector), and what a
    #: refusal says about it; empty when it reaches every node
    _home_selector: dict[str, str] = {}
    _home_limit = ""
    _worker_backend: KubeWorkers | None = None

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.pod_name}"

    @property
    def machine(self) -> KubeMachine:
        """The hub's cluster watch and reservations, shared with workers and the fault desk."""
        return kube_machine()

    # -- data disks -----------------------------------------------------------------------

    @property
    def disk_store(self) -> KubeDiskStore:
        return KubeDiskStore(
            shared_client("CoreV1Api"),
            self.namespace,
            self.disk_storage_class,
            self.disk_max_size_gb,
            self.max_disks,
        )

    def disk_path(self, name: str) -> str:
        return f"{MOUNT_ROOT}/{name}"

    async def _disk_settings(self) -> dict[str, Any]:
        """Volumes and mounts of the disks attached to this server, and the hook linking
        them into ~/disks unless the operator configured a postStart hook of their own."""
        disks, elsewhere = await self.disks_to_mount()
        settings = disk_pod_settings(self.user.name, [d.name for d in disks], elsewhere)
        if "postStart" in self.lifecycle_hooks:
            del settings["lifecycle_hooks"]
            if disks:
                self.log.info("%s: disks not linked into ~/disks (postStart configured)", self.who)
        return settings

    # -- inventory ------------------------------------------------------------------------

    async def cluster(self) -> ClusterWatcher:
        """The hub's cluster watcher, started on first use, once it has listed the cluster."""
        return await self.machine.ready(
            self.catalog, self.k8s_api_request_retry_timeout, self.tolerations
        )

    def node_of_pod(self) -> str | None:
        """The node this server's pod runs on, as the watch last saw it."""
        pod = self.machine.pod(self.namespace, self.pod_name)
        return (pod.get("spec") or {}).get("nodeName") if pod else None

    def worker_backend(self) -> KubeWorkers:
        """The backend of this server's workers (spawner/kube/workers.py)."""
        if self._worker_backend is None:
            self._worker_backend = KubeWorkers(self)
        return self._worker_backend

    async def gpu_free_view(self) -> tuple[FreeView, bool]:
        """What an on-demand server could get now (spot servers make way for it)."""
        watcher = await self.cluster()
        return watcher.inventory.preemptible_view, False

    async def change_free_view(self, spot: bool = False) -> tuple[FreeView, bool]:
        """A spot server takes only what is free. The pod's own GPUs count as taken: they
        are free only once the pod is gone, and a change never promises what it may not
        get (docs/kubernetes.md, "Changing a server's GPU"); only where the home reaches."""
        watcher = await self.cluster()
        inventory = watcher.inventory
        view = await self._where_home_reaches(
            watcher, lambda: inventory.view if spot else inventory.preemptible_view
        )
        return view(), False

    def find_home_holder(self, watcher: ClusterWatcher) -> HomeHolder | None:
        """Another of the user's servers whose pod holds their home on a node, when the home
        attaches to one node at a time (spawner.kube.homes)."""
        if not attaches_to_one_node(self.storage_access_modes):
            return None
        return home_holder(watcher.pods, self.namespace, self.pvc_name, self.pod_name)

    async def home_zone(self, watcher: ClusterWatcher) -> str | None:
        """The zone of the user's home volume, if it has one yet (spawner.kube.homes)."""
        try:
            claim = await self.api.read_namespaced_persistent_volume_claim(
                self.pvc_name, self.namespace
            )
        except ApiException as e:
            if e.status != 404:
                self.log.warning("%s: home claim unreadable (%s): zone not known", self.who, e)
            return None
        return claim_zone(claim.metadata.annotations or {}, watcher.node_zones)

    async def _where_home_reaches(
        self, watcher: ClusterWatcher, view: Callable[[], FreeView]
    ) -> Callable[[], FreeView]:
        """What is free to this server: on the node holding its home while another of the
        user's servers has it there, else in the zone of its home volume, else anywhere."""
        self._home_limit, self._home_selector = "", {}
        holder = self.find_home_holder(watcher)
        if holder is not None:
            nodes = {holder.node}
            self._home_limit = home_note(holder)
            node = watcher.inventory.nodes.get(holder.node)
            self._home_selector = {HOSTNAME_LABEL: node.hostname if node else holder.node}
        else:
            zone = await self.home_zone(watcher)
            if zone is None:
                return view
            nodes = {name for name, z in watcher.node_zones.items() if z == zone}
            self._home_limit = zone_note(zone)
            self._home_selector = {ZONE_LABEL: zone}
        self.log.info("%s: placed where the home reaches: %s", self.who, self._home_selector)
        return lambda: view().free_only_on(nodes)

    # -- lifecycle hooks (spawner.lifecycle.mixin) -------------------------------------------

    async def gpu_views(self, options: ServerOptions) -> tuple[Callable[[], FreeView], FreeView]:
        """Spot servers take only what is free; on-demand ones may preempt spot servers; both
        only where the user's home reaches (_where_home_reaches). Prices are asked for
        everything the cluster holds."""
        watcher = await self.cluster()
        inventory = watcher.inventory
        spot = options.spot
        free = await self._where_home_reaches(
            watcher, lambda: inventory.view if spot else inventory.preemptible_view
        )
        return free, inventory.view

    async def place_or_wait(
        self,
        start: Start,
        options: ServerOptions,
        free_view: Callable[[], FreeView],
        prices: dict[str, int],
    ) -> Placement:
        """The shared placement; a refusal says when the home's node or zone was the limit."""
        try:
            return await super().place_or_wait(start, options, free_view, prices)
        except web.HTTPError as e:
            if e.status_code != 409 or not self._home_limit:
                raise
            raise web.HTTPError(409, f"{e.log_message}{self._home_limit}") from None

    def before_launch(self, placement: Placement) -> None:
        """Its GPUs are reserved (the machine's take): the pod is not asked for yet."""
        self._pod_requested = False

    async def placed_pod_settings(
        self, placement: Placement, record: ServerRecord, holder: str
    ) -> dict[str, Any]:
        """The pod settings of a placement (the server's, or one of its workers', ``holder``)."""
        return await self.machine.pod_settings(
            placement, record, holder, self.catalog, self.user.name, self.name
        )

    async def launch(self, placement: Placement) -> str:
        """What the pod gets beyond KubeSpawner's configuration (get_pod_manifest applies
        it), then KubeSpawner's own start: the home's claim, the pod, waiting until it runs,
        and then until the server answers, as the hub's own check does (the start's time to
        ready ends there; billing started when the container did)."""
        record = self.record
        settings = await self.placed_pod_settings(placement, record, self.who)
        if self.server_environment.image:  # else the configured image (gputap's own environment)
            settings["image"] = self.server_environment.image
        if self._home_selector and not placement.node:
            # a CPU server goes where its home reaches; to the node holding it, GPU node or not
            settings["node_selector"] = dict(self._home_selector)
            if HOSTNAME_LABEL in self._home_selector:
                settings["tolerations"] = list(GPU_TOLERATIONS)
        settings.update(await self._disk_settings())
        spot = record.price_class == "spot"
        settings["priority_class_name"] = (
            self.spot_priority_class if spot else self.on_demand_priority_class
        )
        self._pod_settings = settings
        if not spot:
            await self.machine.make_room(placement, self.log)
        self._pod_requested = True
        self._pod_asked_at = clock.utcnow()
        url = await KubeSpawner.start(self)
        api = url_path_join(url, self.server.base_url, "api")
        await wait_for_http_server(api, timeout=self.http_timeout)
        return url

    async def get_pod_manifest(self):
        """KubeSpawner's pod for this server, with what placement and the disks add."""
        pod = await super().get_pod_manifest()
        return apply_pod_settings(pod, self._pod_settings or {})

    async def launched_at(self) -> datetime:
        """When the server container started running: billing starts there. Its node's
        clock may be off, so the start is read on the API server's clock, and kept between
        when the pod was asked for and now (docs/kubernetes.md, "Clocks")."""
        now = clock.utcnow()
        pod = self.pod_reflector.pods.get(self.pod_key) or {}
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            started = pod_time(
                pod, ((status.get("state") or {}).get("running") or {}).get("startedAt")
            )
            if started is not None:
                return min(max(started, self._pod_asked_at or started), now)
        return await super().launched_at()

    async def stopped(
        self, record: ServerRecord, requested: datetime, died: bool = False
    ) -> datetime:
        """The pod's end (its container's finish, or its deletion) as the watch saw it: for a
        stop asked, the earlier of it and the request; for a pod found gone (``died``), that
        end itself, never before it was last seen alive (``requested``): the last poll may be
        seconds before. A preempted spot server leaves a notice."""
        ended = self.machine.ended(self.pod_key)
        reason = self._preemption(record)
        if died:
            at = max(ended or requested, requested)
            if ended is not None:
                self.stop_book.set(stops.died(at))
        else:
            at = min(requested, ended or requested)
        if reason:
            self.stop_book.set(stops.preempted(reason, at))
            self.log.info("%s: %s", self.who, reason)
        return at

    async def progress(self):
        """Queue position and the match first, then KubeSpawner's pod events."""
        shown = None
        while not self._pod_requested:
            note = self.queue_note or self.progress_note
            if note and note != shown:
                shown = note
                yield {"progress": 10 if self.queue_note else 20, "message": note}
            await asyncio.sleep(0.3)
        if self.progress_note and self.progress_note != shown:
            yield {"progress": 20, "message": self.progress_note}
        async for event in KubeSpawner.progress(self):
            yield event

    def _preemption(self, record: ServerRecord) -> str:
        """Why the pod went away, if the scheduler preempted it."""
        for event in reversed(self.events):
            if event.get("reason") == "Preempted":
                label = self.catalog.offering(record.offering).label
                return (
                    f"Your spot {label} server was stopped: {event.get('message', 'preempted')}. "
                    "Spot servers make way for on-demand ones; your files are kept."
                )
        return ""
