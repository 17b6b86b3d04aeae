"""Time one placement decision over a large simulated inventory.

2,000 nodes × 8 GPUs of mixed cards, half of the nodes MIG-partitioned, random load.
Prints p50 / p99 / max of one `place()` call over a mix of card, slice, spec and CPU requests.
Target (issue 2): p50 under 1 ms.

    .venv/bin/python bench/placement.py [--nodes 2000] [--decisions 20000] [--seed 1]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from spawner.core.catalog import Catalog
from spawner.core.placement import (
    CardRequest,
    CpuRequest,
    FreeView,
    RequestError,
    SliceRequest,
    SpecRequest,
    place,
)

WHOLE = ["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "L40S", "L40", "A40", "RTX-4090",
         "RTX-3090", "T4"]  # fmt: skip
MIG = ["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "H800-80GB"]


def build(catalog: Catalog, nodes: int, rng: random.Random, busy: float) -> FreeView:
    """``busy``: the share of nodes that are completely taken."""
    view = FreeView()
    for i in range(nodes):
        node = f"gpu-{i:04d}"
        if i % 2:
            card = catalog.card(rng.choice(MIG))
            # 4 GPUs as 7 of the smallest slice each, 4 as two 3g slices each
            small = card.mig_profiles[0]
            half = next(p for p in card.mig_profiles if p.compute_slices == 3)
            for profile, units in ((small, 28), (half, 8)):
                free = 0 if rng.random() < busy else rng.randint(0, units)
                view.set(f"{card.sku}/{profile.name}", node, free, units)
        else:
            card = catalog.card(rng.choice(WHOLE))
            free = 0 if rng.random() < busy else rng.choice([0, 0, 1, 2, 3, 5, 8])
            view.set(card.sku, node, free, 8)
    return view


def requests(catalog: Catalog, rng: random.Random, n: int) -> list:
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.35:
            out.append(CardRequest(rng.choice(WHOLE), rng.choice([1, 1, 2, 4, 8])))
        elif r < 0.65:
            card = catalog.card(rng.choice(MIG))
            out.append(SliceRequest(card.sku, card.mig_profiles[0].name))
        elif r < 0.95:
            out.append(
                SpecRequest(rng.choice([10, 16, 24, 40, 80]), rng.choice([0, 50, 150, 300]),
                            rng.choice([1, 1, 2, 4]))
            )  # fmt: skip
        else:
            out.append(CpuRequest())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--decisions", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    catalog = Catalog.load()
    prices = {o.key: 100_000 + int(o.fp16_tflops * 10_000) for o in catalog.offerings()}
    batch = requests(catalog, rng, args.decisions)
    print(f"inventory: {args.nodes} nodes x 8 GPUs of mixed cards, half MIG-partitioned")
    for busy in (0.0, 0.99, 1.0):
        run(build(catalog, args.nodes, rng, busy), batch, catalog, prices, busy)


def run(view: FreeView, batch: list, catalog: Catalog, prices: dict[str, int], busy: float) -> None:
    times, placed, refused = [], 0, 0
    for request in batch:
        start = time.perf_counter_ns()
        try:
            answer = place(request, view, catalog, prices)
        except RequestError:
            answer = None
        times.append(time.perf_counter_ns() - start)
        if answer is not None and hasattr(answer, "node"):
            placed += 1
        else:
            refused += 1
    times.sort()
    p = lambda q: times[min(len(times) - 1, int(q * len(times)))] / 1e6  # noqa: E731
    free = sum(view.free(k) for k in view.keys())
    total = sum(view.total(k) for k in view.keys())
    print(f"\n{busy:.0%} of nodes full: {free} of {total} units free")
    print(f"  {len(times)} decisions: {placed} placed, {refused} refused (sold out) or invalid")
    print(
        f"  one placement: p50 {p(0.50):.3f} ms  p99 {p(0.99):.3f} ms"
        f"  max {times[-1] / 1e6:.3f} ms  mean {statistics.fmean(times) / 1e6:.3f} ms"
    )
    print(f"  target p50 < 1 ms: {'met' if p(0.50) < 1 else 'NOT met'}")


if __name__ == "__main__":
    main()
