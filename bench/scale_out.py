"""Scale-out on one machine (issue 17), through the real hub, proxy and billing.

A user's server runs the data-science environment (.venv-ds, `make setup`) on a simulated
A100 1g.10gb slice; its workers are CPU workers (``options`` {"kind": "cpu"}), so that W of
them (4) fit beside it whatever else the machine's simulated cards hold.

(a) Time from the request to every worker ready: POST {server}/workers {"count": W} with the
    user's token, poll GET until all W are "ready"; then DELETE and wait until they are
    stopped. R repeats (5); p50 and p95. Target: p95 <= 10 s.
(b) Launch overhead of ``gputap.run`` over the same torchrun started by hand, on the group of
    W ready workers: a script that joins the process group (gloo), meets at a barrier and
    leaves. By hand, from the same kernel: the notebook's launcher with ``subprocess`` and each
    worker's through its agent (POST /run with the group's token), with the same arguments
    (``gputap.launch.launcher_args``), the same nodes, from the same folder; only gputap's own
    layer (asking the hub for the group, printing each line) is left out. Both are timed in
    the kernel, N runs each (5), interleaved, after one untimed run of each; median ratio.
    Target: <= 1.10.

    .venv/bin/python bench/scale_out.py [--repeats 5] [--runs 5] [--workers 4]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.class_spawn import pct  # noqa: E402
from hub_config.environments import DATA_SCIENCE_DIR, DATA_SCIENCE_KEY, demo_environments  # noqa: E402
from tests.kernel import Kernel  # noqa: E402
from tests.platform import Platform  # noqa: E402

USER = "bench"
SERVER = {"kind": "slice", "card": "A100-80GB", "mig_profile": "1g.10gb"}
WORKER = {"kind": "cpu"}
#: how long a group may take to start or stop before the bench gives up
GROUP_TIMEOUT = 120
RUN_TIMEOUT = 300

NOOP = """\
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
dist.destroy_process_group()
"""

#: the kernel's side of (b): each variant timed where it runs, the group read once beforehand
KERNEL_SETUP = """\
import http.client, json, os, subprocess, sys, threading, time, uuid
import gputap
from gputap.launch import free_port, launcher_args, node_env

open("noop.py", "w").write(NOOP)
GROUP = gputap.workers()
assert len(GROUP.ready) == WORKERS, GROUP.workers


def _remote(worker, body, exits):
    connection = http.client.HTTPConnection(worker["host"], int(worker["port"]))
    headers = {"Authorization": f"token {GROUP.token}", "Content-Type": "application/json"}
    connection.request("POST", "/run", json.dumps(body), headers)
    response = connection.getresponse()
    assert response.status == 200, response.status
    for raw in response:
        message = json.loads(raw)
        if "exit" in message:
            exits[worker["name"]] = message["exit"]
    connection.close()


def _drain(stream):
    for _ in stream:
        pass


def by_hand():
    ready, host = GROUP.ready, GROUP.rendezvous_host
    common = {"nodes": 1 + len(ready), "endpoint": f"{host}:{free_port(host)}",
              "run_id": uuid.uuid4().hex[:12], "nproc_per_node": 1, "max_restarts": 0}
    env = node_env([host, *(w["host"] for w in ready)])
    cwd = os.getcwd()
    exits = {}
    threads = [
        threading.Thread(target=_remote, args=(w, {
            "argv": ["python", *launcher_args("noop.py", (), local_addr=w["host"], **common)],
            "env": env, "cwd": cwd}, exits))
        for w in ready
    ]
    local = subprocess.Popen(
        [sys.executable, *launcher_args("noop.py", (), local_addr=host, **common)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, **env}, cwd=cwd, start_new_session=True, text=True, bufsize=1,
    )
    threads.append(threading.Thread(target=_drain, args=(local.stdout,)))
    for thread in threads:
        thread.start()
    local.wait()
    for thread in threads:
        thread.join()
    exits["notebook"] = local.returncode
    assert set(exits.values()) == {0} and len(exits) == 1 + len(ready), exits


def with_gputap():
    gputap.run("noop.py", nproc_per_node=1)


def timed(variant):
    start = time.perf_counter()
    variant()
    print(f"SECONDS {time.perf_counter() - start:.4f}")
"""
SECONDS = re.compile(r"SECONDS (\d+\.\d+)")


class Group:
    """The user's group through the hub's workers API, with the user's token; each worker
    on ``options`` (None: the server's own GPUs)."""

    def __init__(self, platform: Platform, token: str, options: dict | None = WORKER):
        self.url = f"{platform.url}/hub/gputap/api/users/{USER}/server/workers"
        self.headers = {"Authorization": f"token {token}"}
        self.options = options

    def view(self) -> dict:
        r = requests.get(self.url, headers=self.headers, timeout=30)
        r.raise_for_status()
        return r.json()

    def live(self) -> list[dict]:
        return [w for w in self.view()["workers"] if w["state"] not in ("stopped", "failed")]

    def scale(self, count: int) -> float:
        """Seconds from the POST to every one of ``count`` workers ready."""
        start = time.perf_counter()
        body = {"count": count} | ({"options": self.options} if self.options else {})
        r = requests.post(self.url, headers=self.headers, json=body, timeout=60)
        if r.status_code != 202:
            raise RuntimeError(f"the hub answered {r.status_code}: {r.text}")
        deadline = start + GROUP_TIMEOUT
        while time.perf_counter() < deadline:
            workers = self.view()["workers"]
            failed = [w for w in workers if w["state"] == "failed"]
            if failed:
                raise RuntimeError(f"{failed[0]['name']} failed: {failed[0]['reason']}")
            live = [w for w in workers if w["state"] != "stopped"]
            if len(live) == count and all(w["state"] == "ready" for w in live):
                return time.perf_counter() - start
            time.sleep(0.05)
        raise RuntimeError(f"workers not ready after {GROUP_TIMEOUT} s: {workers}")

    def stop(self) -> None:
        r = requests.delete(self.url, headers=self.headers, timeout=60)
        if r.status_code not in (202, 204):
            raise RuntimeError(f"the hub answered {r.status_code}: {r.text}")
        deadline = time.perf_counter() + GROUP_TIMEOUT
        while self.live():
            if time.perf_counter() > deadline:
                raise RuntimeError(f"workers not stopped after {GROUP_TIMEOUT} s")
            time.sleep(0.2)


def start_server(platform: Platform) -> tuple[str, Kernel]:
    platform.create_user(USER)
    token = platform.user_token(USER)
    r = platform.spawn(USER, {**SERVER, "environment": DATA_SCIENCE_KEY})
    if r.status_code not in (201, 202):
        raise RuntimeError(f"the server was refused: {r.text}")
    platform.wait_ready(USER, timeout=180)
    return token, Kernel(platform.url, USER, token)


def run_cell(kernel: Kernel, code: str) -> str:
    done = kernel.run(code, timeout=RUN_TIMEOUT)
    if done.status != "ok":
        raise RuntimeError(f"the cell failed: {done.error}\n{done.text[-3000:]}")
    return done.text


def launch_times(kernel: Kernel, workers: int, runs: int) -> dict[str, list[float]]:
    """Seconds of each run of each variant, as the kernel timed it."""
    run_cell(kernel, f"NOOP = {NOOP!r}\nWORKERS = {workers}\n{KERNEL_SETUP}")
    variants = {"gputap.run": "with_gputap", "by hand": "by_hand"}
    for function in variants.values():  # the first run of each warms the caches
        run_cell(kernel, f"timed({function})")
    times: dict[str, list[float]] = {label: [] for label in variants}
    for i in range(runs):
        order = list(variants.items())
        for label, function in order if i % 2 == 0 else reversed(order):
            text = run_cell(kernel, f"timed({function})")
            times[label].append(float(SECONDS.findall(text)[-1]))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=5, help="group starts to time (5)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each variant (5)")
    parser.add_argument("--workers", type=int, default=4, help="workers in the group (4)")
    parser.add_argument("--log", type=Path, help="copy the hub's log to this file")
    args = parser.parse_args()
    entries = demo_environments({})
    if not entries:
        sys.exit(f"{DATA_SCIENCE_DIR} is not built: `make setup` builds it")
    [entry] = entries.values()

    with tempfile.TemporaryDirectory() as tmp:
        platform = Platform(
            Path(tmp),
            extra={
                "environments": {DATA_SCIENCE_KEY: json.loads(entry)},
                "scale_out": {"idle_seconds": 0},
            },
        )
        platform.start()
        try:
            token, kernel = start_server(platform)
            group = Group(platform, token)
            ready: list[float] = []
            for i in range(args.repeats):
                ready.append(group.scale(args.workers))
                if i < args.repeats - 1:
                    group.stop()
            launches = launch_times(kernel, args.workers, args.runs)
            group.stop()
        finally:
            if args.log:
                args.log.write_bytes(platform.log_path.read_bytes())
            platform.shutdown()

    slice_ = f"{SERVER['card']} {SERVER['mig_profile']}"
    print(f"scale-out on one machine: a server on a simulated {slice_} slice with "
          f"{args.workers} CPU workers (options {json.dumps(WORKER)})")  # fmt: skip
    p50, p95 = pct(ready, 0.5), pct(ready, 0.95)
    print(f"(a) request -> all {args.workers} workers ready, {args.repeats} repeats: "
          f"p50 {p50:.2f} s  p95 {p95:.2f} s  max {max(ready):.2f} s")  # fmt: skip
    print(f"    target p95 <= 10 s: {'met' if p95 <= 10 else 'not met'}")
    ours, hand = statistics.median(launches["gputap.run"]), statistics.median(launches["by hand"])
    ratio = ours / hand
    print(f"(b) torchrun on the notebook and {args.workers} workers (noop.py: gloo, a barrier), "
          f"{args.runs} runs each, interleaved")  # fmt: skip
    print(f"    gputap.run: median {ours:.2f} s  (runs {_seconds(launches['gputap.run'])})")
    print(f"    by hand:    median {hand:.2f} s  (runs {_seconds(launches['by hand'])})")
    print(f"    ratio gputap / by hand: {ratio:.3f}")
    print(f"    target ratio <= 1.10: {'met' if ratio <= 1.10 else 'not met'}")


def _seconds(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


if __name__ == "__main__":
    main()
