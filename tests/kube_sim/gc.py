"""The garbage collector: objects whose owners are gone are deleted, as kube-controller-manager's
garbagecollector does it (pkg/controller/garbagecollector, Kubernetes v1.31).

An owner is gone once it is removed from the store: a pod being deleted gracefully is still an
owner until its kubelet removes it. A dependent is then deleted with the default (Background)
propagation, as a client's delete would be: a pod gracefully (Terminating, the kubelet's
Killing event, SIGTERM), its own dependents after it. Each ownerReference is looked up by its
kind and name where the dependent lives (the cluster scope for a cluster-scoped kind) and
counts only if the uid matches, so a reference to an owner that never existed, that is
already gone, or that lives in another namespace is dangling. A dependent with no owner left
is deleted; one that keeps some owners only loses its dangling references
(`attemptToDeleteItem`). A reference of a kind the cluster does not serve, and a
cluster-scoped dependent's reference to a namespaced kind, cannot be resolved: such a
dependent is left alone, the latter with the collector's OwnerRefInvalidNamespace warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from .api import RESOURCE_TYPES, Api, ResourceType
from .control_loop import ControlLoop
from .owners import resource_type_of
from .store import ApiError, Key, Obj, WatchEvent

log = logging.getLogger("kube_sim.gc")

COMPONENT = "garbage-collector-controller"
BY_KEY = {(r.api_version, r.kind): r for r in RESOURCE_TYPES}


def _reference_string(ref: Obj, namespace: str) -> str:
    """`objectReference.String()`, as the collector's events print an owner."""
    return (
        f"[{ref.get('apiVersion')}/{ref.get('kind')}, namespace: {namespace}, "
        f"name: {ref.get('name')}, uid: {ref.get('uid')}]"
    )


class GarbageCollector(ControlLoop):
    """Deletes dependents whose owners are gone, ``delay`` seconds after the change that
    left them so (an owner's removal, a dependent written with references)."""

    def __init__(self, api: Api, delay: float = 0.1):
        self.api = api
        self.delay = delay
        #: the ownerReferences of every object that has some, by key
        self._dependents: dict[Key, list[Obj]] = {}
        self._warned: set[tuple[str, str]] = set()  # (dependent uid, owner uid) reported
        self._wake = asyncio.Event()

    def start(self) -> None:
        for key in self.api.store.all_keys():
            obj = self.api.store.get(*key)
            if obj and obj["metadata"].get("ownerReferences"):
                self._dependents[key] = obj["metadata"]["ownerReferences"]
        super().start()
        if self._dependents:
            self._wake.set()

    def _on_change(self, event: WatchEvent) -> None:
        # never write from inside a store callback: watchers would see events out of order
        refs = event.obj["metadata"].get("ownerReferences") or []
        if event.type == "DELETED":
            self._dependents.pop(event.key, None)
            if self._dependents:
                self._wake.set()
        elif refs != self._dependents.get(event.key, []):
            if refs:
                self._dependents[event.key] = refs
                self._wake.set()
            else:
                self._dependents.pop(event.key, None)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.delay)
            self._wake.clear()
            try:
                self.collect()
            except Exception:
                log.exception("garbage collection failed")

    def collect(self) -> list[Obj]:
        """One pass over every dependent; returns those deleted."""
        deleted = []
        for key in list(self._dependents):
            obj = self.api.store.get(*key)
            rt = BY_KEY.get(key[:2])
            if obj is None or rt is None or obj["metadata"].get("deletionTimestamp"):
                continue
            with contextlib.suppress(ApiError):  # gone meanwhile
                if self._attempt(rt, obj):
                    deleted.append(obj)
        return deleted

    def _attempt(self, rt: ResourceType, obj: Obj) -> bool:
        """Delete the dependent if none of its owners is left, else drop its dangling
        references; True if it was deleted."""
        meta = obj["metadata"]
        namespace = meta.get("namespace") or ""
        refs = meta.get("ownerReferences") or []
        solid, dangling = [], []
        for ref in refs:
            owner_rt = resource_type_of(ref)
            if owner_rt is None:
                return False  # the real collector retries such an item forever
            if owner_rt.namespaced and not rt.namespaced:
                self._warn(obj, ref, "")
                return False
            owner = self.api.find(owner_rt, namespace, ref.get("name") or "")
            if owner is not None and owner["metadata"]["uid"] == ref.get("uid"):
                solid.append(ref)
            else:
                dangling.append(ref)
                if owner_rt.namespaced:
                    self._warn_if_elsewhere(obj, owner_rt, ref, namespace)
        if not dangling:
            return False
        where = f"{namespace}/{meta['name']}" if namespace else meta["name"]
        if solid:

            def drop(o: Obj) -> None:
                o["metadata"]["ownerReferences"] = [
                    r for r in o["metadata"].get("ownerReferences") or [] if r in solid
                ]

            log.info("%s %s: dropping references to owners that are gone", rt.kind, where)
            self.api.update(rt, namespace, meta["name"], drop)
            return False
        log.info("%s %s: every owner is gone, deleting it", rt.kind, where)
        self.api.delete(rt, namespace, meta["name"])
        return True

    def _warn_if_elsewhere(
        self, obj: Obj, owner_rt: ResourceType, ref: Obj, namespace: str
    ) -> None:
        """The collector's warning for a reference to an owner in another namespace (it
        knows the uid from there); the reference is dangling all the same."""
        for other in self.api.list(owner_rt):
            other_ns = other["metadata"].get("namespace") or ""
            if other["metadata"]["uid"] == ref.get("uid") and other_ns != namespace:
                self._warn(obj, ref, namespace)

    def _warn(self, obj: Obj, ref: Obj, namespace: str) -> None:
        key = (obj["metadata"]["uid"], ref.get("uid") or "")
        if key in self._warned:
            return
        self._warned.add(key)
        self.api.record_event(
            obj,
            "OwnerRefInvalidNamespace",
            f"ownerRef {_reference_string(ref, namespace)} does not exist in namespace "
            f'"{namespace}"',
            type_="Warning",
            component=COMPONENT,
        )
