"""SimulatedCluster: the API server, scheduler and kubelet together, on a free 127.0.0.1 port.

async with SimulatedCluster() as cluster:          # inside the current event loop
    cluster.gpu_node("gpu-1")
    ... kubernetes_asyncio against cluster.url ...

with SimulatedCluster.run_in_thread() as cluster:  # its own loop in a thread
    cluster.gpu_node("gpu-1")                       # for sync clients and subprocesses
    ... kubernetes (sync) against cluster.url ...
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import tornado.httpserver
from tornado.netutil import bind_sockets

from .api import EVENT, NODE, POD, Api
from .faults import Faults
from .kubelet import Kubelet
from .scheduler import Scheduler
from .server import end_watches, make_app
from .store import Obj, Store
from .tls import ServingCertificate

log = logging.getLogger("kube_sim")
T = TypeVar("T")

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
# MIG instances per GPU by compute slices; a 1g profile with double memory fits 4, not 7
_MIG_PER_GPU = {"1g": 7, "2g": 3, "3g": 2, "4g": 1, "7g": 1}
_FAMILIES = {
    "A100": "ampere",
    "A30": "ampere",
    "A10": "ampere",
    "H100": "hopper",
    "H200": "hopper",
    "L4": "ada-lovelace",
    "L40": "ada-lovelace",
    "T4": "turing",
    "V100": "volta",
}


def mig_slices(profile: str, gpus: int, memory_mib: int) -> int:
    """How many `profile` instances (e.g. "1g.10gb") `gpus` GPUs hold under all-<profile>."""
    m = re.fullmatch(r"(\dg)\.(\d+)gb", profile)
    if not m or m.group(1) not in _MIG_PER_GPU:
        raise ValueError(f"unknown MIG profile {profile!r}; expected e.g. 1g.10gb or 3g.40gb")
    per_gpu = _MIG_PER_GPU[m.group(1)]
    if m.group(1) == "1g" and int(m.group(2)) * 7 * 1024 > memory_mib * 1.05:
        per_gpu = 4
    return per_gpu * gpus


def gpu_node_spec(
    name: str,
    product: str = "NVIDIA-A100-SXM4-80GB",
    gpus: int = 8,
    memory_mib: int = 81920,
    mig: str | dict[str, int] | None = None,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: int = 110,
) -> dict[str, Any]:
    """add_node() keyword arguments for a GPU node as GPU Feature Discovery would label it.

    mig: None for whole GPUs, "all-1g.10gb" for every GPU split one way, or a dict of
    profile -> instance count for a custom mix.
    """
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(memory_mib),
        "nvidia.com/gpu.count": str(gpus),
    }
    family = next((f for k, f in _FAMILIES.items() if f"-{k}" in product), None)
    if family:
        labels["nvidia.com/gpu.family"] = family
    allocatable: dict[str, str] = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    if mig is None:
        allocatable["nvidia.com/gpu"] = str(gpus)
    else:
        if isinstance(mig, str):
            profile = mig.removeprefix("all-")
            slices = {profile: mig_slices(profile, gpus, memory_mib)}
            labels["nvidia.com/mig.config"] = mig
        else:
            slices = dict(mig)
            labels["nvidia.com/mig.config"] = "custom-config"
        labels["nvidia.com/mig.strategy"] = "mixed"
        labels["nvidia.com/mig.capable"] = "true"
        labels["nvidia.com/mig.config.state"] = "success"
        for profile, count in slices.items():
            allocatable[f"nvidia.com/mig-{profile}"] = str(count)
            labels[f"nvidia.com/mig-{profile}.count"] = str(count)
            labels[f"nvidia.com/mig-{profile}.product"] = f"{product}-MIG-{profile}"
        allocatable["nvidia.com/gpu"] = "0"
    return {"name": name, "labels": labels, "allocatable": allocatable, "taints": [GPU_TAINT]}


class SimulatedCluster:
    """A simulated Kubernetes cluster in the current event loop."""

    def __init__(
        self,
        *,
        port: int = 0,
        seed: int = 0,
        image_pull_delay: float = 0.0,
        max_grace_seconds: float = 5.0,
        crash_backoff: float = 1.0,
        scheduler_interval: float = 1.0,
        event_interval: float = 5.0,
        history_size: int = 1000,
        scheduler_names: tuple[str, ...] = ("default-scheduler",),
    ):
        self.api = Api(Store(history_size=history_size))
        self.faults = Faults(seed=seed)
        self.port = port
        self.url = ""
        self._image_pull_delay = image_pull_delay
        self._max_grace = max_grace_seconds
        self._crash_backoff = crash_backoff
        self._scheduler_interval = scheduler_interval
        self._event_interval = event_interval
        self._scheduler_names = scheduler_names
        self.scheduler: Scheduler | None = None
        self.kubelet: Kubelet | None = None
        self._server: tornado.httpserver.HTTPServer | None = None
        self._tls_servers: list[tornado.httpserver.HTTPServer] = []
        self._app = None

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> SimulatedCluster:
        """Listen on 127.0.0.1 and start the scheduler and kubelet; returns self."""
        sockets = bind_sockets(self.port, "127.0.0.1")
        self.port = sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.kubelet = Kubelet(
            self.api, self.url, self._image_pull_delay, self._max_grace, self._crash_backoff
        )
        self.scheduler = Scheduler(
            self.api,
            self.faults,
            self._scheduler_interval,
            self._event_interval,
            self._scheduler_names,
        )
        self._app = make_app(self.api, self.faults, self.kubelet.logs)
        self._server = tornado.httpserver.HTTPServer(self._app)
        self._server.add_sockets(sockets)
        self.scheduler.start()
        self.kubelet.start()
        log.info("simulated cluster listening on %s", self.url)
        return self

    def serve_tls(self, certificate: ServingCertificate) -> int:
        """Serve the same API over HTTPS on another free 127.0.0.1 port, with
        ``certificate``, for in-cluster clients (tls.py); returns that port."""
        assert self._app is not None, "start the cluster first"
        sockets = bind_sockets(0, "127.0.0.1")
        server = tornado.httpserver.HTTPServer(self._app, ssl_options=certificate.server_context())
        server.add_sockets(sockets)
        self._tls_servers.append(server)
        port = sockets[0].getsockname()[1]
        log.info("simulated cluster listening on https://127.0.0.1:%s", port)
        return port

    async def stop(self) -> None:
        """Stop serving, end open watches, kill every pod process."""
        if self._server is None:
            return
        self._server.stop()
        for server in self._tls_servers:
            server.stop()
        end_watches(self._app)
        await asyncio.sleep(0.01)
        await self._server.close_all_connections()
        for server in self._tls_servers:
            await server.close_all_connections()
        self._tls_servers = []
        if self.scheduler:
            await self.scheduler.stop()
        if self.kubelet:
            await self.kubelet.stop()
        self._server = None

    async def __aenter__(self) -> SimulatedCluster:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @classmethod
    def run_in_thread(cls, **kwargs: Any) -> ClusterThread:
        """Start a cluster in a background thread with its own event loop."""
        return ClusterThread(cls(**kwargs))

    # -- nodes ---------------------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        allocatable: dict[str, str | int] | None = None,
        taints: list[dict[str, str]] | None = None,
        unschedulable: bool = False,
    ) -> Obj:
        """Register a Ready node; allocatable defaults to 8 cpu, 32Gi, 110 pods."""
        alloc = {"cpu": "8", "memory": "32Gi", "pods": "110"}
        alloc.update({k: str(v) for k, v in (allocatable or {}).items()})
        node = {
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **(labels or {}),
                },
            },
            "spec": {"taints": list(taints or []), "unschedulable": unschedulable},
            "status": {
                "capacity": dict(alloc),
                "allocatable": alloc,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                    }
                ],
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": name},
                ],
                "nodeInfo": {
                    "architecture": "amd64",
                    "bootID": "sim",
                    "containerRuntimeVersion": "containerd://1.7.0",
                    "kernelVersion": "6.0.0-sim",
                    "kubeProxyVersion": "v1.31.0",
                    "kubeletVersion": "v1.31.0",
                    "machineID": name,
                    "operatingSystem": "linux",
                    "osImage": "gputap simulated node",
                    "systemUUID": name,
                },
            },
        }
        if not node["spec"]["taints"]:
            del node["spec"]["taints"]
        return self.api.create(NODE, "", node)

    def gpu_node(self, name: str, **kwargs: Any) -> Obj:
        """Add a GPU node labelled like GPU Feature Discovery; see gpu_node_spec for kwargs."""
        return self.add_node(**gpu_node_spec(name, **kwargs))

    def cordon(self, name: str, unschedulable: bool = True) -> Obj:
        """Mark a node unschedulable (kubectl cordon); pass False to uncordon."""

        def mark(node: Obj) -> None:
            node["spec"]["unschedulable"] = unschedulable

        return self.api.store.update(NODE.api_version, NODE.kind, "", name, NODE.plural, mark)

    def uncordon(self, name: str) -> Obj:
        return self.cordon(name, False)

    # -- inspection ----------------------------------------------------------------------------

    def pods(self, namespace: str | None = None) -> list[Obj]:
        """A snapshot of every pod (or one namespace's), as the API would return them."""
        return self.api.list(POD, namespace)

    def events(self, namespace: str | None = None, pod: str | None = None) -> list[Obj]:
        """Events, optionally only those about one pod, oldest first."""
        field = f"involvedObject.name={pod}" if pod else None
        events = self.api.list(EVENT, namespace, field_selector=field)
        return sorted(events, key=lambda e: int(e["metadata"]["resourceVersion"]))

    def kubeconfig_dict(self, namespace: str = "default") -> dict[str, Any]:
        """A kubeconfig for this cluster (the bearer token is accepted and ignored)."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kube-sim", "cluster": {"server": self.url}}],
            "users": [{"name": "kube-sim", "user": {"token": "kube-sim"}}],
            "contexts": [
                {
                    "name": "kube-sim",
                    "context": {"cluster": "kube-sim", "user": "kube-sim", "namespace": namespace},
                }
            ],
            "current-context": "kube-sim",
        }

    def write_kubeconfig(self, path: str, namespace: str = "default") -> str:
        """Write the kubeconfig (JSON, which is YAML) to path; returns path."""
        with open(path, "w") as f:
            json.dump(self.kubeconfig_dict(namespace), f, indent=2)
        return path


class ClusterThread:
    """A SimulatedCluster running in a daemon thread; methods are forwarded into its loop."""

    def __init__(self, cluster: SimulatedCluster):
        self.cluster = cluster
        self.faults = cluster.faults  # thread-safe on its own
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kube-sim", daemon=True)
        self._thread.start()
        self._await(cluster.start())
        self.url = cluster.url

    def _await(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run fn(*args, **kwargs) in the cluster's loop and return its result."""

        async def run() -> T:
            return fn(*args, **kwargs)

        return self._await(run())

    def add_node(self, name: str, **kwargs: Any) -> Obj:
        return self.call(self.cluster.add_node, name, **kwargs)

    def gpu_node(self, name: str, **kwargs: Any) -> Obj:
        return self.call(self.cluster.gpu_node, name, **kwargs)

    def cordon(self, name: str, unschedulable: bool = True) -> Obj:
        return self.call(self.cluster.cordon, name, unschedulable)

    def uncordon(self, name: str) -> Obj:
        return self.call(self.cluster.uncordon, name)

    def pods(self, namespace: str | None = None) -> list[Obj]:
        return self.call(self.cluster.pods, namespace)

    def events(self, namespace: str | None = None, pod: str | None = None) -> list[Obj]:
        return self.call(self.cluster.events, namespace, pod)

    def kubeconfig_dict(self, namespace: str = "default") -> dict[str, Any]:
        return self.cluster.kubeconfig_dict(namespace)

    def write_kubeconfig(self, path: str, namespace: str = "default") -> str:
        return self.cluster.write_kubeconfig(path, namespace)

    def serve_tls(self, certificate: ServingCertificate) -> int:
        return self.call(self.cluster.serve_tls, certificate)

    def stop(self) -> None:
        """Stop the cluster and its thread; idempotent."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(concurrent.futures.TimeoutError):
            self._await(self.cluster.stop(), timeout=15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> ClusterThread:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
