"""One watch-based cache per hub: list and watch nodes and pods into a ClusterInventory.

KubeSpawner's ResourceReflector keeps a dict of namespaced objects and relists on every
reconnect; the inventory needs cluster-scoped nodes and a callback per event (each an O(1)
update), so this module runs its own list+watch loops on KubeSpawner's shared client.

Each watch lasts WATCH_SECONDS, as KubeSpawner's reflectors' do (``timeout_seconds``), so a
watch whose connection died without closing (a NAT or load balancer that forgot it) is given
up at most WATCH_SECONDS + ``WATCH_GRACE_SECONDS`` after it opened, and the cache relisted
(docs/kubernetes.md, "Watches").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from kubernetes_asyncio.client import ApiException

from gputap_common import clock
from gputap_common.kube_watch import SilentWatch, list_objects, watch_objects
from gputap_common.times import pod_time

from ..core.catalog import Catalog
from .homes import ZONE_LABEL
from .inventory import ClusterInventory

log = logging.getLogger(__name__)

Handler = Callable[[str, Mapping[str, Any]], None]

#: how long one watch request lasts; a silent one is given up WATCH_GRACE_SECONDS later
WATCH_SECONDS = 10


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return meta.get("uid") or f"{meta.get('namespace', '')}/{meta['name']}"


async def list_and_watch(
    api: Any,
    list_method: str,
    on_event: Handler,
    on_relist: Callable[[list[Mapping[str, Any]]], None],
    ready: asyncio.Event,
    timeout_seconds: int = WATCH_SECONDS,
) -> None:
    """List, hand the items to ``on_relist``, then stream events to ``on_event``; forever.

    A dropped or expired watch resumes from the last resourceVersion; a silent one relists
    at once, as after a 410 Gone; after an error it relists backing off up to 30 s."""
    method = getattr(api, list_method)
    resource_version: str | None = None
    delay = 0.1
    while True:
        try:
            if resource_version is None:
                listing = await list_objects(method)
                on_relist(listing["items"])
                resource_version = listing["metadata"]["resourceVersion"]
                ready.set()
            events = watch_objects(
                method, resource_version=resource_version, timeout_seconds=timeout_seconds
            )
            async for event, obj in events:
                on_event(event, obj)
                resource_version = obj["metadata"].get("resourceVersion", resource_version)
            delay = 0.1
        except asyncio.CancelledError:
            raise
        except SilentWatch as e:
            # what the dead connection withheld is not known: relist at once (a connection
            # that dies this way may be every connection of the way, while lists still pass)
            resource_version = None
            log.warning("watching %s: %s; relisting", list_method, e)
        except ApiException as e:
            resource_version = None  # 410 Gone: that version is too old; relist at once
            if e.status != 410:
                delay = await _back_off(list_method, e, delay)
        except Exception as e:
            resource_version = None
            delay = await _back_off(list_method, e, delay)


async def _back_off(list_method: str, error: Exception, delay: float) -> float:
    log.warning("watching %s failed (%s); relisting in %.1f s", list_method, error, delay)
    await asyncio.sleep(delay)
    return min(delay * 2, 30)


class ClusterWatcher:
    """Keeps a ClusterInventory current from the Kubernetes API. Start it once per hub."""

    def __init__(
        self, api: Any, catalog: Catalog, tolerations: Sequence[Any] | Mapping[str, Any] = ()
    ):
        """``tolerations``: those every server's pod carries (ClusterInventory)."""
        self.api = api
        self.inventory = ClusterInventory(catalog, tolerations)
        self._nodes_ready = asyncio.Event()
        self._pods_ready = asyncio.Event()
        self._known: dict[str, dict[str, Mapping[str, Any]]] = {"node": {}, "pod": {}}
        self._tasks: list[asyncio.Task] = []
        #: called with (kind, event, object) for every node and pod event, relists included
        #: (kind "node" or "pod", event ADDED, MODIFIED or DELETED), after the inventory has
        #: it and before ``on_change``: what a hook changes in the inventory (a GPU fault held
        #: out) is in the view the queue wakes to. A hook that raises is logged and skipped.
        self.on_event: list[Callable[[str, str, Mapping[str, Any]], None]] = []
        #: called with the FreeView after every change (e.g. to wake the queue)
        self.on_change: list[Callable[[Any], None]] = []
        #: "namespace/pod" -> when its server ended (finishedAt, or when it was deleted)
        self.ended: dict[str, datetime] = {}

    @property
    def node_zones(self) -> dict[str, str]:
        """Node name -> its ``topology.kubernetes.io/zone``, for the nodes that have one."""
        zones = {}
        for node in self._known["node"].values():
            meta = node.get("metadata") or {}
            zone = (meta.get("labels") or {}).get(ZONE_LABEL)
            if zone:
                zones[meta["name"]] = zone
        return zones

    @property
    def pods(self) -> list[Mapping[str, Any]]:
        """Every pod as last seen, in every namespace."""
        return list(self._known["pod"].values())

    def _handler(self, kind: str) -> Handler:
        apply = self.inventory.apply_node if kind == "node" else self.inventory.apply_pod
        known = self._known[kind]

        def on_event(event: str, obj: Mapping[str, Any]) -> None:
            if event == "DELETED":
                known.pop(_key(obj), None)
            else:
                known[_key(obj)] = obj
            apply(event, obj)
            if kind == "pod":
                self._note_end(event, obj)
            for hook in self.on_event:
                try:
                    hook(kind, event, obj)
                except Exception:
                    # one hook's bug must not stop the cache (the watch would relist forever)
                    log.exception("%s event hook failed on %s", kind, obj["metadata"]["name"])
            for callback in self.on_change:
                callback(self.inventory.view)

        return on_event

    def _note_end(self, event: str, pod: Mapping[str, Any]) -> None:
        """Remember when a pod's server ended: its container's finish (on the API server's
        clock, and never after it was seen: its node's clock may be off), else its
        deletion."""
        meta = pod["metadata"]
        key = f"{meta.get('namespace', '')}/{meta['name']}"
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (status.get("state") or {}).get("terminated") or {}
            finished = pod_time(pod, terminated.get("finishedAt"))
            if finished is not None:
                self.ended.setdefault(key, min(finished, clock.utcnow()))
                return
        if event == "DELETED":
            self.ended.setdefault(key, clock.utcnow())
        elif meta.get("deletionTimestamp") is None:
            self.ended.pop(key, None)  # a new pod of the same name

    def _relister(self, kind: str) -> Callable[[list[Mapping[str, Any]]], None]:
        on_event = self._handler(kind)
        known = self._known[kind]

        def on_relist(items: list[Mapping[str, Any]]) -> None:
            fresh = {_key(obj): obj for obj in items}
            for key in [k for k in known if k not in fresh]:
                on_event("DELETED", known[key])
            for obj in items:
                on_event("MODIFIED", obj)

        return on_relist

    def start(self) -> None:
        for kind, method, ready in (
            ("node", "list_node", self._nodes_ready),
            ("pod", "list_pod_for_all_namespaces", self._pods_ready),
        ):
            task = asyncio.ensure_future(
                list_and_watch(self.api, method, self._handler(kind), self._relister(kind), ready)
            )
            self._tasks.append(task)

    async def ready(self) -> None:
        """Return once nodes and pods have been listed at least once."""
        await asyncio.gather(self._nodes_ready.wait(), self._pods_ready.wait())

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
