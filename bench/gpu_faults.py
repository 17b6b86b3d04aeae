"""GPU faults (issue 18): from an injected fault to the device out of the pool, and to the
server running again elsewhere, through the real hub, proxy and billing.

One machine (``--backend local``): the simulated inventory of F + 2 T4s, its faults injected
as the inventory file's ``fault:`` entries (XID 79), read by the hub's watcher every
``faults.poll_seconds`` (2 s, the default). Kubernetes (``--backend kube``): the simulated
cluster (3 nodes of 8 L40S, the chart's RBAC), its device plugin marking the device
Unhealthy and the kubelet the pod's resource (as Kubernetes 1.36 does).

One user's server on one GPU; F times (20): inject a fault on the server's device, time
until the admin API lists it out of service, and until the server runs again on another
device (its change record "done"); faults.max_restarts is F, the default settings otherwise
(5 s for Lab to save). p50
and p95. Targets: out of the pool p95 <= 5 s (one machine), <= 30 s (Kubernetes); running
elsewhere p95 <= 60 s.

    .venv/bin/python bench/gpu_faults.py --backend local [--faults 20]
    .venv-jh55/bin/python bench/gpu_faults.py --backend kube [--faults 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.class_spawn import pct  # noqa: E402
from tests.platform import Platform  # noqa: E402

USER = "bench"
STEP_TIMEOUT = 180


def until(what: Callable[[], Any], what_for: str) -> float:
    """Poll ``what`` until true; the time it became true (perf_counter)."""
    deadline = time.perf_counter() + STEP_TIMEOUT
    while time.perf_counter() < deadline:
        if what():
            return time.perf_counter()
        time.sleep(0.1)
    raise RuntimeError(f"no {what_for} within {STEP_TIMEOUT} s")


class Bench:
    """The platform's admin and user APIs, as the bench reads them."""

    def __init__(self, platform: Platform):
        self.platform = platform
        self.token = ""

    def admin(self, path: str) -> dict[str, Any]:
        r = self.platform.api.get(f"{self.platform.url}/hub/gputap/api/{path}", timeout=30)
        r.raise_for_status()
        return r.json()

    def faults_seen(self) -> int:
        return len(self.admin("admin/gpu-faults?limit=1000")["faults"])

    def server(self) -> dict[str, Any]:
        r = requests.get(
            f"{self.platform.url}/hub/gputap/api/users/{USER}/server",
            headers={"Authorization": f"token {self.token}"},
            timeout=30,
        )
        r.raise_for_status()
        return r.json()

    def start(self, options: dict[str, Any]) -> None:
        self.platform.create_user(USER)
        self.token = self.platform.user_token(USER)
        r = self.platform.spawn(USER, options)
        if r.status_code not in (201, 202):
            raise RuntimeError(f"the server was refused: {r.text}")
        self.platform.wait_ready(USER, timeout=180)

    def time_fault(self, inject: Callable[[], None]) -> tuple[float, float]:
        """(seconds to out of the pool, seconds to running again) of one injected fault."""
        before = self.faults_seen()
        marker = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 1))
        started = time.perf_counter()
        inject()
        out = until(lambda: self.faults_seen() > before, "fault in the admin API")

        def back() -> bool:
            view = self.server()
            change = view.get("change") or {}
            return (
                bool(view["running"])
                and change.get("state") == "done"
                and (change.get("reason") == "fault" and change.get("started_at", "") >= marker)
            )

        running = until(back, "server running again")
        return out - started, running - started


def local(faults: int) -> tuple[list[float], list[float]]:
    gpus = [{"card": "T4"} for _ in range(faults + 2)]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        inventory = root / "inventory.yaml"

        def write() -> None:
            inventory.write_text(yaml.safe_dump({"node": "bench", "gpus": gpus}))

        write()
        platform = Platform(
            root,
            extra={
                "hub": {"admin_users": ["root"]},
                "spawner": {"inventory": "file", "inventory_file": str(inventory)},
                "faults": {"max_restarts": faults},
            },
        )
        platform.start()
        bench = Bench(platform)
        outs, backs = [], []
        try:
            bench.start({"kind": "card", "card": "T4"})
            for _ in range(faults):
                held = next(d for d in bench.admin("admin/gpus")["devices"] if d["held_by"] == USER)
                index = int(held["label"].split()[1].rstrip(":"))

                def inject(index: int = index) -> None:
                    gpus[index]["fault"] = {"xid": 79}
                    write()

                out, back = bench.time_fault(inject)
                outs.append(out)
                backs.append(back)
            platform.stop_server(USER)
        finally:
            platform.shutdown()
    return outs, backs


def kube(faults: int) -> tuple[list[float], list[float]]:
    from tests.kube.conftest import NAMESPACE, gputap_cluster, kube_platform, rendered_rbac
    from tests.kube.test_kube_spawn import pod_of

    nodes, per_node = 3, 8
    if faults + 1 > nodes * per_node:
        sys.exit(f"--faults {faults}: the cluster has {nodes * per_node} GPUs")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "chart").mkdir()
        with gputap_cluster(rendered_rbac(root / "chart", {}), seed=18) as cluster:
            for i in range(nodes):
                cluster.gpu_node(f"gpu-l40s-{i}", product="NVIDIA-L40S", gpus=per_node,
                                 memory_mib=46068, cpu="64", memory="512Gi")  # fmt: skip
            (root / "platform").mkdir()
            platform = kube_platform(
                cluster,
                root / "platform",
                hub={"admin_users": ["root"]},
                faults={"max_restarts": faults},
            )
            platform.start()
            bench = Bench(platform)
            outs, backs = [], []
            try:
                bench.start({"kind": "card", "card": "L40S"})
                for _ in range(faults):
                    pod = pod_of(cluster, USER)
                    [device] = cluster.visible_gpus(NAMESPACE, pod["metadata"]["name"])
                    node = pod["spec"]["nodeName"]

                    def inject(node: str = node, device: str = device) -> None:
                        cluster.gpu_fault(node, int(device.rsplit("-", 1)[1]))

                    out, back = bench.time_fault(inject)
                    outs.append(out)
                    backs.append(back)
                platform.stop_server(USER)
            finally:
                platform.shutdown()
    return outs, backs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--backend", choices=("local", "kube"), default="local")
    parser.add_argument("--faults", type=int, default=20, help="faults to inject (20)")
    args = parser.parse_args()
    outs, backs = (local if args.backend == "local" else kube)(args.faults)
    out_target = 5 if args.backend == "local" else 30
    where = "one machine (simulated inventory)" if args.backend == "local" else (
        "the simulated cluster (3 nodes x 8 L40S)"
    )  # fmt: skip
    print(f"GPU faults on {where}: {args.faults} faults on a running server's GPU")
    for name, values, target in (
        ("fault -> out of the pool", outs, out_target),
        ("fault -> running elsewhere", backs, 60),
    ):
        p50, p95 = pct(values, 0.5), pct(values, 0.95)
        print(f"{name}: p50 {p50:.2f} s  p95 {p95:.2f} s  max {max(values):.2f} s")
        print(f"    runs {' '.join(f'{v:.2f}' for v in values)}")
        print(f"    target p95 <= {target} s: {'met' if p95 <= target else 'not met'}")


if __name__ == "__main__":
    main()
