"""Time the spawn form over a large cluster: 2,000 nodes / 16,000 GPUs.

The inventory is built the way the hub builds it, from node and pod objects through
ClusterInventory; one form render = the choices (free counts, prices, alternatives for
sold-out options) plus the HTML. Prints p50 / p99. Target (issue 3): p50 under 20 ms.

    .venv/bin/python bench/form_render.py [--nodes 2000] [--renders 300]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from spawner.core.catalog import Catalog
from spawner.core.choices import build_choices
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--renders", type=int, default=300)
    args = parser.parse_args()
    catalog = Catalog.load()
    inventory = build(catalog, args.nodes, random.Random(1))
    view = inventory.preemptible_view
    prices = {o.key: 100_000 + int(o.fp16_tflops * 10_000) for o in catalog.offerings()}
    whole = sum(view.total(k) for k in view.keys() if "/" not in k)
    slices = sum(view.total(k) for k in view.keys() if "/" in k)
    times = []
    for _ in range(args.renders):
        start = time.perf_counter()
        html = render_form(
            build_choices(view, catalog, prices),
            available_micro=10_000_000,
            currency="credits",
            simulated=False,
            preview_url="/hub/gputap/preview",
            spot_discount_percent=60,
        )
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    p50, p99 = times[len(times) // 2], times[int(len(times) * 0.99)]
    print(
        f"inventory: {args.nodes} nodes x 8 = {args.nodes * 8} GPUs: {whole} whole, the rest "
        f"MIG-partitioned into {slices} slices"
    )
    print(f"form: {len(html)} bytes, {len(view.keys()) + 1} options")
    print(f"one render: p50 {p50:.2f} ms  p99 {p99:.2f} ms  mean {statistics.fmean(times):.2f} ms")
    print(f"target p50 < 20 ms: {'met' if p50 < 20 else 'NOT met'}")


if __name__ == "__main__":
    main()
