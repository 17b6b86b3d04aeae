"""ClusterThread: a SimulatedCluster running in a daemon thread with its own event loop, for
sync clients and for hubs in subprocesses; its methods are forwarded into that loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from .node_shapes import GPU
from .rbac import AuditRecord
from .store import Obj
from .tls import ServingCertificate

if TYPE_CHECKING:
    from .cluster import SimulatedCluster

T = TypeVar("T")


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
        self.host_ip = cluster.host_ip

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

    def cloud_node(self, name: str, machine_type: str, **kwargs: Any) -> Obj:
        return self.call(self.cluster.cloud_node, name, machine_type, **kwargs)

    def set_ready(self, name: str, ready: str) -> Obj:
        return self.call(self.cluster.set_ready, name, ready)

    def cordon(self, name: str, unschedulable: bool = True) -> Obj:
        return self.call(self.cluster.cordon, name, unschedulable)

    def uncordon(self, name: str) -> Obj:
        return self.call(self.cluster.uncordon, name)

    def skew_clock(self, node: str, offset: timedelta) -> None:
        return self.call(self.cluster.skew_clock, node, offset)

    def gpu_fault(self, node: str, index: int, resource: str = GPU, report: bool = True) -> str:
        return self.call(self.cluster.gpu_fault, node, index, resource, report)

    def gpu_heal(self, node: str, index: int, resource: str = GPU) -> str:
        return self.call(self.cluster.gpu_heal, node, index, resource)

    def set_condition(
        self, node: str, type_: str, status: str, reason: str = "", message: str = ""
    ) -> Obj:
        return self.call(self.cluster.set_condition, node, type_, status, reason, message)

    def clear_condition(self, node: str, type_: str) -> Obj:
        return self.call(self.cluster.clear_condition, node, type_)

    def taint(self, node: str, key: str, effect: str, value: str | None = None) -> Obj:
        return self.call(self.cluster.taint, node, key, effect, value)

    def untaint(self, node: str, key: str, effect: str | None = None) -> Obj:
        return self.call(self.cluster.untaint, node, key, effect)

    def pods(self, namespace: str | None = None) -> list[Obj]:
        return self.call(self.cluster.pods, namespace)

    def events(self, namespace: str | None = None, pod: str | None = None) -> list[Obj]:
        return self.call(self.cluster.events, namespace, pod)

    @property
    def admin_token(self) -> str:
        return self.cluster.admin_token

    def visible_gpus(self, namespace: str, pod: str) -> list[str]:
        return self.call(self.cluster.visible_gpus, namespace, pod)

    def service_account_token(self, namespace: str, name: str) -> str:
        return self.call(self.cluster.service_account_token, namespace, name)

    @property
    def audit(self) -> list[AuditRecord]:
        return self.call(lambda: self.cluster.audit)

    def kubeconfig_dict(self, namespace: str = "default", token: str = "") -> dict[str, Any]:
        return self.cluster.kubeconfig_dict(namespace, token)

    def write_kubeconfig(self, path: str, namespace: str = "default", token: str = "") -> str:
        return self.cluster.write_kubeconfig(path, namespace, token)

    def serve_tls(self, certificate: ServingCertificate) -> int:
        return self.call(self.cluster.serve_tls, certificate)

    def pod_network_namespace(self) -> tuple[str, list[str]]:
        return self._await(self.cluster.pod_network_namespace())

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
