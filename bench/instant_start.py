"""Start → JupyterLab usable on one machine: gputap with its server pool, gputap with the pool off,
and stock JupyterHub's SimpleLocalProcessSpawner, through the real hub, proxy and billing, in
one run (docs/instant-start.md).

1. Single starts, interleaved (pool, no pool, stock, pool, ...): the seconds from the spawn
   request until ``GET /user/NAME/lab`` answers 200 with JupyterLab's page through the proxy
   (polled every 20 ms), the server stopped before the next.
2. A class: U users (40) ask within W seconds (5) on each platform in turn; a server is ready
   when ``/user/NAME/api/status`` answers 200 through the proxy (bench/class_spawn.py).

Targets (issue 28): with the pool, single starts p50 ≤ 0.6 s and p95 ≤ 1.0 s; the class all
ready, 0 refused, p95 ≤ 15 s and at most 0.3 times stock's p95.

    .venv/bin/python bench/instant_start.py [--starts 15] [--users 40] [--window 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.class_spawn import SINGLEUSER, STOCK, TIMEOUT, Class, pct, warm_up  # noqa: E402
from tests.platform import CONFIG, Platform  # noqa: E402

CPU = {"kind": "cpu"}


def platform(root: Path, config: Path = CONFIG, pool: bool = True) -> Platform:
    root.mkdir(parents=True, exist_ok=True)
    spawner = {"start_timeout": TIMEOUT, "pool": {"enabled": pool}}
    return Platform(
        root, extra={"hub": {"concurrent_spawn_limit": 200}, "spawner": spawner}, config=config
    )


def stock_platform(root: Path) -> Platform:
    config = root / "stock_config.py"
    root.mkdir(parents=True, exist_ok=True)
    homes = str(root / "data" / "homes")
    config.write_text(STOCK.format(config=str(CONFIG), homes=homes, singleuser=SINGLEUSER))
    return platform(root, config)


def lab_usable(p: Platform, name: str, token: str, deadline: float) -> bool:
    url = f"{p.url}/user/{name}/lab"
    headers = {"Authorization": f"token {token}"}
    while time.perf_counter() < deadline:
        try:
            r = requests.get(url, headers=headers, allow_redirects=False, timeout=5)
            if r.status_code == 200 and "jupyter-config-data" in r.text:
                return True
        except requests.RequestException:
            pass
        time.sleep(0.02)
    return False


def single_start(p: Platform, name: str, options: dict | None) -> float:
    """Seconds from the spawn request to Lab's page; the server is stopped after."""
    p.create_user(name)
    token = p.user_token(name)
    asked = time.perf_counter()
    r = p.spawn(name, options)
    assert r.status_code in (201, 202), r.text
    assert lab_usable(p, name, token, asked + TIMEOUT), f"{name}: Lab never answered"
    took = time.perf_counter() - asked
    p.stop_server(name)
    return took


def run_class(p: Platform, users: int, window: float, options: dict | None) -> Class:
    group = Class(p, [f"student{i:02d}" for i in range(users)], options)
    group.prepare()
    group.run(window)
    return group


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=15)
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--window", type=float, default=5.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        platforms = {
            "gputap, pool": (platform(root / "pool"), CPU),
            "gputap, no pool": (platform(root / "cold", pool=False), CPU),
            "stock": (stock_platform(root / "stock"), None),
        }
        singles: dict[str, list[float]] = {label: [] for label in platforms}
        classes: dict[str, Class] = {}
        for p, _ in platforms.values():
            p.start()
        try:
            for p, options in platforms.values():
                warm_up(p, options)  # the same warm caches (and a ready pool) for all
            for i in range(args.starts):
                for label, (p, options) in platforms.items():
                    singles[label].append(single_start(p, f"single{i:02d}", options))
            for label, (p, options) in platforms.items():
                classes[label] = run_class(p, args.users, args.window, options)
                for name in classes[label].names:  # the next class gets the machine to itself
                    p.stop_server(name, wait=False)
                for name in classes[label].names:
                    p.wait_stopped(name, timeout=TIMEOUT)
        finally:
            for p, _ in platforms.values():
                p.shutdown()

    print(f"single starts: spawn request → Lab's page through the proxy ({args.starts} each, "
          "interleaved)")  # fmt: skip
    for label, times in singles.items():
        print(f"  {label}: p50 {pct(times, 0.5):.2f} s  p95 {pct(times, 0.95):.2f} s  "
              f"max {max(times):.2f} s")  # fmt: skip
    pooled = singles["gputap, pool"]
    p50, p95 = pct(pooled, 0.5), pct(pooled, 0.95)
    print(f"  target pool p50 <= 0.6 s: {'met' if p50 <= 0.6 else 'not met'} ({p50:.2f} s)")
    print(f"  target pool p95 <= 1.0 s: {'met' if p95 <= 1.0 else 'not met'} ({p95:.2f} s)")

    print(f"class: {args.users} users ask for a server within {args.window:g} s "
          "(ready: /user/NAME/api/status answers 200 through the proxy)")  # fmt: skip
    for label, group in classes.items():
        times = group.times()
        print(f"  {label}: {len(group.ready)} of {args.users} ready, {len(group.refused)} "
              f"refused; p50 {pct(times, 0.5):.1f} s  p95 {pct(times, 0.95):.1f} s")  # fmt: skip
    ours, stock = classes["gputap, pool"], classes["stock"]
    all_ready = len(ours.ready) == args.users and not ours.refused
    ours95, stock95 = pct(ours.times(), 0.95), pct(stock.times(), 0.95)
    ratio = ours95 / stock95 if stock95 else float("inf")
    print(f"  target all ready, 0 refused: {'met' if all_ready else 'not met'}")
    print(f"  target pool p95 <= 15 s: {'met' if ours95 <= 15 else 'not met'} ({ours95:.1f} s)")
    print(f"  target pool p95 / stock p95 <= 0.3: {'met' if ratio <= 0.3 else 'not met'} "
          f"({ratio:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
