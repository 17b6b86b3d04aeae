"""Scale-out on one machine with simulated cards (issue 17, docs/scale-out.md): workers added
to a running server, a small DDP model trained across the notebook and the workers with
``gputap.run`` (torchrun, c10d rendezvous on the notebook, gloo on the CPU build of PyTorch),
each worker billed from its start to its end, the kernel untouched; a worker killed mid-run;
credit running out with a group.

The servers run the data-science environment ``make setup`` builds (.venv-ds: torch 2.13)."""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import time
from datetime import datetime

import psutil
import pytest
import requests

from hub_config.environments import DATA_SCIENCE_DIR, DATA_SCIENCE_KEY, demo_environments
from tests.kernel import Kernel
from tests.platform import Platform

SLICE = {"kind": "slice", "card": "A100-80GB", "mig_profile": "1g.10gb"}
#: a DDP model, the same on every rank at the start (seed 0), fed different data per rank
TRAIN = """\
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
node = os.environ.get("GPUTAP_WORKER_NAME", "notebook")
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
ddp = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
data = torch.Generator().manual_seed(100 + rank)
steps, pause = int(sys.argv[1]), float(sys.argv[2])
for step in range(steps):
    x = torch.randn(16, 8, generator=data)
    opt.zero_grad()
    loss = ((ddp(x) - x.sum(1, keepdim=True)) ** 2).mean()
    loss.backward()
    opt.step()
    print(f"step {step} on {node} loss {loss.item():.4f}", flush=True)
    time.sleep(pause)
flat = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
print(f"final node={node} world={world} params={[round(v, 6) for v in flat]}", flush=True)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    if not (DATA_SCIENCE_DIR / "bin" / "gputap-worker").exists():
        pytest.fail(f"{DATA_SCIENCE_DIR} has no gputap-worker: `make setup` builds it")
    [(_, entry)] = demo_environments({}).items()
    p = Platform(
        tmp_path_factory.mktemp("scale-out"),
        extra={
            "environments": {DATA_SCIENCE_KEY: json.loads(entry)},
            "scale_out": {"idle_seconds": 0},
        },
    )
    p.start()
    yield p
    p.shutdown()


def workers_url(platform: Platform, name: str) -> str:
    return f"{platform.url}/hub/gputap/api/users/{name}/server/workers"


def group(platform: Platform, name: str, token: str) -> dict:
    r = requests.get(workers_url(platform, name), headers=auth(token), timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"token {token}"}


def start_notebook(platform: Platform, name: str) -> tuple[str, Kernel]:
    platform.create_user(name)
    token = platform.user_token(name)
    r = platform.spawn(name, {**SLICE, "environment": DATA_SCIENCE_KEY})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready(name, timeout=120)
    kernel = Kernel(platform.url, name, token)
    written = kernel.run(f"open('train.py', 'w').write({TRAIN!r})")
    assert written.status == "ok", written.error
    return token, kernel


FINAL = re.compile(r"\[rank (\d)\] final node=(\S+) world=(\d) params=(\[.*\])")


def finals(output: str) -> dict[str, list[float]]:
    """Each rank's final parameters, by the node it ran on."""
    return {m[2]: json.loads(m[4]) for m in FINAL.finditer(output)}


def worker_processes(platform: Platform, worker: str) -> list[psutil.Process]:
    """The reaper of the platform's worker ``worker`` (its process group's leader)."""
    homes = str(platform.root / "data")
    found = []
    for proc in psutil.process_iter(["cmdline", "cwd"]):
        cmdline = proc.info["cmdline"] or []
        if (
            "spawner.local.reaper" in cmdline
            and "--name" in cmdline
            and cmdline[cmdline.index("--name") + 1] == worker
            and (proc.info["cwd"] or "").startswith(homes)
        ):
            found.append(proc)
    return found


def run_processes(run_marker: str) -> list[psutil.Process]:
    """Every process of a run (launchers and ranks) still alive: they carry its rdzv id."""
    alive = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if any(run_marker in part for part in proc.info["cmdline"] or []):
            alive.append(proc)
    return alive


def parse(at: str) -> float:
    return datetime.fromisoformat(at).timestamp()


def test_two_workers_train_across_the_group_billed_to_the_second_kernel_intact(platform):
    token, kernel = start_notebook(platform, "ada")
    assert kernel.run("answer = 41").status == "ok"

    run = kernel.run(
        "import gputap\nresult = gputap.run('train.py', '12', '0', workers=2)\nprint(result.exits)",
        timeout=300,
    )
    assert run.status == "ok", run.error + run.text[-3000:]
    params = finals(run.text)
    # every rank, the notebook first (rank 0), ends with the same parameters
    assert sorted(params) == ["notebook", "w1", "w2"], run.text[-3000:]
    assert params["notebook"] == params["w1"] == params["w2"]
    assert "[rank 0] final node=notebook world=3" in run.text
    assert "{'notebook': 0, 'w1': 0, 'w2': 0}" in run.text

    view = group(platform, "ada", token)
    assert [w["state"] for w in view["workers"]] == ["ready", "ready"]
    assert {w["offering"] for w in view["workers"]} == {"A100-80GB/1g.10gb"}
    rates = [w["price_per_hour_micro"] * w["count"] for w in view["workers"]]
    assert view["rate_per_hour_micro"] == sum(rates) > 0
    sessions = {w["name"]: w["session_id"] for w in view["workers"]}

    # the magic runs again on the same workers: nothing new is started or billed
    again = kernel.run("%gputap_run train.py 3 0", timeout=300)
    assert again.status == "ok", again.error + again.text[-3000:]
    assert "final node=w2 world=3" in again.text
    assert {
        w["name"]: w["session_id"] for w in group(platform, "ada", token)["workers"]
    } == sessions
    assert kernel.run("print(answer + 1)").text.strip() == "42"

    reapers = {w: worker_processes(platform, w) for w in ("w1", "w2")}
    assert all(len(found) == 1 for found in reapers.values()), reapers
    if os.geteuid() == 0:  # agents run as the server's account: its token in their
        # environment is readable by ada's processes alone (test_server_accounts.py)
        ada = pwd.getpwnam("gputap-ada").pw_uid
        assert {found[0].uids().real for found in reapers.values()} == {ada}
    started = {w: found[0].create_time() for w, found in reapers.items()}
    asked = time.time()
    r = requests.delete(workers_url(platform, "ada"), headers=auth(token), timeout=30)
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 30
    while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE
              for found in reapers.values() for p in found):  # fmt: skip
        assert time.monotonic() < deadline, "the workers did not end"
        time.sleep(0.2)

    billed = {s["worker"]: s for s in platform.sessions("ada") if s.get("worker")}
    assert sorted(billed) == ["w1", "w2"]
    for name, session in billed.items():
        assert session["state"] == "ended"
        begun, ended = parse(session["started_at"]), parse(session["ended_at"])
        # from the moment its agent answered (after its process started) to the stop's request
        assert started[name] <= begun <= started[name] + 15
        assert abs(ended - asked) <= 1
        assert abs(session["billed_seconds"] - (ended - begun)) <= 1
        assert session["sku"] == "A100-80GB/1g.10gb" and session["server_name"] == ""
    assert group(platform, "ada", token)["count"] == 0
    platform.stop_server("ada")


def test_a_worker_killed_mid_run_is_reported_and_billed_to_its_death(platform):
    token, kernel = start_notebook(platform, "kim")
    scaled = kernel.run("import gputap\ngroup = gputap.scale(2)", timeout=180)
    assert scaled.status == "ok", scaled.error + scaled.text
    running = kernel.start("gputap.run('train.py', '400', '0.1')", timeout=300)
    deadline = time.monotonic() + 180
    while "step 3 on w2" not in running.text:
        assert time.monotonic() < deadline and not running.done.is_set(), running.text[-3000:]
        time.sleep(0.2)
    run_id = re.search(r"--rdzv-id=(\w+)", " ".join(_launchers(platform))).group(1)

    [reaper] = worker_processes(platform, "w2")
    killed = time.time()
    os.killpg(reaper.pid, signal.SIGKILL)
    assert running.done.wait(120), running.text[-3000:]
    assert running.status == "error"
    assert running.error.startswith("RunFailed: The run failed: w2:"), running.error

    # the hub says what happened; its session ended at its death, the other runs on
    deadline = time.monotonic() + 20
    while True:
        workers = {w["name"]: w for w in group(platform, "kim", token)["workers"]}
        if workers["w2"]["state"] == "failed" or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert workers["w2"]["state"] == "failed", workers
    assert "was killed (signal 9)" in workers["w2"]["reason"]
    assert workers["w1"]["state"] == "ready"
    [dead] = [s for s in platform.sessions("kim") if s.get("worker") == "w2"]
    assert dead["state"] == "ended" and abs(parse(dead["ended_at"]) - killed) <= 1
    [alive] = [s for s in platform.sessions("kim") if s.get("worker") == "w1"]
    assert alive["state"] == "running"

    # no launcher or rank of the run is left, anywhere
    deadline = time.monotonic() + 30
    while run_processes(run_id):
        assert time.monotonic() < deadline, [p.cmdline() for p in run_processes(run_id)]
        time.sleep(0.5)
    platform.stop_server("kim")
    [w1] = [s for s in platform.sessions("kim") if s.get("worker") == "w1"]
    assert w1["state"] == "ended"  # the group stopped with its server


def _launchers(platform: Platform) -> list[str]:
    return [
        " ".join(p.info["cmdline"] or [])
        for p in psutil.process_iter(["cmdline"])
        if "torch.distributed.run" in (p.info["cmdline"] or [])
    ]
