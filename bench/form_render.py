"""Time the spawn form over a large cluster: 2,000 nodes / 16,000 GPUs, and 150 environments.

The inventory is built the way the hub builds it, from node and pod objects through
ClusterInventory; one form render = the choices (free counts, prices, alternatives for
sold-out options), the environments this user may choose, plus the HTML. Prints p50 / p99.
Target (issues 3 and 16): p50 under 20 ms with 150 environments × the whole inventory.

    .venv/bin/python bench/form_render.py [--nodes 2000] [--environments 150] [--renders 300]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from spawner.core.asking import Credit
from spawner.core.catalog import Catalog
from spawner.core.choices import build_choices
from spawner.core.environment_form import Picker
from spawner.core.environments import environments_from_settings
from spawner.core.form import render_form
from spawner.kube.inventory import ClusterInventory

CARDS = [
    ("A100-80GB", "NVIDIA-A100-SXM4-80GB", "1g.10gb"),
    ("H100-80GB", "NVIDIA-H100-80GB-HBM3", "1g.10gb"),
    ("H200-141GB", "NVIDIA-H200", "1g.18gb"),
    ("L40S", "NVIDIA-L40S", None),
    ("A40", "NVIDIA-A40", None),
    ("T4", "Tesla-T4", None),
]


def build(catalog: Catalog, nodes: int, rng: random.Random) -> ClusterInventory:
    inventory = ClusterInventory(catalog)
    for i in range(nodes):
        sku, product, profile = CARDS[i % len(CARDS)]
        if profile and i % 2:
            resource, units = f"nvidia.com/mig-{profile}", 56
        else:
            resource, units = "nvidia.com/gpu", 8
        name = f"gpu-{i:04d}"
        inventory.apply_node(
            "ADDED",
            {
                "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
                "spec": {},
                "status": {"allocatable": {resource: str(units), "cpu": "128"}},
            },
        )
        used = rng.randint(0, units)
        if used:
            inventory.apply_pod(
                "ADDED",
                {
                    "metadata": {"name": f"p{i}", "uid": f"p{i}"},
                    "spec": {
                        "nodeName": name,
                        "containers": [{"resources": {"limits": {resource: str(used)}}}],
                    },
                    "status": {"phase": "Running"},
                },
            )
    return inventory


FRAMEWORKS = ["PyTorch", "TensorFlow", "JAX", "vLLM", "RAPIDS", ""]


def catalog_of(n: int) -> dict[str, dict]:
    """``n`` environments as the settings declare them: one default, the rest with tags,
    frameworks and GPU needs; every fourth limited to a group the user is in, every fifth
    to a course the user is not in."""
    section = {"gputap": {"name": "gputap minimal", "tags": ["python"], "default": True}}
    for i in range(n - 1):
        entry = {
            "name": f"Environment {i} ({FRAMEWORKS[i % 6] or 'plain'})",
            "description": "A ready environment with its framework and CUDA.",
            "tags": [
                FRAMEWORKS[i % 6].lower() or "python",
                f"cuda-12.{i % 9}",
                f"py3.{10 + i % 3}",
            ],
            "framework": FRAMEWORKS[i % 6],
            "image": f"ghcr.io/acme/env-{i}:1",
            "needs": {"gpu": i % 3 == 0, "min_gpu_memory_gb": (i % 4) * 10},
        }
        if i % 4 == 1:
            entry["allowed"] = {"groups": ["lab-a"]}
        elif i % 5 == 2:
            entry["allowed"] = {"courses": ["cs-999"]}
        section[f"env-{i:03d}"] = entry
    return section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--environments", type=int, default=150)
    parser.add_argument("--renders", type=int, default=300)
    args = parser.parse_args()
    catalog = Catalog.load()
    environments = environments_from_settings(catalog_of(args.environments), "kubernetes")
    credit = Credit(10_000_000, 0, 10_000_000, 10_000_000, min_billable_seconds=60)
    inventory = build(catalog, args.nodes, random.Random(1))
    view = inventory.preemptible_view
    prices = {o.key: 100_000 + int(o.fp16_tflops * 10_000) for o in catalog.offerings()}
    whole = sum(view.total(k) for k in view.keys() if "/" not in k)
    slices = sum(view.total(k) for k in view.keys() if "/" in k)
    times = []
    for _ in range(args.renders):
        start = time.perf_counter()
        allowed = environments.allowed(["lab-a"], ["ml-101"])
        html = render_form(
            build_choices(view, catalog, prices),
            credit=credit,
            simulated=False,
            preview_url="/hub/gputap/preview",
            spot_discount_percent=60,
            picker=Picker(allowed, environments.default.key),
        )
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    p50, p99 = times[len(times) // 2], times[int(len(times) * 0.99)]
    print(
        f"inventory: {args.nodes} nodes x 8 = {args.nodes * 8} GPUs: {whole} whole, the rest "
        f"MIG-partitioned into {slices} slices"
    )
    print(
        f"form: {len(html)} bytes, {len(view.keys()) + 1} options, {len(allowed)} of "
        f"{args.environments} environments offered to this user"
    )
    print(f"one render: p50 {p50:.2f} ms  p99 {p99:.2f} ms  mean {statistics.fmean(times):.2f} ms")
    print(f"target p50 < 20 ms: {'met' if p50 < 20 else 'not met'}")


if __name__ == "__main__":
    main()
