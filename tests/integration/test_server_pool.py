"""The server pool on one machine (spawner/local/pool.py, forkserver.py), through the real hub:
servers forked from a warm process per environment, each a fresh fork that serves one user,
as its user, with its GPU and nothing of the pool's; a pool killed or stale is replaced (the
start meanwhile waits for the new one); with the pool off every start is cold, as before."""

import os
import re
import sys
import time
from pathlib import Path

import psutil
import requests

from tests.platform import Platform

SLICE = {"kind": "slice", "card": "A100-80GB", "profile": "1g.10gb"}
CPU = {"kind": "cpu"}


def start(platform: Platform, name: str, options: dict = CPU) -> psutil.Process:
    """``name``'s server, started and ready; its recorded process (the reaper)."""
    platform.create_user(name)
    r = platform.spawn(name, options)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready(name)
    return psutil.Process(platform.server(name)["state"]["pid"])


def pool_of(platform: Platform) -> psutil.Process | None:
    """This platform's pool process (the hub's child marked GPUTAP_POOL), if any."""
    for proc in psutil.Process(platform.proc.pid).children():
        try:
            if proc.environ().get("GPUTAP_POOL") == "1":
                return proc
        except psutil.Error:
            continue
    return None


def wait_pool(platform: Platform, pools: int = 1, timeout: float = 60) -> psutil.Process:
    """The platform's pool process once ``pools`` of them have said they are ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = platform.log_path.read_text().count("gputap pool ")
        pool = pool_of(platform)
        if ready >= pools and pool is not None:
            return pool
        time.sleep(0.2)
    raise AssertionError(f"no pool ready:\n{platform.log_tail()}")


def sockets(pid: int) -> set[str]:
    links = (os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd"))
    return {link for link in links if link.startswith("socket:")}


def test_each_server_is_a_fresh_fork_of_the_pool_and_serves_one_user(platform):
    pool = wait_pool(platform)
    alice = start(platform, "alice", SLICE)
    bob = start(platform, "bob")
    assert alice.ppid() == bob.ppid() == pool.pid  # forked, not started cold
    assert alice.pid != bob.pid
    assert "forked from the server pool" in platform.log_path.read_text()
    # the pool itself serves nobody: no socket of it listens
    assert not [c for c in pool.net_connections() if c.status == psutil.CONN_LISTEN]
    platform.stop_server("alice")
    carol = start(platform, "carol")
    assert carol.ppid() == pool.pid and carol.pid not in (alice.pid, bob.pid)
    # each server's processes are its user's own account's
    uids = {name: proc.uids().real for name, proc in (("bob", bob), ("carol", carol))}
    if os.geteuid() == 0:
        assert uids["bob"] != uids["carol"] and 0 not in uids.values()
    for name in ("bob", "carol"):
        platform.stop_server(name)


def test_the_spawn_page_home_page_and_lab_say_how_long_the_start_took(platform):
    """The time to ready the hub shows is this start's: no longer than the test itself saw
    from its POST to the hub calling the server ready, in one sentence everywhere."""
    wait_pool(platform)
    platform.create_user("erin")
    asked = time.monotonic()
    assert platform.spawn("erin", SLICE).status_code in (201, 202)
    platform.wait_ready("erin")
    seen = time.monotonic() - asked
    # the Lab panel asks with the server's own token
    lab = {"Authorization": f"token {platform.server_env('erin')['JUPYTERHUB_API_TOKEN']}"}
    server = requests.get(f"{platform.url}/hub/gputap/api/users/erin/server", headers=lab)
    assert server.ok, server.text
    ready = server.json()["time_to_ready"]
    assert 0 < ready["seconds"] <= seen and ready["queued_seconds"] < ready["seconds"]
    shown = re.fullmatch(r"Ready (\d\.\d\d) s after Start", ready["message"])
    assert shown and abs(float(shown[1]) - ready["seconds"]) < 0.006, ready
    # the hub's home page lists it with the server
    user = {"Authorization": f"token {platform.user_token('erin')}"}
    running = requests.get(f"{platform.url}/hub/gputap/api/running", headers=user).json()
    assert [s["time_to_ready"] for s in running["servers"]] == [ready]
    # the spawn page's last line (JupyterHub's ready event) says it too
    messages: list[str] = []
    platform.follow_progress("erin", messages).join(30)
    assert messages[-1] == f"Server ready at /user/erin/, {shown[1]} s after Start"
    # a new start is measured anew
    platform.stop_server("erin")
    assert platform.spawn("erin", CPU).status_code in (201, 202)
    platform.wait_ready("erin")
    again = requests.get(f"{platform.url}/hub/gputap/api/users/erin/server", headers=user)
    assert again.json()["time_to_ready"]["seconds"] != ready["seconds"]
    platform.stop_server("erin")


def test_a_pooled_server_has_its_gpu_and_nothing_of_the_pools(platform):
    pool = wait_pool(platform)
    dave = start(platform, "dave", SLICE)
    assert dave.ppid() == pool.pid
    env = platform.server_env("dave")  # /proc/PID/environ, as the kernel shows it
    assert env["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
    assert env["GPUTAP_OFFERING"] == "A100-80GB/1g.10gb"
    assert env["JUPYTERHUB_USER"] == "dave" and "GPUTAP_START" in env
    # the claim's environment alone: nothing the pool process had of its own
    assert pool.environ()["GPUTAP_POOL"] == "1" and "GPUTAP_POOL" not in env
    assert "JUPYTERHUB_API_TOKEN" not in pool.environ()
    # ps shows what runs, as for a cold start
    command = " ".join(dave.cmdline())
    assert "spawner.local.reaper" in command and "jupyterhub-singleuser" in command
    # what JupyterLab keeps for the user goes to the user's home, not the pool's
    r = requests.put(
        f"{platform.url}/user/dave/lab/api/settings/@jupyterlab/apputils-extension:themes",
        headers={"Authorization": f"token {platform.user_token('dave')}"},
        json={"raw": '{"theme": "JupyterLab Dark"}'},
        timeout=30,
    )
    assert r.status_code == 204, r.text
    settings = Path(env["HOME"], ".jupyter/lab/user-settings/@jupyterlab/apputils-extension")
    assert (settings / "themes.jupyterlab-settings").exists()
    # no descriptor of the pool's channel to the hub is left in the server's processes
    channel = sockets(pool.pid)
    for proc in (dave, *dave.children(recursive=True)):
        assert not sockets(proc.pid) & channel, proc.cmdline()
    platform.stop_server("dave")


def test_a_killed_pool_is_replaced_and_the_start_waits_for_the_new_one(platform):
    pool = wait_pool(platform)
    ready = platform.log_path.read_text().count("gputap pool ")
    pool.kill()
    pool.wait(10)
    erin = start(platform, "erin")
    replaced = wait_pool(platform, pools=ready + 1)
    assert erin.ppid() == replaced.pid != pool.pid
    platform.stop_server("erin")


def test_a_stale_pool_is_replaced_once_its_environments_packages_change(platform):
    pool = wait_pool(platform)
    ready = platform.log_path.read_text().count("gputap pool ")
    site = sorted(Path(sys.prefix).glob("lib/python3*/site-packages"))[0]
    os.utime(site)  # as a pip install into the environment does
    gina = start(platform, "gina")  # not from the pool that imported older packages
    replaced = wait_pool(platform, pools=ready + 1)
    assert gina.ppid() == replaced.pid != pool.pid
    platform.stop_server("gina")


def test_with_the_pool_off_every_server_starts_cold_as_before(tmp_path):
    p = Platform(tmp_path, extra={"spawner": {"pool": {"enabled": False}}})
    p.start()
    try:
        ivy = start(p, "ivy")
        assert ivy.ppid() == p.proc.pid
        assert pool_of(p) is None
        assert "server pool" not in p.log_path.read_text()
    finally:
        p.shutdown()
