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
import concurrent.futures
import contextlib
import json
import logging
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from typing import Any, TypeVar

import tornado.httpserver
from tornado.netutil import bind_sockets

from . import node_health
from .api import EVENT, NODE, POD, STORAGE_CLASS, Api
from .faults import Faults
from .gc import GarbageCollector
from .gpus import device_id
from .kubelet import Kubelet
from .netns import PodNetwork
from .owners import OwnerReferencesPermissionEnforcement
from .rbac import AuditRecord, Rbac
from .scheduler import Scheduler
from .server import end_watches, make_app
from .storage import DEFAULT_CLASS_ANNOTATION
from .store import Obj, Store
from .tls import ServingCertificate
from .volumes import ImageUser, Volumes

log = logging.getLogger("kube_sim")
T = TypeVar("T")

GPU = "nvidia.com/gpu"
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


# What a typical cloud cluster offers: a default zonal block-storage class that binds where the
# first pod lands (as GKE's standard-rwo, EKS's gp3, AKS's managed-csi), ReadWriteOnce only
STANDARD_CLASSES = [
    {
        "metadata": {
            "name": "standard-rwo",
            "annotations": {DEFAULT_CLASS_ANNOTATION: "true"},
        },
        "provisioner": "pd.csi.storage.gke.io",
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
        "allowVolumeExpansion": True,
    }
]


def mig_slices(profile: str, gpus: int, memory_mib: int) -> int:
    """How many `profile` instances (e.g. "1g.10gb") `gpus` GPUs hold under all-<profile>."""
    m = re.fullmatch(r"(\dg)\.(\d+)gb", profile)
    if not m or m.group(1) not in _MIG_PER_GPU:
        raise ValueError(f"unknown MIG profile {profile!r}; expected e.g. 1g.10gb or 3g.40gb")
    per_gpu = _MIG_PER_GPU[m.group(1)]
    if m.group(1) == "1g" and int(m.group(2)) * 7 * 1024 > memory_mib * 1.05:
        per_gpu = 4
    return per_gpu * gpus


def _quantity_str(cores: Fraction) -> str:
    """CPU as the API server writes it: whole cores, else millicores."""
    milli = int(cores * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def gke_allocatable(cpu_cores: int, memory_mib: int, pods: int = 110) -> dict[str, str]:
    """Allocatable CPU and memory of a node with this capacity, as GKE reserves them
    (cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes): CPU 6 % of the first
    core, 1 % of the next, 0.5 % of the next 2, 0.25 % above 4; memory 25 % of the first
    4 GiB, 20 % of the next 4, 10 % of the next 8, 6 % of the next 112, 2 % above 128, plus
    the kubelet's 100 MiB eviction threshold. EKS and AKS reserve in the same range."""
    cores = Fraction(cpu_cores)
    cpu_reserved = Fraction(0)
    for size, share in ((1, "0.06"), (1, "0.01"), (2, "0.005"), (10**6, "0.0025")):
        part = min(cores, size)
        cpu_reserved += part * Fraction(share)
        cores -= part
    left, mem_reserved = Fraction(memory_mib), Fraction(100)
    for size, share in ((4096, "0.25"), (4096, "0.2"), (8192, "0.1"), (114688, "0.06")):
        part = min(left, size)
        mem_reserved += part * Fraction(share)
        left -= part
    mem_reserved += left * Fraction("0.02")
    return {
        "cpu": _quantity_str(Fraction(cpu_cores) - cpu_reserved),
        "memory": f"{int(Fraction(memory_mib) - mem_reserved)}Mi",
        "pods": str(pods),
    }


@dataclass(frozen=True)
class MachineType:
    """A cloud GPU machine type as its provider lists it."""

    vcpu: int
    memory_gib: int
    product: str  # the GFD product label of its GPUs
    gpus: int
    gpu_memory_mib: int  # nvidia.com/gpu.memory as GFD reports it


#: Cloud GPU machine types (AWS EC2 accelerated instances, GCP accelerator-optimized
#: machines, Azure NC A100 v4 sizes), from the providers' instance-type tables. Many GPU
#: nodes are small: a g5.xlarge or g2-standard-4 has 4 vCPUs and 16 GiB for its one GPU.
CLOUD_MACHINES: dict[str, MachineType] = {
    "g4dn.xlarge": MachineType(4, 16, "Tesla-T4", 1, 15360),
    "g5.xlarge": MachineType(4, 16, "NVIDIA-A10G", 1, 23028),
    "g5.12xlarge": MachineType(48, 192, "NVIDIA-A10G", 4, 23028),
    "p4d.24xlarge": MachineType(96, 1152, "NVIDIA-A100-SXM4-40GB", 8, 40960),
    "p5.48xlarge": MachineType(192, 2048, "NVIDIA-H100-80GB-HBM3", 8, 81559),
    "g2-standard-4": MachineType(4, 16, "NVIDIA-L4", 1, 23034),
    "a2-highgpu-1g": MachineType(12, 85, "NVIDIA-A100-SXM4-40GB", 1, 40960),
    "a3-highgpu-8g": MachineType(208, 1872, "NVIDIA-H100-80GB-HBM3", 8, 81559),
    "Standard_NC24ads_A100_v4": MachineType(24, 220, "NVIDIA-A100-80GB-PCIe", 1, 81920),
    "Standard_NC96ads_A100_v4": MachineType(96, 880, "NVIDIA-A100-80GB-PCIe", 4, 81920),
}


def gpu_node_spec(
    name: str,
    product: str = "NVIDIA-A100-SXM4-80GB",
    gpus: int = 8,
    memory_mib: int = 81920,
    mig: str | dict[str, int] | None = None,
    cpu: str = "64",
    memory: str = "512Gi",
    pods: int = 110,
    *,
    mig_strategy: str = "mixed",
    replicas: int = 1,
    rename_by_default: bool = True,
    unhealthy: int = 0,
    capacity: dict[str, str] | None = None,
    ready: str = "True",
) -> dict[str, Any]:
    """add_node() keyword arguments for a GPU node as the NVIDIA device plugin and GPU Feature
    Discovery (GFD) would advertise and label it (k8s-device-plugin internal/lm/resource.go
    and mig-strategy.go).

    mig: None for whole GPUs, "all-1g.10gb" for every GPU split one way, or a dict of
    profile -> instance count for a custom mix (mixed strategy only).
    mig_strategy: "mixed" (each profile its own ``nvidia.com/mig-<profile>`` resource) or
    "single" (every slice counted as ``nvidia.com/gpu``; GFD's product label becomes
    ``<product>-MIG-<profile>``, and count and memory are the slices').
    replicas: time-slicing, each GPU sold this many times; ``rename_by_default`` advertises
    the replicas as ``nvidia.com/gpu.shared``, otherwise as ``nvidia.com/gpu`` with a
    ``-SHARED`` suffix on the product label. Either way GFD sets ``nvidia.com/gpu.replicas``.
    unhealthy: GPUs (or their replicas, or slices) the device plugin marked unhealthy: still
    in capacity, gone from allocatable. cpu, memory, pods: allocatable; ``capacity`` the
    node's cpu and memory before system reservations (default: the same).
    ready: the Ready condition ("True", "False", "Unknown"), see SimulatedCluster.add_node.
    """
    if mig_strategy not in ("mixed", "single"):
        raise ValueError(f"mig_strategy must be mixed or single, not {mig_strategy!r}")
    if replicas < 1 or (replicas > 1 and mig is not None):
        raise ValueError("replicas: 1 or more, and time-slicing here is of whole GPUs")
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.memory": str(memory_mib),
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.replicas": str(replicas),
    }
    family = next((f for k, f in _FAMILIES.items() if f"-{k}" in product), None)
    if family:
        labels["nvidia.com/gpu.family"] = family
    gpu_resources: dict[str, int] = {}
    if mig is None:
        resource = "nvidia.com/gpu.shared" if replicas > 1 and rename_by_default else GPU
        gpu_resources[resource] = gpus * replicas
        if replicas > 1 and not rename_by_default:
            labels["nvidia.com/gpu.product"] = f"{product}-SHARED"
        if resource != GPU:
            gpu_resources[GPU] = 0
    else:
        if isinstance(mig, str):
            profile = mig.removeprefix("all-")
            slices = {profile: mig_slices(profile, gpus, memory_mib)}
            labels["nvidia.com/mig.config"] = mig
        else:
            slices = dict(mig)
            labels["nvidia.com/mig.config"] = "custom-config"
        labels["nvidia.com/mig.strategy"] = mig_strategy
        labels["nvidia.com/mig.capable"] = "true"
        labels["nvidia.com/mig.config.state"] = "success"
        if mig_strategy == "single":
            if len(slices) != 1:
                raise ValueError("the single strategy needs every GPU split the same way")
            [(profile, count)] = slices.items()
            gpu_resources[GPU] = count
            labels.update(_single_strategy_labels(product, profile, count))
        else:
            for profile, count in slices.items():
                gpu_resources[f"nvidia.com/mig-{profile}"] = count
                labels[f"nvidia.com/mig-{profile}.count"] = str(count)
                labels[f"nvidia.com/mig-{profile}.product"] = f"{product}-MIG-{profile}"
            gpu_resources[GPU] = 0
    if unhealthy and unhealthy > max(gpu_resources.values()):
        raise ValueError(f"unhealthy: {unhealthy} is more than the node's GPUs")
    allocatable: dict[str, str] = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    node_capacity = {**allocatable, **(capacity or {})}
    for resource, count in gpu_resources.items():
        node_capacity[resource] = str(count)
        # the device plugin drops unhealthy devices from what it advertises as allocatable
        allocatable[resource] = str(max(0, count - unhealthy) if count else 0)
    return {
        "name": name,
        "labels": labels,
        "allocatable": allocatable,
        "capacity": node_capacity,
        "taints": [GPU_TAINT],
        "ready": ready,
    }


def _single_strategy_labels(product: str, profile: str, count: int) -> dict[str, str]:
    """What GFD's single-strategy labeler writes over the full-GPU labels: the MIG
    device's product, count and attributes (memory in MiB, slices, multiprocessors)."""
    m = re.fullmatch(r"(\d)g\.(\d+)gb", profile)
    if not m:
        raise ValueError(f"unknown MIG profile {profile!r}; expected e.g. 1g.10gb")
    compute, memory_gb = int(m.group(1)), int(m.group(2))
    return {
        "nvidia.com/gpu.product": f"{product}-MIG-{profile}",
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": str(memory_gb * 1024 - 256 * compute),
        "nvidia.com/gpu.slices.gi": str(compute),
        "nvidia.com/gpu.slices.ci": str(compute),
        "nvidia.com/gpu.multiprocessors": str(compute * 14),
    }


def cloud_node_spec(name: str, machine_type: str, **gpu_kwargs: Any) -> dict[str, Any]:
    """add_node() keyword arguments for a node of a cloud machine type (CLOUD_MACHINES):
    its GPUs as gpu_node_spec labels them, its vCPUs and memory as capacity, and allocatable
    after the system reservations (gke_allocatable), labelled with
    ``node.kubernetes.io/instance-type`` as cloud nodes are. gpu_kwargs go to gpu_node_spec
    (mig, replicas, unhealthy, ready ...)."""
    try:
        machine = CLOUD_MACHINES[machine_type]
    except KeyError:
        known = ", ".join(CLOUD_MACHINES)
        raise ValueError(f"unknown machine type {machine_type!r}; known: {known}") from None
    memory_mib = machine.memory_gib * 1024
    allocatable = gke_allocatable(machine.vcpu, memory_mib)
    spec = gpu_node_spec(
        name,
        product=machine.product,
        gpus=machine.gpus,
        memory_mib=machine.gpu_memory_mib,
        cpu=allocatable["cpu"],
        memory=allocatable["memory"],
        capacity={"cpu": str(machine.vcpu), "memory": f"{memory_mib}Mi"},
        **gpu_kwargs,
    )
    spec["labels"]["node.kubernetes.io/instance-type"] = machine_type
    return spec


NOT_READY_TAINT = "node.kubernetes.io/not-ready"
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"


def node_readiness(ready: str) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The Ready condition and the taints of a node whose Ready status is ``ready``.

    A kubelet that reports NotReady gives "False"; one that stopped posting its status is
    marked "Unknown" by the node lifecycle controller. The controller then taints the node
    ``node.kubernetes.io/not-ready`` or ``node.kubernetes.io/unreachable``, NoSchedule (so
    the scheduler's TaintToleration filter keeps new pods off it) and NoExecute (evicting
    pods that do not tolerate it; the API server's DefaultTolerationSeconds admission
    gives every pod 300 s). Kubernetes pkg/controller/nodelifecycle, "Taint Nodes by
    Condition" and "Taint based Evictions"."""
    conditions = {
        "True": ("KubeletReady", "kubelet is posting ready status", None),
        "False": ("KubeletNotReady", "container runtime is down", NOT_READY_TAINT),
        "Unknown": ("NodeStatusUnknown", "Kubelet stopped posting node status.", UNREACHABLE_TAINT),
    }
    if ready not in conditions:
        raise ValueError(f"ready must be True, False or Unknown, not {ready!r}")
    reason, message, taint = conditions[ready]
    condition = {"type": "Ready", "status": ready, "reason": reason, "message": message}
    if taint is None:
        return condition, []
    added = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return condition, [
        {"key": taint, "effect": "NoSchedule", "timeAdded": added},
        {"key": taint, "effect": "NoExecute", "timeAdded": added},
    ]


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
