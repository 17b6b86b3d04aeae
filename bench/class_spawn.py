"""A class arriving at once on one machine, through the real hub, proxy and billing.

U users (40) ask for a CPU server within W seconds (5) through the hub's REST API; a server
is ready when it answers through the proxy (GET /user/NAME/api/status with the user's token
answers 200). First gputap (GPULocalSpawner, billing on), then stock JupyterHub's
SimpleLocalProcessSpawner with the same JupyterLab, settings and services, in the same run.
Each hub first starts and stops one server, so both find the same warm caches.

Targets (issue 12): every gputap spawn ready (0 refusals); gputap's p95 at most 1.2 times
stock's.

    .venv/bin/python bench/class_spawn.py [--users 40] [--window 5]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.platform import CONFIG, Platform  # noqa: E402

STOCK = """
exec(open({config!r}).read())
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = {homes!r} + "/{{username}}"
c.Spawner.cmd = [{singleuser!r}]
# stock servers run as the hub's user: root, here
import os
c.Spawner.args = ["--allow-root"] if os.geteuid() == 0 else []
"""
SINGLEUSER = str(Path(sys.executable).parent / "jupyterhub-singleuser")
TIMEOUT = 600


def platform_for(root: Path, config: Path) -> Platform:
    root.mkdir(parents=True, exist_ok=True)
    return Platform(
        root,
        extra={"hub": {"concurrent_spawn_limit": 200}, "spawner": {"start_timeout": TIMEOUT}},
        config=config,
    )


class Class:
    """One class of users spawning on one platform: when each asked and when each was up."""

    def __init__(self, platform: Platform, names: list[str], options: dict | None):
        self.platform = platform
        self.names = names
        self.options = options
        self.tokens: dict[str, str] = {}
        self.asked: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.refused: dict[str, str] = {}
        self.lock = threading.Lock()

    def prepare(self) -> None:
        for name in self.names:
            self.platform.create_user(name)
            self.tokens[name] = self.platform.user_token(name)

    def up(self, name: str) -> bool:
        url = f"{self.platform.url}/user/{name}/api/status"
        try:
            r = requests.get(
                url,
                headers={"Authorization": f"token {self.tokens[name]}"},
                allow_redirects=False,
                timeout=5,
            )
        except requests.RequestException:
            return False
        return r.status_code == 200

    def post(self, name: str) -> None:
        with self.lock:
            self.asked[name] = time.perf_counter()
        try:
            r = self.platform.spawn(name, self.options)
        except requests.RequestException as e:
            message = f"no answer: {e}"
        else:
            if r.status_code in (201, 202):
                return
            try:
                message = f"{r.status_code}: {r.json().get('message')}"
            except ValueError:
                message = f"{r.status_code}: {r.text[:200]}"
        with self.lock:
            self.refused[name] = message

    def watch(self, posted: threading.Event) -> None:
        """One poller: the hub's list of active servers, then the proxy for those ready."""
        deadline = time.perf_counter() + TIMEOUT
        while time.perf_counter() < deadline:
            with self.lock:
                waiting = [n for n in self.names if n not in self.ready and n not in self.refused]
            if not waiting and posted.is_set():
                return
            active = {
                u["name"]: u.get("servers", {}).get("")
                for u in self.platform.get("/users", params={"state": "active"}).json()
            }
            for name in waiting:
                server = active.get(name)
                if server and server.get("ready") and self.up(name):
                    with self.lock:
                        self.ready[name] = time.perf_counter()
                elif server is None and posted.is_set() and name in self.asked:
                    if not self.platform.server(name):  # the spawn failed after its 202
                        with self.lock:
                            self.refused.setdefault(name, "the spawn failed (see the hub log)")
            time.sleep(0.25)

    def run(self, window: float) -> None:
        posted = threading.Event()
        watcher = threading.Thread(target=self.watch, args=(posted,))
        watcher.start()
        start = time.perf_counter()
        with ThreadPoolExecutor(len(self.names)) as pool:
            for i, name in enumerate(self.names):
                time.sleep(max(0.0, start + i * window / len(self.names) - time.perf_counter()))
                pool.submit(self.post, name)
            pool.shutdown(wait=True)
            posted.set()
            watcher.join()

    def times(self) -> list[float]:
        """Seconds from each user's POST to their server answering through the proxy."""
        return sorted(self.ready[n] - self.asked[n] for n in self.ready)


def warm_up(platform: Platform, options: dict | None) -> None:
    platform.create_user("warmup")
    r = platform.spawn("warmup", options)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("warmup", timeout=TIMEOUT)
    platform.stop_server("warmup")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run_class(platform: Platform, users: int, window: float, options: dict | None) -> Class:
    platform.start()
    try:
        warm_up(platform, options)
        group = Class(platform, [f"student{i:02d}" for i in range(users)], options)
        group.prepare()
        group.run(window)
        return group
    finally:
        platform.shutdown()


def report(label: str, group: Class) -> None:
    users, times = len(group.names), group.times()
    print(f"  {label}: {len(group.ready)} of {users} ready, {len(group.refused)} refused")
    print(f"    seconds to ready: p50 {pct(times, 0.5):.1f}  p95 {pct(times, 0.95):.1f}  "
          f"max {max(times, default=float('nan')):.1f}")  # fmt: skip
    reasons: dict[str, int] = {}
    for message in group.refused.values():
        reasons[message] = reasons.get(message, 0) + 1
    for message, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        print(f"    refused ×{count}: {message[:200]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=40)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--logs", type=Path, help="copy each hub's log into this folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ours = run_class(platform_for(root / "gputap", CONFIG), args.users, args.window,
                         {"kind": "cpu"})  # fmt: skip
        stock_config = root / "stock_config.py"
        homes = str(root / "stock" / "data" / "homes")
        stock_config.write_text(
            STOCK.format(config=str(CONFIG), homes=homes, singleuser=SINGLEUSER)
        )
        stock = run_class(platform_for(root / "stock", stock_config), args.users, args.window, None)
        if args.logs:
            args.logs.mkdir(parents=True, exist_ok=True)
            for group in (ours, stock):
                shutil.copy(group.platform.log_path, args.logs / f"{group.platform.root.name}.log")

    print(f"class arrival: {args.users} users ask for a CPU server within {args.window:g} s "
          "(ready: /user/NAME/api/status answers 200 through the proxy)")  # fmt: skip
    report("gputap (GPULocalSpawner, billing on)", ours)
    report("stock SimpleLocalProcessSpawner", stock)
    ratio = pct(ours.times(), 0.95) / pct(stock.times(), 0.95)
    all_ready = len(ours.ready) == args.users
    print(f"  p95 ratio gputap / stock: {ratio:.2f}")
    print(f"  target 0 refusals: {'met' if not ours.refused and all_ready else 'not met'}")
    print(f"  target p95 ratio <= 1.2: {'met' if ratio <= 1.2 else 'not met'}")


if __name__ == "__main__":
    main()
