"""Node shapes: the labels and resources a GPU node advertises as the NVIDIA device plugin and
GPU Feature Discovery set them (whole GPUs, MIG mixed and single, time-slicing, unhealthy
devices), cloud GPU machine types, and the allocatable a cloud leaves of a node's capacity.
Pure: each function returns SimulatedCluster.add_node keyword arguments or a part of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

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
