"""The Kubernetes backend: GPUKubeSpawner, KubeSpawner with live GPU availability.

The form and the REST API take the same options as on one machine. A Placement becomes the
pod: GPU or MIG limits, a node selector on the chosen node's GPU product, the GPU toleration,
CPU and memory from the catalog, and ``gputap.io/`` labels naming user, server, card, slice,
count and price class. One ClusterWatcher per hub keeps the inventory current from the API.
Sold-out requests may wait first come first served; spot servers run with a low priority
class and may be preempted, which the user is told on their next visit.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from datetime import datetime
from typing import Any

from kubernetes_asyncio.client import ApiException
from kubespawner import KubeSpawner
from kubespawner.clients import shared_client
from tornado import web
from traitlets import Integer, Unicode

from .base import GPUSpawnerMixin, billing_unavailable, utcnow
from .billing_client import BillingRefused, BillingUnavailable
from .kube_disks import MOUNT_ROOT, KubeDiskStore, disk_pod_settings
from .kube_inventory import RESERVATION_ANNOTATION
from .kube_objects import gpu_pod_settings
from .kube_watch import ClusterWatcher, parse_time
from .placement import FreeView, Placement

# one watcher per hub (per event loop)
_watchers: dict[asyncio.AbstractEventLoop, ClusterWatcher] = {}
_watcher_lock = asyncio.Lock()

#: KubeSpawner traits that gpu_pod_settings and disk_pod_settings set; their configured values
#: are the base
_GPU_TRAITS = (
    "extra_labels",
    "extra_annotations",
    "extra_resource_limits",
    "extra_resource_guarantees",
    "node_selector",
    "tolerations",
    "cpu_guarantee",
    "mem_guarantee",
    "volumes",
    "volume_mounts",
    "lifecycle_hooks",
)


class GPUKubeSpawner(GPUSpawnerMixin, KubeSpawner):
    """KubeSpawner that places each server on the cheapest free GPU, slice or spec match."""

    offers_spot = True

    on_demand_priority_class = Unicode(
        "gputap-on-demand",
        config=True,
        help="""PriorityClass of on-demand servers (created if missing).

        c.GPUKubeSpawner.on_demand_priority_class = "gputap-on-demand"
        """,
    )

    on_demand_priority = Integer(
        1000,
        config=True,
        help="""Priority value of on-demand servers: above spot, so they preempt spot servers.

        c.GPUKubeSpawner.on_demand_priority = 1000
        """,
    )

    spot_priority_class = Unicode(
        "gputap-spot",
        config=True,
        help="""PriorityClass of interruptible (spot) servers (created if missing).

        c.GPUKubeSpawner.spot_priority_class = "gputap-spot"
        """,
    )

    spot_priority = Integer(
        -100,
        config=True,
        help="""Priority value of spot servers: any on-demand server may preempt them.

        c.GPUKubeSpawner.spot_priority = -100
        """,
    )

    disk_storage_class = Unicode(
        "",
        config=True,
        help="""StorageClass of data disks' PersistentVolumeClaims ("": the cluster's default).

        c.GPUKubeSpawner.disk_storage_class = "fast-ssd"
        """,
    )

    # per-server record: {"session_id", "offering", "count", "node", "price_class", "hold_id",
    # "started_at"} (see GPUSpawnerMixin.gpu)
    gpu: dict[str, Any] | None = None
    _configured: dict[str, Any] | None = None
    _pod_requested = False
    _starting = False
    _stop_requested: datetime | None = None

    @property
    def holder(self) -> str:
        return self._log_name

    @property
    def pod_key(self) -> str:
        return f"{self.namespace}/{self.pod_name}"

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
        if "postStart" in (self._configured or {}).get("lifecycle_hooks", self.lifecycle_hooks):
            del settings["lifecycle_hooks"]
            if disks:
                self.log.info(
                    "%s: disks not linked into ~/disks (postStart configured)", self.holder
                )
        return settings

    # -- inventory ------------------------------------------------------------------------

    async def cluster(self) -> ClusterWatcher:
        """The hub's cluster watcher, started on first use (and its priority classes)."""
        loop = asyncio.get_running_loop()
        async with _watcher_lock:
            watcher = _watchers.get(loop)
            if watcher is None:
                await self._ensure_priority_classes()
                watcher = ClusterWatcher(shared_client("CoreV1Api"), self.catalog)
                watcher.on_change.append(lambda _view: self.wake_queue())
                watcher.start()
                _watchers[loop] = watcher
        try:
            async with asyncio.timeout(self.k8s_api_request_retry_timeout):
                await watcher.ready()
        except TimeoutError:
            raise web.HTTPError(
                503,
                "The cluster's GPU inventory could not be read from the Kubernetes API; "
                "try again in a minute, and tell an operator if it persists.",
            ) from None
        return watcher

    def queue_view(self) -> FreeView:
        watcher = _watchers.get(asyncio.get_running_loop())
        return watcher.inventory.preemptible_view if watcher else FreeView()

    async def gpu_free_view(self) -> tuple[FreeView, bool]:
        """What an on-demand server could get now (spot servers make way for it)."""
        watcher = await self.cluster()
        return watcher.inventory.preemptible_view, False

    async def change_free_view(self, spot: bool = False) -> tuple[FreeView, bool]:
        """A spot server takes only what is free. The pod's own GPUs count as taken: they
        are free only once the pod is gone, and a change never promises what it may not
        get (docs/kubernetes.md, "Changing a server's GPU")."""
        watcher = await self.cluster()
        inventory = watcher.inventory
        return (inventory.view if spot else inventory.preemptible_view), False

    async def _ensure_priority_classes(self) -> None:
        api = shared_client("SchedulingV1Api")
        for name, value, what in (
            (self.on_demand_priority_class, self.on_demand_priority, "on-demand"),
            (self.spot_priority_class, self.spot_priority, "interruptible (spot)"),
        ):
            body = {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "gputap"}},
                "value": value,
                "globalDefault": False,
                "description": f"gputap {what} servers",
            }
            try:
                await api.create_priority_class(body)
                self.log.info("created PriorityClass %s (%d)", name, value)
            except ApiException as e:
                if e.status != 409:
                    raise

    # -- starting -------------------------------------------------------------------------

    async def load_user_options(self) -> None:
        """gputap's options are not KubeSpawner profiles (its ``profile`` key is a MIG profile
        here): they were validated by apply_user_options and become the pod in _start."""

    def _apply_gpu_settings(self, settings: dict[str, Any]) -> None:
        """Set the pod traits for this spawn over their configured values (never piling up
        the previous spawn's values)."""
        if self._configured is None:
            self._configured = {t: copy.deepcopy(getattr(self, t)) for t in _GPU_TRAITS}
        for trait in _GPU_TRAITS:
            base = copy.deepcopy(self._configured[trait])
            value = settings.get(trait)
            if value is None:
                setattr(self, trait, base)
            elif isinstance(base, dict):
                setattr(self, trait, {**base, **value})
            elif isinstance(base, list):
                setattr(self, trait, base + value)
            else:
                setattr(self, trait, value)

    async def _start(self):
        options = self.validated_options()
        watcher = await self.cluster()
        inventory = watcher.inventory
        price_class = "spot" if options.spot else "on-demand"
        prices = await self.prices_for(inventory.view, price_class)
        # spot servers take only what is free; on-demand ones may preempt spot servers
        view = (lambda: inventory.view) if options.spot else (lambda: inventory.preemptible_view)
        answer = await self.place_or_wait(options, view, prices)
        # no await since the decision: reserve before any other spawn decides
        self.gpu = {
            "session_id": str(uuid.uuid4()),
            "offering": answer.offering.key,
            "count": answer.count,
            "node": answer.node,
            "price_class": price_class,
            "course": options.course,
        }
        reservation = f"{self.holder}#{self.gpu['session_id']}"
        if answer.offering.kind != "cpu":
            inventory.reserve(reservation, answer.offering.key, answer.node, answer.count)
        self._starting = True
        try:
            return await self._start_placed(answer, price_class, watcher, reservation)
        except BaseException:
            record, self.gpu = self.gpu, None
            inventory.release(reservation)
            self.wake_queue()
            await self.abandon_billing(record)
            raise
        finally:
            self._starting = False

    async def _start_placed(
        self, answer: Placement, price_class: str, watcher: ClusterWatcher, reservation: str
    ):
        node = watcher.inventory.nodes.get(answer.node) if answer.node else None
        settings = gpu_pod_settings(
            answer,
            self.catalog,
            username=self.user.name,
            session_id=self.gpu["session_id"],
            server_name=self.name,
            product=node.product if node else None,
            hostname=node.hostname if node else None,
            price_class=price_class,
            course=self.gpu.get("course", ""),
        )
        settings["extra_annotations"][RESERVATION_ANNOTATION] = reservation
        settings.update(await self._disk_settings())
        self._apply_gpu_settings(settings)
        self.priority_class_name = (
            self.spot_priority_class if price_class == "spot" else self.on_demand_priority_class
        )
        where = f" on node {answer.node}" if answer.node else ""
        self.progress_note = f"matched {answer.offering.label}{where}"
        self.log.info("%s: %s (%s)", self.holder, self.progress_note, price_class)
        await self.admit(answer, price_class)
        self.notice = ""
        self._pod_requested = True
        url = await super()._start()
        started_at = self._container_started(watcher) or utcnow()
        try:
            await self.open_billing_session(self.gpu, started_at, price_class)
        except (BillingUnavailable, BillingRefused) as e:
            await KubeSpawner.stop(self, now=True)
            raise billing_unavailable(e) from None
        return url

    def _container_started(self, watcher: ClusterWatcher) -> datetime | None:
        """When the server container started running: billing starts there."""
        pod = self.pod_reflector.pods.get(self.pod_key)
        for status in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
            started = ((status.get("state") or {}).get("running") or {}).get("startedAt")
            if started:
                return parse_time(started)
        return None

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

    # -- stopping -------------------------------------------------------------------------

    async def stop(self, now: bool = False) -> None:
        if self._starting:
            # KubeSpawner deletes a conflicting pod in the middle of a start: not a user stop
            return await KubeSpawner.stop(self, now=now)
        self._stop_requested = requested = utcnow()
        record = self.gpu
        try:
            await super().stop(now=now)
        finally:
            # even if deleting the pod failed, the user has lost the server: billing ends now
            self._stop_requested = None
            self._pod_requested = False
            if record is not None:
                self.gpu = None
                await self._finish(record, requested)

    async def _finish(self, record: dict[str, Any], requested: datetime) -> None:
        """Close billing at the earlier of the stop request and the pod's end."""
        watcher = _watchers.get(asyncio.get_running_loop())
        ended = watcher.ended.pop(self.pod_key, None) if watcher else None
        if watcher:
            watcher.inventory.release(f"{self.holder}#{record['session_id']}")
        reason = self._preemption(record)
        if reason:
            self.notice = reason
            self.log.info("%s: %s", self.holder, reason)
        result = await self.settle_billing_session(record, min(requested, ended or requested))
        billed = result.get("billed_seconds") if result else "(none)"
        self.log.info("%s: stopped; billed %s s", self.holder, billed)

    async def poll(self):
        status = await super().poll()
        record = self.gpu
        if status is not None and record is not None and self._stop_requested is None:
            # gone without a stop (preempted, crashed): the hub will not call stop()
            self.gpu = None
            await self._finish(record, utcnow())
        return status

    def _preemption(self, record: dict[str, Any]) -> str:
        """Why the pod went away, if the scheduler preempted it."""
        for event in reversed(self.events):
            if event.get("reason") == "Preempted":
                label = self.catalog.offering(record["offering"]).label
                return (
                    f"Your spot {label} server was stopped: {event.get('message', 'preempted')}. "
                    "Spot servers make way for on-demand ones; your files are kept."
                )
        return ""

    # -- state across hub restarts -------------------------------------------------------

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()
        if self.gpu is not None:
            state["gputap"] = self.gpu
        if self.notice:
            state["gputap_notice"] = self.notice
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.gpu = dict(state["gputap"]) if state.get("gputap") else None
        self.notice = state.get("gputap_notice", "")

    def clear_state(self) -> None:
        super().clear_state()
        self.gpu = None
