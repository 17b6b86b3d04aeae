"""SimulatedCluster: the API server, scheduler, kubelet and pod network together, the API on a
free 127.0.0.1 port (and on the pod network's host address, where pods reach it).

async with SimulatedCluster() as cluster:          # inside the current event loop
    cluster.gpu_node("gpu-1")
    ... kubernetes_asyncio against cluster.url ...

with SimulatedCluster.run_in_thread() as cluster:  # its own loop in a thread
    cluster.gpu_node("gpu-1")                       # for sync clients and subprocesses
    ... kubernetes (sync) against cluster.url ...
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import tornado.httpserver
from tornado.netutil import bind_sockets

from . import node_health
from .api import EVENT, NODE, POD, STORAGE_CLASS, Api
from .cluster_thread import ClusterThread
from .faults import Faults
from .gc import GarbageCollector
from .gpus import device_id
from .kubelet import Kubelet
from .netns import PodNetwork
from .node_health import NOT_READY_TAINT, UNREACHABLE_TAINT, node_readiness
from .node_shapes import GPU, cloud_node_spec, gpu_node_spec
from .owners import OwnerReferencesPermissionEnforcement
from .rbac import AuditRecord, Rbac
from .scheduler import Scheduler
from .server import end_watches, make_app
from .storage import STANDARD_CLASSES
from .store import Obj, Store
from .tls import ServingCertificate
from .volumes import ImageUser, Volumes

log = logging.getLogger("kube_sim")


def admin_key(cluster: SimulatedCluster | ClusterThread) -> dict[str, str]:
    """The `api_key` of a client Configuration that acts as the cluster's administrator:
    `Configuration(host=cluster.url, api_key=admin_key(cluster))`."""
    return {"BearerToken": f"Bearer {cluster.admin_token}"}


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
        images: dict[str, ImageUser] | None = None,
        storage_classes: list[Obj] | None = None,
        scheduler_names: tuple[str, ...] = ("default-scheduler",),
        nfs_exports: dict[str, str] | None = None,
        gc_delay: float = 0.1,
    ):
        self.api = Api(Store(history_size=history_size))
        self.rbac = Rbac(self.api)
        # not in kube-apiserver's default set, but on in OpenShift and some managed clusters:
        # enforced here, what passes the simulation passes there
        self.api.validating_admission.append(
            OwnerReferencesPermissionEnforcement(self.rbac.admission_check)
        )
        for storage_class in STANDARD_CLASSES if storage_classes is None else storage_classes:
            self.api.create(STORAGE_CLASS, "", storage_class)
        self.volumes = Volumes(self.api, images, nfs_exports=nfs_exports)
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
        self.gc = GarbageCollector(self.api, gc_delay)
        self.network = PodNetwork()
        self._server: tornado.httpserver.HTTPServer | None = None
        self._tls_servers: list[tornado.httpserver.HTTPServer] = []
        self._app = None

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> SimulatedCluster:
        """Bring the pod network up, listen on 127.0.0.1 and on the network's host address
        (pods' KUBERNETES_SERVICE_HOST), start the scheduler and kubelet; returns self."""
        self.network.start()
        sockets = bind_sockets(self.port, "127.0.0.1")
        self.port = sockets[0].getsockname()[1]
        sockets += bind_sockets(self.port, self.network.host_ip)
        self.url = f"http://127.0.0.1:{self.port}"
        self.kubelet = Kubelet(
            self.api,
            self.network,
            f"http://{self.network.host_ip}:{self.port}",
            self._image_pull_delay,
            self._max_grace,
            self._crash_backoff,
            volumes=self.volumes,
        )
        self.scheduler = Scheduler(
            self.api,
            self.faults,
            self._scheduler_interval,
            self._event_interval,
            self._scheduler_names,
        )
        self._app = make_app(self.api, self.faults, self.kubelet.logs, self.rbac)
        self._server = tornado.httpserver.HTTPServer(self._app)
        self._server.add_sockets(sockets)
        self.scheduler.start()
        self.kubelet.start()
        self.gc.start()
        log.info("simulated cluster listening on %s", self.url)
        return self

    def serve_tls(self, certificate: ServingCertificate) -> int:
        """Serve the same API over HTTPS on another free 127.0.0.1 port, and on that port of
        the pod network's host address, with ``certificate``, for in-cluster clients
        (tls.py); returns that port."""
        assert self._app is not None, "start the cluster first"
        sockets = bind_sockets(0, "127.0.0.1")
        sockets += bind_sockets(sockets[0].getsockname()[1], self.network.host_ip)
        server = tornado.httpserver.HTTPServer(self._app, ssl_options=certificate.server_context())
        server.add_sockets(sockets)
        self._tls_servers.append(server)
        port = sockets[0].getsockname()[1]
        log.info("simulated cluster listening on https://127.0.0.1:%s (and the gateway)", port)
        return port

    async def pod_network_namespace(self) -> tuple[str, list[str]]:
        """A network namespace of its own on the pod network, for a pod the test runs itself
        rather than the kubelet (a release's own pods, tests/helm): its address, and the
        command prefix that runs a program in it. It goes when the cluster stops."""
        ip = self.network.allocate()
        netns = await self.network.add_pod(ip)
        return ip, self.network.exec_prefix(netns)

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
        await self.gc.stop()
        if self.scheduler:
            await self.scheduler.stop()
        if self.kubelet:
            await self.kubelet.stop()
        self.network.stop()
        self.volumes.cleanup()
        self._server = None

    async def __aenter__(self) -> SimulatedCluster:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @classmethod
    def run_in_thread(cls, **kwargs: Any) -> ClusterThread:
        """Start a cluster in a background thread with its own event loop."""
        return ClusterThread(cls(**kwargs))

    @property
    def host_ip(self) -> str:
        """The nodes' address on the pod network: where pods reach a server on the host (a hub
        listening here is what a hub behind its Service is to real pods)."""
        return self.network.host_ip

    # -- nodes ---------------------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        allocatable: dict[str, str | int] | None = None,
        taints: list[dict[str, str]] | None = None,
        unschedulable: bool = False,
        capacity: dict[str, str | int] | None = None,
        ready: str = "True",
    ) -> Obj:
        """Register a node; allocatable defaults to 8 cpu, 32Gi, 110 pods, capacity to the
        allocatable. ``ready`` "False" or "Unknown" registers it NotReady, with the taints
        the node lifecycle controller sets (see node_readiness)."""
        alloc = {"cpu": "8", "memory": "32Gi", "pods": "110"}
        alloc.update({k: str(v) for k, v in (allocatable or {}).items()})
        condition, lifecycle_taints = node_readiness(ready)
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
            "spec": {
                "taints": [*(taints or []), *lifecycle_taints],
                "unschedulable": unschedulable,
            },
            "status": {
                "capacity": {**alloc, **{k: str(v) for k, v in (capacity or {}).items()}},
                "allocatable": alloc,
                "conditions": [condition],
                "addresses": [
                    {"type": "InternalIP", "address": self.network.host_ip},
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

    def set_ready(self, name: str, ready: str) -> Obj:
        """Change a node's Ready condition ("True", "False", "Unknown") and its lifecycle
        taints, as the kubelet and the node lifecycle controller would."""
        condition, lifecycle_taints = node_readiness(ready)

        def mark(node: Obj) -> None:
            kept = [
                t
                for t in node["spec"].get("taints") or []
                if t["key"] not in (NOT_READY_TAINT, UNREACHABLE_TAINT)
            ]
            node["spec"]["taints"] = kept + lifecycle_taints
            node["status"]["conditions"] = [
                c for c in node["status"].get("conditions") or [] if c["type"] != "Ready"
            ] + [condition]

        return self.api.store.update(NODE.api_version, NODE.kind, "", name, NODE.plural, mark)

    def gpu_node(self, name: str, **kwargs: Any) -> Obj:
        """Add a GPU node labelled like GPU Feature Discovery; see gpu_node_spec for kwargs."""
        return self.add_node(**gpu_node_spec(name, **kwargs))

    def cloud_node(self, name: str, machine_type: str, **kwargs: Any) -> Obj:
        """Add a node of a cloud GPU machine type; see cloud_node_spec."""
        return self.add_node(**cloud_node_spec(name, machine_type, **kwargs))

    def cordon(self, name: str, unschedulable: bool = True) -> Obj:
        """Mark a node unschedulable (kubectl cordon); pass False to uncordon."""

        def mark(node: Obj) -> None:
            node["spec"]["unschedulable"] = unschedulable

        return self.api.store.update(NODE.api_version, NODE.kind, "", name, NODE.plural, mark)

    def uncordon(self, name: str) -> Obj:
        return self.cordon(name, False)

    def skew_clock(self, node: str, offset: timedelta) -> None:
        """Run ``node``'s clock ``offset`` ahead of the API server's (behind: negative): the
        times its kubelet writes (container starts and ends, its events) are off by that
        much, as on a node whose NTP is broken."""
        self.kubelet.clock_offsets[node] = offset

    # -- GPU faults and health agents ----------------------------------------------------------

    def _update_node(self, name: str, mutate: Callable[[Obj], None]) -> Obj:
        return self.api.store.update(NODE.api_version, NODE.kind, "", name, NODE.plural, mutate)

    def gpu_fault(self, node: str, index: int, resource: str = GPU, report: bool = True) -> str:
        """What the NVIDIA device plugin does when its health check fails device ``index`` of
        ``resource`` on ``node`` (an XID 79, say): the device is Unhealthy, given to no new
        pod, and allocatable drops by one (capacity stays). With ``report`` the kubelet
        writes ``allocatedResourcesStatus`` (health Unhealthy) for the pod holding it, as
        with ResourceHealthStatus (on from Kubernetes 1.36); without, the pod's status stays
        as before 1.36. The pod itself runs on (kubernetes#60388). Returns the device ID (what
        the pod sees in ``NVIDIA_VISIBLE_DEVICES``). A device already Unhealthy changes
        nothing more."""
        assert self.kubelet is not None, "start the cluster first"
        device = self._device(node, index, resource)
        if self.kubelet.devices.mark_unhealthy(node, device):
            self._update_node(node, lambda n: node_health.change_allocatable(n, resource, -1))
        self.kubelet.device_health_changed(node, device, report)
        return device

    def gpu_heal(self, node: str, index: int, resource: str = GPU) -> str:
        """The device plugin advertising device ``index`` Healthy again (after a restart its
        health check starts afresh): allocatable back up by one, and pods whose status
        reported it see it Healthy. Returns the device ID."""
        assert self.kubelet is not None, "start the cluster first"
        device = self._device(node, index, resource)
        if self.kubelet.devices.mark_healthy(node, device):
            self._update_node(node, lambda n: node_health.change_allocatable(n, resource, 1))
        self.kubelet.device_health_changed(node, device, report=False)
        return device

    def _device(self, node: str, index: int, resource: str) -> str:
        found = self.api.find(NODE, "", node)
        if found is None:
            raise ValueError(f"no node {node!r}")
        count = int((found["status"].get("capacity") or {}).get(resource, 0))
        if not 0 <= index < count:
            raise ValueError(f"node {node} has {count} {resource}; no device {index}")
        return device_id(resource, node, index)

    def set_condition(
        self, node: str, type_: str, status: str, reason: str = "", message: str = ""
    ) -> Obj:
        """Post the node condition ``type_`` ("True", "False", "Unknown"), as Node Problem
        Detector or another health agent does (see node_health.py)."""
        return self._update_node(
            node, lambda n: node_health.set_condition(n, type_, status, reason, message)
        )

    def clear_condition(self, node: str, type_: str) -> Obj:
        """Remove the node condition ``type_``."""
        return self._update_node(node, lambda n: node_health.clear_condition(n, type_))

    def taint(self, node: str, key: str, effect: str, value: str | None = None) -> Obj:
        """Taint the node ``key[=value]:effect``, as the GPU operator or an admin does."""
        return self._update_node(node, lambda n: node_health.taint(n, key, effect, value))

    def untaint(self, node: str, key: str, effect: str | None = None) -> Obj:
        """Remove the node's taints of ``key`` (of that ``effect`` only, when given)."""
        return self._update_node(node, lambda n: node_health.untaint(n, key, effect))

    # -- inspection ----------------------------------------------------------------------------

    def pods(self, namespace: str | None = None) -> list[Obj]:
        """A snapshot of every pod (or one namespace's), as the API would return them."""
        return self.api.list(POD, namespace)

    def visible_gpus(self, namespace: str, pod: str) -> list[str]:
        """The GPUs the pod's container sees on its node (tests/kube_sim/gpus.py), as
        ``GPU-<node>-<i>`` device IDs; [] for one that sees none or has not started."""
        obj = self.api.find(POD, namespace, pod)
        if obj is None or self.kubelet is None:
            return []
        return list(self.kubelet.devices.visible.get(obj["metadata"]["uid"], []))

    def events(self, namespace: str | None = None, pod: str | None = None) -> list[Obj]:
        """Events, optionally only those about one pod, oldest first."""
        field = f"involvedObject.name={pod}" if pod else None
        events = self.api.list(EVENT, namespace, field_selector=field)
        return sorted(events, key=lambda e: int(e["metadata"]["resourceVersion"]))

    # -- identities ----------------------------------------------------------------------------

    @property
    def admin_token(self) -> str:
        """The bearer token of the cluster's administrator (group system:masters)."""
        return self.rbac.tokens.admin_token

    def service_account_token(self, namespace: str, name: str) -> str:
        """A token for an existing ServiceAccount, as a pod's projected token would be: valid
        while that account exists. 404 ApiError when it does not."""
        return self.rbac.service_account_token(namespace, name)

    @property
    def audit(self) -> list[AuditRecord]:
        """Every API request so far, oldest first: who, what, where, and the rule allowing it;
        with the checks OwnerReferencesPermissionEnforcement made of a requester's rights."""
        return list(self.rbac.audit)

    def kubeconfig_dict(self, namespace: str = "default", token: str = "") -> dict[str, Any]:
        """A kubeconfig for this cluster with a bearer token (default: the administrator's)."""
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "kube-sim", "cluster": {"server": self.url}}],
            "users": [{"name": "kube-sim", "user": {"token": token or self.admin_token}}],
            "contexts": [
                {
                    "name": "kube-sim",
                    "context": {"cluster": "kube-sim", "user": "kube-sim", "namespace": namespace},
                }
            ],
            "current-context": "kube-sim",
        }

    def write_kubeconfig(self, path: str, namespace: str = "default", token: str = "") -> str:
        """Write the kubeconfig (JSON, which is YAML) to path; returns path."""
        with open(path, "w") as f:
            json.dump(self.kubeconfig_dict(namespace, token), f, indent=2)
        return path
