"""Placement → the GPU parts of a single-user pod. Pure: keyword arguments in, a dict of
KubeSpawner trait values out (like kubespawner/objects.py's make_* functions).

Every gputap pod carries labels and annotations under one prefix, ``gputap.io/``, so billing
and operators can attribute it:

| key | label value | annotation value |
|---|---|---|
| ``gputap.io/user`` | label-safe slug | the username as is |
| ``gputap.io/server`` | slug ("" → "default") | the server name as is |
| ``gputap.io/offering`` | — | ``A100-80GB``, ``A100-80GB/1g.10gb`` or ``cpu`` |
| ``gputap.io/card`` | ``A100-80GB`` (absent for CPU only) | |
| ``gputap.io/slice`` | ``1g.10gb`` (slices), ``shared`` (time-sliced GPUs) | |
| ``gputap.io/count`` | ``2`` | |
| ``gputap.io/price-class`` | ``on-demand`` or ``spot`` | |
| ``gputap.io/course`` | course slug (when course-funded) | the course's key in billing |
| ``gputap.io/price-per-hour-micro`` | — | the price per unit at placement |
| ``gputap.io/session`` | — | the billing session id (the spawner's, one per start) |

Billing meters pods by these (billing_service/kube_meter.py): the session annotation is the id
under which the spawner posts the server's start and stop, so billing's pod meter, a second
source, records the same session and never a second one; the course annotation is the course
billing charges, as the spawner names it when it opens the session.
"""

from __future__ import annotations

from typing import Any

from kubespawner.slugs import is_valid_label, safe_slug

from .catalog import Catalog
from .kube_inventory import (
    GPU_RESOURCE,
    HOSTNAME_LABEL,
    MIG_PREFIX,
    PRODUCT_LABEL,
    SHARED_RESOURCE,
)
from .placement import Placement

PREFIX = "gputap.io/"
GPU_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def label(value: str) -> str:
    """Any string as a valid, collision-free label value."""
    return safe_slug(value, is_valid=is_valid_label, max_length=63) if value else ""


def gpu_resource(placement: Placement) -> str | None:
    offering = placement.offering
    if offering.kind == "slice":
        return f"{MIG_PREFIX}{offering.profile}"
    if offering.kind == "shared":
        return SHARED_RESOURCE
    return GPU_RESOURCE if offering.kind == "card" else None


def gpu_pod_settings(
    placement: Placement,
    catalog: Catalog,
    *,
    username: str,
    session_id: str,
    server_name: str = "",
    product: str | None = None,
    hostname: str | None = None,
    price_class: str = "on-demand",
    course: str = "",
) -> dict[str, Any]:
    """KubeSpawner settings for a placement.

    ``product`` is the GFD product label of the chosen node and ``hostname`` its
    ``kubernetes.io/hostname``: the pod is pinned to that node (node selectors on both, so the
    scheduler binds it where its GPUs were reserved), and tolerates the GPU taint. CPU and
    memory guarantees come from the card's catalog entry, per GPU (a slice counts as its share
    of a card). ``session_id`` is the billing session the pod is metered under.
    """
    if not session_id:
        raise ValueError("session_id: every gputap pod names its billing session")
    if price_class not in ("on-demand", "spot"):
        raise ValueError(f"price_class must be on-demand or spot, not {price_class!r}")
    offering = placement.offering
    labels = {
        f"{PREFIX}user": label(username),
        f"{PREFIX}server": label(server_name or "default"),
        f"{PREFIX}count": str(placement.count),
        f"{PREFIX}price-class": price_class,
    }
    annotations = {
        f"{PREFIX}user": username,
        f"{PREFIX}server": server_name,
        f"{PREFIX}offering": offering.key,
        f"{PREFIX}price-per-hour-micro": str(placement.price_per_hour_micro),
        f"{PREFIX}session": session_id,
    }
    if course:
        labels[f"{PREFIX}course"] = label(course)
        annotations[f"{PREFIX}course"] = course
    settings: dict[str, Any] = {"extra_labels": labels, "extra_annotations": annotations}
    resource = gpu_resource(placement)
    if resource is None:
        return settings
    if not product:
        raise ValueError(f"{offering.key}: the node's {PRODUCT_LABEL} label is needed")
    card = catalog.card(offering.card)
    labels[f"{PREFIX}card"] = card.sku
    share = 1.0
    if offering.kind == "slice":
        labels[f"{PREFIX}slice"] = offering.profile
        share = card.profile(offering.profile).compute_slices / 7
    elif offering.kind == "shared":
        labels[f"{PREFIX}slice"] = "shared"
        share = 0.25  # a time-sliced share: a quarter of a card's CPU and memory
    units = placement.count * share
    settings.update(
        extra_resource_limits={resource: str(placement.count)},
        extra_resource_guarantees={resource: str(placement.count)},
        node_selector={PRODUCT_LABEL: product, **({HOSTNAME_LABEL: hostname} if hostname else {})},
        tolerations=list(GPU_TOLERATIONS),
        cpu_guarantee=round(card.cpu_per_gpu * units, 2),
        mem_guarantee=f"{max(1, round(card.memory_gb_per_gpu * units))}G",
    )
    return settings
