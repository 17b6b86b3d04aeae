"""Spawn benchmarks on the simulated cluster, through the real hub and proxy.

(a) overhead: hub POST -> ready for GPUKubeSpawner vs stock KubeSpawner given an equivalent
    static profile_list (one MIG slice), same cluster, same run, N spawns each; median ratio.
    Target (issue 3): <= 1.10.
(b) class burst: U users (500) ask for a slice within W seconds (10), on stock KubeSpawner
    and on gputap in turn, the same cluster; time from each POST to the hub reporting the
    server ready, p50/p95, errors. Targets (issue 28): gputap 0 errors, p95 <= 15 s on a
    2-core machine; the ratio of its p95 to stock's is printed.

The single-user "server" is a minimal HTTP server (what the hub waits for), so the figures
measure the platform (hub, spawner, billing, API server, scheduler), not JupyterLab's start.

    .venv/bin/python bench/kube_spawn.py [--spawns 30] [--users 500] [--window 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.kube.conftest import create_priority_classes, kube_api  # noqa: E402
from tests.kube_sim.cluster import SimulatedCluster  # noqa: E402
from tests.platform import CONFIG, Platform  # noqa: E402

SERVER = """
import http.server, os, urllib.parse
url = urllib.parse.urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((url.hostname, url.port), Ok).serve_forever()
"""

STOCK = """
exec(open({config!r}).read())
c.JupyterHub.spawner_class = "kubespawner.KubeSpawner"
c.KubeSpawner.profile_list = [{{
    "display_name": "H100 1g.10gb slice",
    "slug": "slice",
    "kubespawner_override": {{
        "extra_resource_limits": {{"nvidia.com/mig-1g.10gb": "1"}},
        "extra_resource_guarantees": {{"nvidia.com/mig-1g.10gb": "1"}},
        "node_selector": {{"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "tolerations": [{{"key": "nvidia.com/gpu", "operator": "Exists",
                          "effect": "NoSchedule"}}],
    }},
}}]
"""

#: users a page of the hub's REST API holds (JupyterHub's default api_page_max_limit)
PAGE = 200

GPUTAP_OPTIONS = {"kind": "slice", "card": "H100-80GB", "profile": "1g.10gb"}
STOCK_OPTIONS = {"profile": "slice"}


def platform_for(root: Path, cluster, config: Path) -> Platform:
    root.mkdir(parents=True, exist_ok=True)
    kubeconfig = cluster.write_kubeconfig(str(root / "kubeconfig"), namespace="gputap")
    return Platform(
        root,
        extra={
            "hub": {"concurrent_spawn_limit": 500},
            "spawner": {
                "backend": "kubernetes",
                "start_timeout": 300,
                "kubernetes": {
                    "namespace": "gputap",
                    "hub_ip": cluster.host_ip,  # pods reach the host here, not at 127.0.0.1
                    "cmd": [sys.executable, "-c", SERVER],
                },
            },
        },
        env={"KUBECONFIG": kubeconfig},
        config=config,
    )


def spawn_and_wait(platform: Platform, user: str, options: dict) -> float:
    """Seconds from the POST to the hub reporting the server ready (201 means ready)."""
    start = time.perf_counter()
    r = platform.spawn(user, options)
    if r.status_code == 201:
        return time.perf_counter() - start
    if r.status_code != 202:
        raise RuntimeError(f"{user}: {r.status_code} {r.text}")
    deadline = start + 300
    while time.perf_counter() < deadline:
        server = platform.server(user)
        if server and server.get("ready"):
            return time.perf_counter() - start
        time.sleep(0.02)
    raise RuntimeError(f"{user} did not become ready")


def sequential(platform: Platform, prefix: str, options: dict, n: int) -> list[float]:
    times = []
    for i in range(n):
        user = f"{prefix}{i}"
        platform.create_user(user)
        times.append(spawn_and_wait(platform, user, options))
        platform.stop_server(user)
    return times


def ready_users(platform: Platform) -> set[str]:
    """Users whose default server the hub reports ready, page by page (the hub answers at
    most PAGE users a request: JupyterHub's api_page_max_limit)."""
    found: set[str] = set()
    offset = 0
    while True:
        params = {"state": "active", "offset": offset, "limit": PAGE}
        page = platform.get("/users", params=params).json()
        for user in page:
            server = user.get("servers", {}).get("")
            if server and server.get("ready"):
                found.add(user["name"])
        if len(page) < PAGE:
            return found
        offset += len(page)


def burst(platform: Platform, users: int, window: float, options: dict) -> tuple[list[float], int]:
    """Users POST spread over ``window`` seconds; one poller notes when the hub reports each
    ready. Seconds from each POST to ready, and how many got an error (a refusal, a failed
    spawn, not ready within 300 s)."""
    names = [f"student{i:03d}" for i in range(users)]
    for name in names:
        platform.create_user(name)
    asked: dict[str, float] = {}
    ready: dict[str, float] = {}
    errors: dict[str, str] = {}
    start = time.perf_counter()

    def post(i: int, name: str) -> None:
        time.sleep(max(0.0, start + i * window / users - time.perf_counter()))
        asked[name] = time.perf_counter()
        try:
            r = platform.spawn(name, options)
        except OSError as e:
            errors[name] = f"no answer: {e}"
            return
        if r.status_code == 201:
            ready.setdefault(name, time.perf_counter())
        elif r.status_code != 202:
            errors[name] = f"{r.status_code} {r.text[:200]}"

    with ThreadPoolExecutor(users) as pool:
        posts = [pool.submit(post, i, name) for i, name in enumerate(names)]
        deadline = start + window + 300
        while len(ready) + len(errors) < users and time.perf_counter() < deadline:
            now = time.perf_counter()
            for name in ready_users(platform):
                if name in asked:
                    ready.setdefault(name, now)
            time.sleep(0.1)
        for future in posts:
            future.result()
    for name in names:
        if name not in ready:
            errors.setdefault(name, "not ready within 300 s")
        platform.stop_server(name, wait=False)
    for name in names:
        platform.wait_stopped(name, timeout=300)
    for reason, count in Counter(e[:120] for e in errors.values()).most_common(5):
        print(f"    {count} × {reason}", file=sys.stderr)
    return [ready[n] - asked[n] for n in ready], len(errors)


def clear_pods(cluster, namespace: str = "gputap", timeout: float = 300) -> None:
    """Delete what a hub left in ``namespace`` (servers whose start it gave up on) and wait
    until it is empty: the next hub starts on the same free cluster."""
    api = kube_api(cluster)
    for pod in api.list_namespaced_pod(namespace).items:
        api.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    deadline = time.monotonic() + timeout
    while api.list_namespaced_pod(namespace).items:
        if time.monotonic() > deadline:
            raise RuntimeError(f"pods of {namespace} still there after {timeout} s")
        time.sleep(1)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=30)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--window", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, SimulatedCluster.run_in_thread(seed=1) as cluster:
        # 56 slices a node (8 H100 × 7): room for every user of the burst
        for i in range(args.users // 56 + 1):
            cluster.gpu_node(f"gpu-h100-{i}", product="NVIDIA-H100-80GB-HBM3", mig="all-1g.10gb",
                             cpu="256", memory="4Ti", pods=500)  # fmt: skip
        kube_api(cluster).create_namespace({"metadata": {"name": "gputap"}})
        create_priority_classes(cluster)
        root = Path(tmp)
        stock_config = root / "stock_config.py"
        stock_config.write_text(STOCK.format(config=str(CONFIG)))

        stock = platform_for(root / "stock", cluster, stock_config)
        stock.start()
        try:
            stock_times = sequential(stock, "s", STOCK_OPTIONS, args.spawns)
            stock_burst, stock_errors = burst(stock, args.users, args.window, STOCK_OPTIONS)
            print(f"stock median {statistics.median(stock_times):.3f} s", file=sys.stderr)
        finally:
            stock.shutdown()
        clear_pods(cluster)

        ours = platform_for(root / "gputap", cluster, CONFIG)
        ours.start()
        try:
            our_times = sequential(ours, "g", GPUTAP_OPTIONS, args.spawns)
            burst_times, errors = burst(ours, args.users, args.window, GPUTAP_OPTIONS)
            print(f"gputap median {statistics.median(our_times):.3f} s", file=sys.stderr)
        finally:
            ours.shutdown()

    ratio = statistics.median(our_times) / statistics.median(stock_times)
    print(f"(a) spawn overhead, POST -> ready, {args.spawns} spawns each, one H100 1g.10gb slice")
    print(f"    stock KubeSpawner + profile_list: median {statistics.median(stock_times):.3f} s")
    print(f"    GPUKubeSpawner:                   median {statistics.median(our_times):.3f} s")
    print(f"    ratio {ratio:.3f} (target <= 1.10: {'met' if ratio <= 1.10 else 'NOT met'})")
    print(f"(b) class burst: {args.users} users within {args.window:g} s")
    for label, times, failed in (
        ("stock KubeSpawner", stock_burst, stock_errors),
        ("GPUKubeSpawner", burst_times, errors),
    ):
        print(f"    {label}: {len(times)} ready, {failed} errors; time to ready "
              f"p50 {pct(times, 0.5):.2f} s  p95 {pct(times, 0.95):.2f} s  "
              f"max {max(times, default=float('nan')):.2f} s")  # fmt: skip
    p95, stock95 = pct(burst_times, 0.95), pct(stock_burst, 0.95)
    print(f"    target 0 errors: {'met' if errors == 0 else 'NOT met'}")
    print(f"    target p95 <= 15 s: {'met' if p95 <= 15 else 'NOT met'}")
    print(f"    p95 ratio to stock KubeSpawner's burst: {p95 / stock95:.2f}")


if __name__ == "__main__":
    main()
