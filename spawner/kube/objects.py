"""Placement → the GPU parts of a single-user pod. Pure: keyword arguments in, a dict of
KubeSpawner trait values out (like kubespawner/objects.py's make_* functions).

Every gputap pod carries labels and annotations under one prefix, ``gputap.io/``, so billing
and operators can attribute it; the keys and what each holds are in :mod:`gputap_common.labels`.

Billing meters pods by these (billing_service/kube_meter.py): the session annotation is the id
under which the spawner posts the server's start and stop, so billing's pod meter, a second
source, records the same session and never a second one; the course annotation is the course
billing charges, as the spawner names it when it opens the session.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio.client.models import (
    V1EnvVar,
    V1Lifecycle,
    V1Pod,
    V1ResourceRequirements,
    V1Toleration,
    V1Volume,
    V1VolumeMount,
)
from kubespawner.slugs import is_valid_label, safe_slug
from kubespawner.utils import get_k8s_model

from gputap_common import labels as keys

from ..core.catalog import Catalog, Offering
from ..core.placement import Placement
from .inventory import (
    GPU_RESOURCE,
    GPU_TOLERATIONS,
    HOSTNAME_LABEL,
    MIG_PREFIX,
    PRODUCT_LABEL,
    SHARED_RESOURCE,
)

#: NVIDIA Container Toolkit: "void" (like unset) exposes no GPU and no driver. CUDA images
#: set NVIDIA_VISIBLE_DEVICES=all, which a pod without a GPU request keeps: on a GPU node
#: without the nvidia.com/gpu taint it would see, and use, every GPU of the node.
NO_GPUS = {"NVIDIA_VISIBLE_DEVICES": "void"}


def label(value: str) -> str:
    """Any string as a valid, collision-free label value."""
    return safe_slug(value, is_valid=is_valid_label, max_length=63) if value else ""


def gpu_resource(placement: Placement | Offering) -> str:
    """The resource an offering is requested as on nodes where each offering has its own:
    the MIG mixed strategy and renamed time-slicing."""
    offering = placement.offering if isinstance(placement, Placement) else placement
    if offering.kind == "slice":
        return f"{MIG_PREFIX}{offering.profile}"
    if offering.kind == "shared":
        return SHARED_RESOURCE
    return GPU_RESOURCE


def gpu_pod_settings(
    placement: Placement,
    catalog: Catalog,
    *,
    username: str,
    session_id: str,
    server_name: str = "",
    product: str | None = None,
    hostname: str | None = None,
    resource: str | None = None,
    room: tuple[int, int] | None = None,
    price_class: str = "on-demand",
    course: str = "",
    environment: str = "",
) -> dict[str, Any]:
    """KubeSpawner settings for a placement.

    ``product`` is the GFD product label of the chosen node and ``hostname`` its
    ``kubernetes.io/hostname``: the pod is pinned to that node (node selectors on both, so the
    scheduler binds it where its GPUs were reserved), and tolerates the GPU taint. CPU and
    memory guarantees come from the card's catalog entry, per GPU (a slice counts as its share
    of a card). ``resource`` is what the chosen node advertises the offering as
    (``nvidia.com/gpu`` for a slice under the single MIG strategy or a share of a GPU not
    renamed; inventory.node_gpus), by default :func:`gpu_resource`; the node selector on the
    product label then picks the node's shape ("...-MIG-1g.10gb", "...-SHARED").
    ``room`` is the node's CPU (millicores) and memory (bytes) no pod requests yet
    (ClusterInventory.room): the catalog's guarantees are cut to it, so a GPU on a small
    cloud node (a g5.xlarge: 4 vCPUs, 16 GiB, less after system reservations) gets what the
    node has instead of a pod that is never scheduled. ``session_id`` is the billing session
    the pod is metered under.

    A CPU-only server asks for the catalog's ``cpu`` cores and memory (requests, so the
    scheduler counts them) and sees no GPU (``NVIDIA_VISIBLE_DEVICES=void``).

    Memory: the limit is the request (``mem_limit`` = ``mem_guarantee``), what the offering
    declares (or the node has left): a server that outgrows it is killed alone (its kernel
    dies, out of memory) instead of pressing the node into evicting its neighbours.
    """
    if not session_id:
        raise ValueError("session_id: every gputap pod names its billing session")
    if price_class not in ("on-demand", "spot"):
        raise ValueError(f"price_class must be on-demand or spot, not {price_class!r}")
    offering = placement.offering
    labels = {
        keys.USER: label(username),
        keys.SERVER: label(server_name or "default"),
        keys.COUNT: str(placement.count),
        keys.PRICE_CLASS: price_class,
    }
    annotations = {
        keys.USER: username,
        keys.SERVER: server_name,
        keys.OFFERING: offering.key,
        keys.PRICE_PER_HOUR: str(placement.price_per_hour_micro),
        keys.SESSION: session_id,
    }
    if course:
        labels[keys.COURSE] = label(course)
        annotations[keys.COURSE] = course
    if environment:
        annotations[keys.ENVIRONMENT] = environment
    settings: dict[str, Any] = {"extra_labels": labels, "extra_annotations": annotations}
    if offering.kind == "cpu":
        memory = f"{max(1, round(catalog.cpu_memory_gb))}G"
        settings.update(
            cpu_guarantee=catalog.cpu_cores,
            mem_guarantee=memory,
            mem_limit=memory,
            environment=dict(NO_GPUS),
        )
        return settings
    resource = resource or gpu_resource(placement)
    if not product:
        raise ValueError(f"{offering.key}: the node's {PRODUCT_LABEL} label is needed")
    labels[keys.CARD] = catalog.card(offering.card).sku
    if offering.kind in ("slice", "shared"):
        labels[keys.SLICE] = offering.profile if offering.kind == "slice" else "shared"
    cpu, memory = server_size(offering, catalog, placement.count)
    if room is not None:
        cpu_room, memory_room = max(0, room[0]), max(0, room[1])
        if cpu * 1000 > cpu_room:
            cpu = cpu_room // 10 / 100  # whole hundredths of a core, rounded down
        if int(memory[:-1]) * 10**9 > memory_room:
            memory = f"{memory_room // 2**20}Mi"
    settings.update(
        extra_resource_limits={resource: str(placement.count)},
        extra_resource_guarantees={resource: str(placement.count)},
        node_selector={PRODUCT_LABEL: product, **({HOSTNAME_LABEL: hostname} if hostname else {})},
        tolerations=list(GPU_TOLERATIONS),
        cpu_guarantee=cpu,
        mem_guarantee=memory,
        mem_limit=memory,
    )
    return settings


def server_size(offering: Offering, catalog: Catalog, count: int = 1) -> tuple[float, str]:
    """The CPU cores and memory (``"120G"``) ``count`` units of a GPU offering are given: the
    card's per-GPU share (a slice counts as its share of a card, a time-sliced share as a
    quarter)."""
    card = catalog.card(offering.card)
    share = 1.0
    if offering.kind == "slice":
        share = card.profile(offering.profile).compute_slices / card.mig_slices
    elif offering.kind == "shared":
        share = 0.25
    units = count * share
    return round(card.cpu_per_gpu * units, 2), f"{max(1, round(card.memory_gb_per_gpu * units))}G"


def _notebook_container(pod: V1Pod) -> Any:
    for container in pod.spec.containers:
        if container.name == keys.SERVER_CONTAINER:
            return container
    return pod.spec.containers[0]


def apply_pod_settings(pod: V1Pod, settings: dict[str, Any]) -> V1Pod:
    """``settings`` (what :func:`gpu_pod_settings` and ``disk_pod_settings`` make, keyed as
    the KubeSpawner options they add to, plus ``priority_class_name`` and the server
    container's ``image``; ``environment`` replaces the container's variables of the same
    names) added to the pod
    KubeSpawner built from its configuration: mappings merged over what is configured (ours
    win), lists appended, scalars set. Changes and returns ``pod``.

    This is what KubeSpawner's public ``get_pod_manifest`` hands on, so its own traits are
    never changed per spawn and a ``modify_pod_hook`` still sees the whole pod."""
    meta, spec = pod.metadata, pod.spec
    container = _notebook_container(pod)
    meta.labels = {**(meta.labels or {}), **settings.get("extra_labels", {})}
    meta.annotations = {**(meta.annotations or {}), **settings.get("extra_annotations", {})}
    resources = container.resources or V1ResourceRequirements()
    requests = {**(resources.requests or {}), **settings.get("extra_resource_guarantees", {})}
    for key, trait in (("cpu", "cpu_guarantee"), ("memory", "mem_guarantee")):
        if settings.get(trait) is not None:
            requests[key] = settings[trait]
    resources.requests = requests
    limits = {**(resources.limits or {}), **settings.get("extra_resource_limits", {})}
    # the offering's memory, over a configured limit (one below the request is invalid)
    if settings.get("mem_limit") is not None:
        limits["memory"] = settings["mem_limit"]
    resources.limits = limits
    container.resources = resources
    if settings.get("image"):
        container.image = settings["image"]
    if settings.get("environment"):
        ours = settings["environment"]
        kept = [e for e in container.env or [] if e.name not in ours]
        container.env = [*kept, *(V1EnvVar(name=k, value=v) for k, v in ours.items())]
    if settings.get("node_selector"):
        spec.node_selector = {**(spec.node_selector or {}), **settings["node_selector"]}
    if settings.get("tolerations"):
        added = [get_k8s_model(V1Toleration, t) for t in settings["tolerations"]]
        spec.tolerations = [*(spec.tolerations or []), *added]
    if settings.get("volumes"):
        added = [get_k8s_model(V1Volume, v) for v in settings["volumes"]]
        spec.volumes = [*(spec.volumes or []), *added]
    if settings.get("volume_mounts"):
        added = [get_k8s_model(V1VolumeMount, m) for m in settings["volume_mounts"]]
        container.volume_mounts = [*(container.volume_mounts or []), *added]
    if settings.get("lifecycle_hooks"):
        hooks = get_k8s_model(V1Lifecycle, settings["lifecycle_hooks"])
        if not container.lifecycle:  # KubeSpawner leaves {} when none is configured
            container.lifecycle = hooks
        else:  # keep the configured hooks we do not set (a preStop)
            container.lifecycle.post_start = hooks.post_start or container.lifecycle.post_start
            container.lifecycle.pre_stop = hooks.pre_stop or container.lifecycle.pre_stop
    if settings.get("priority_class_name"):
        spec.priority_class_name = settings["priority_class_name"]
    return pod
