"""Workers on Kubernetes: a pod per worker, owned by the server's pod, and one NetworkPolicy
per group (spawner/kube/worker_objects.py), seen through the hub's cluster watch.

A worker's GPUs are reserved on its node until the watch sees its pod bound, as a server's
are. Its home is the server's claim, mounted at the same path: workers on other nodes need a
home every node can mount (``home_access_mode: ReadWriteMany``), so a ReadWriteOnce home is
refused with a 409 that says so.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Protocol

from kubernetes_asyncio.client import ApiException
from kubespawner.clients import shared_client
from tornado import web

from gputap_common import clock
from gputap_common.times import pod_time

from ..core.placement import FreeView, Placement, Request, ServerOptions
from ..core.record import ServerRecord
from ..core.workers import Worker, worker_holder
from .homes import attaches_to_one_node
from .machine import KubeMachine
from .worker_objects import (
    AGENT_PORT,
    WORKER_CONTAINER,
    group_network_policy,
    hub_peer,
    worker_pod,
)

#: how long a worker pod has to get an address (scheduled, started)
POD_START_SECONDS = 300.0
#: how often a worker's pod is looked at in the hub's watch cache
LOOK_SECONDS = 0.3


class WorkerServer(Protocol):
    """What workers take from their server's spawner (GPUKubeSpawner)."""

    who: str
    namespace: str
    pod_name: str
    storage_access_modes: list[str]
    api: Any
    log: Any

    @property
    def machine(self) -> KubeMachine: ...

    async def gpu_views(
        self, options: ServerOptions
    ) -> tuple[Callable[[], FreeView], FreeView]: ...

    async def placed_pod_settings(
        self, placement: Placement, record: ServerRecord, holder: str
    ) -> dict[str, Any]: ...


class KubeWorkers:
    """The Kubernetes backend of a server's workers (their GPUs are reserved on the hub's
    machine, spawner/kube/machine.py, through the start pipeline)."""

    def __init__(self, spawner: WorkerServer):
        self.spawner = spawner

    # -- placement ------------------------------------------------------------------------

    async def views(self, request: Request) -> tuple[Callable[[], FreeView], FreeView]:
        modes = self.spawner.storage_access_modes
        if attaches_to_one_node(modes):
            raise web.HTTPError(
                409,
                f"Workers mount this server's home, which is {', '.join(modes)}: it attaches "
                "to one node at a time, so workers on other nodes could not see your files. "
                "An operator enables scale-out with spawner.kubernetes.home_access_mode: "
                "ReadWriteMany (a shared file system).",
            )
        return await self.spawner.gpu_views(ServerOptions(request))

    def rendezvous_host(self) -> str:
        pod = self._server_pod()
        return ((pod or {}).get("status") or {}).get("podIP") or ""

    # -- pods -----------------------------------------------------------------------------

    def _server_pod(self) -> Mapping[str, Any] | None:
        return self._pod(self.spawner.pod_name)

    def _pod(self, name: str) -> Mapping[str, Any] | None:
        return self.spawner.machine.pod(self.spawner.namespace, name)

    async def launch(self, worker: Worker, token: str) -> tuple[str, int]:
        spawner = self.spawner
        server = self._server_pod()
        if server is None or not server["metadata"].get("uid"):
            raise RuntimeError("the server's pod is not in the hub's view of the cluster")
        record = worker.record
        holder = worker_holder(spawner.who, worker.name)
        settings = await spawner.placed_pod_settings(worker.placement, record, holder)
        manifest = worker_pod(
            server,
            settings,
            worker=worker.name,
            token=token,
            offering=record.offering,
            count=record.count,
        )
        await self._ensure_policy(server)
        if record.price_class != "spot":
            await spawner.machine.make_room(worker.placement, spawner.log)
        name = manifest["metadata"]["name"]
        worker.handle["pod"] = name
        await spawner.api.create_namespaced_pod(spawner.namespace, manifest)
        spawner.log.info("%s#%s: pod %s/%s asked for", spawner.who, worker.name,
                         spawner.namespace, name)  # fmt: skip
        loop = asyncio.get_running_loop()
        deadline = loop.time() + POD_START_SECONDS
        while True:
            pod = self._pod(name)
            status = (pod or {}).get("status") or {}
            if status.get("podIP") and status.get("phase") == "Running":
                return status["podIP"], AGENT_PORT
            if status.get("phase") in ("Failed", "Succeeded"):
                raise RuntimeError(
                    f"its pod ended before it ran ({status.get('reason') or status['phase']})"
                )
            if loop.time() > deadline:
                why = status.get("conditions") or status.get("phase") or "not seen"
                raise TimeoutError(f"its pod did not run within {POD_START_SECONDS:.0f} s ({why})")
            await asyncio.sleep(LOOK_SECONDS)

    async def _ensure_policy(self, server: Mapping[str, Any]) -> None:
        hub = hub_peer(os.environ.get("HELM_RELEASE_NAME", ""), os.environ.get("POD_NAMESPACE", ""))
        policy = group_network_policy(server, hub)
        api = shared_client("NetworkingV1Api")
        try:
            await api.create_namespaced_network_policy(self.spawner.namespace, policy)
        except ApiException as e:
            if e.status != 409:  # made for an earlier worker of the group
                raise

    async def wait(self, worker: Worker) -> tuple[datetime, str]:
        """Until its pod has ended or is gone: when (its container's finish, on the API
        server's clock), and how."""
        name = worker.handle.get("pod", "")
        while True:
            pod = self._pod(name)
            if pod is None:
                return clock.utcnow(), "was deleted"
            status = pod.get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed"):
                return _finished(pod), _how(pod)
            await asyncio.sleep(LOOK_SECONDS)

    async def stop(self, worker: Worker) -> None:
        name = worker.handle.get("pod")
        if not name:
            return
        try:
            await self.spawner.api.delete_namespaced_pod(
                name, self.spawner.namespace, grace_period_seconds=5
            )
        except ApiException as e:
            if e.status != 404:
                raise

    def still_runs(self, worker: Worker) -> bool:
        pod = self._pod(worker.handle.get("pod", ""))
        return pod is not None and (pod.get("status") or {}).get("phase") == "Running"


def _worker_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == WORKER_CONTAINER:
            return status
    return {}


def _finished(pod: Mapping[str, Any]) -> datetime:
    terminated = (_worker_status(pod).get("state") or {}).get("terminated") or {}
    finished = pod_time(pod, terminated.get("finishedAt"))
    now = clock.utcnow()
    return min(finished, now) if finished else now


def _how(pod: Mapping[str, Any]) -> str:
    terminated = (_worker_status(pod).get("state") or {}).get("terminated") or {}
    code = terminated.get("exitCode")
    reason = terminated.get("reason") or (pod.get("status") or {}).get("reason") or ""
    if code is None:
        return f"ended ({reason})" if reason else "ended"
    return f"exited with code {code}" + (f" ({reason})" if reason else "")
