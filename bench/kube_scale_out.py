"""Scale-out on the simulated cluster (issue 17), through the real hub, proxy and billing.

The platform on its Kubernetes backend as tests/kube runs it (the chart's RBAC, homes
ReadWriteMany on an NFS CSI StorageClass, gputap-worker on the image's PATH), on 3 nodes of
4 A100-80GB each. A user's server on one A100 asks for W workers (8) on GPUs like its own.

Time from the request to every worker ready: POST {server}/workers {"count": W} with the
user's token, poll GET until all W are "ready"; then DELETE and wait until the hub reports
them stopped and every worker pod is gone from the cluster. R repeats (5); p50 and p95.
Target: p95 <= 15 s.

    .venv-jh55/bin/python bench/kube_scale_out.py [--repeats 5] [--workers 8]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.class_spawn import pct  # noqa: E402
from bench.scale_out import GROUP_TIMEOUT, USER, Group  # noqa: E402
from tests.kube.conftest import (  # noqa: E402
    NAMESPACE,
    gputap_cluster,
    kube_platform,
    rendered_rbac,
    shared_homes,
)

SERVER = {"kind": "card", "card": "A100-80GB", "count": 1}
NODES, GPUS_PER_NODE = 3, 4


def worker_pods(cluster) -> list[str]:
    """Names of the worker pods the cluster still lists, terminating ones included."""
    return [
        p["metadata"]["name"]
        for p in cluster.pods(NAMESPACE)
        if p["metadata"].get("labels", {}).get("gputap.io/role") == "worker"
    ]


def stop_group(group: Group, cluster) -> None:
    """DELETE the group; back when the hub reports it stopped and its pods are gone."""
    group.stop()
    deadline = time.perf_counter() + GROUP_TIMEOUT
    while pods := worker_pods(cluster):
        if time.perf_counter() > deadline:
            raise RuntimeError(f"worker pods left after {GROUP_TIMEOUT} s: {pods}")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=5, help="group starts to time (5)")
    parser.add_argument("--workers", type=int, default=8, help="workers in the group (8)")
    parser.add_argument("--log", type=Path, help="copy the hub's log to this file")
    args = parser.parse_args()
    if args.workers + 1 > NODES * GPUS_PER_NODE:
        sys.exit(f"--workers {args.workers}: the cluster has {NODES * GPUS_PER_NODE} A100s, "
                 f"one for the server")  # fmt: skip

    ready: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "chart").mkdir()
        with gputap_cluster(rendered_rbac(root / "chart", {}), seed=17) as cluster:
            for i in range(NODES):
                cluster.gpu_node(f"gpu-a100-{i}", product="NVIDIA-A100-SXM4-80GB",
                                 gpus=GPUS_PER_NODE, cpu="64", memory="512Gi")  # fmt: skip
            (root / "platform").mkdir()
            platform = kube_platform(
                cluster,
                root / "platform",
                kubernetes=shared_homes(cluster),
                # no idle stop between repeats; a group may stay up as long as the bench needs
                scale_out={"idle_seconds": 0, "max_workers": max(8, args.workers)},
            )
            platform.start()
            try:
                platform.create_user(USER)
                token = platform.user_token(USER)
                r = platform.spawn(USER, SERVER)
                if r.status_code not in (201, 202):
                    raise RuntimeError(f"the server was refused: {r.text}")
                platform.wait_ready(USER, timeout=180)
                group = Group(platform, token, options=None)
                for _ in range(args.repeats):
                    ready.append(group.scale(args.workers))
                    stop_group(group, cluster)
                platform.stop_server(USER)
            finally:
                if args.log:
                    args.log.write_bytes(platform.log_path.read_bytes())
                platform.shutdown()

    print(f"scale-out on the simulated cluster ({NODES} nodes x {GPUS_PER_NODE} A100-80GB): "
          f"a server on one A100 with {args.workers} workers on one A100 each")  # fmt: skip
    p50, p95 = pct(ready, 0.5), pct(ready, 0.95)
    print(f"request -> all {args.workers} workers ready, {args.repeats} repeats: "
          f"p50 {p50:.2f} s  p95 {p95:.2f} s  max {max(ready):.2f} s")  # fmt: skip
    print(f"    runs {' '.join(f'{v:.2f}' for v in ready)}")
    print(f"    target p95 <= 15 s: {'met' if p95 <= 15 else 'not met'}")


if __name__ == "__main__":
    main()
