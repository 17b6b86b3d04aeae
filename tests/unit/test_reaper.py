"""The reaper a one-machine server runs under (spawner/local/reaper.py), as a real process."""

import os
import signal
import subprocess
import time

import psutil

from spawner.local.reaper import reaper_command


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_servers_status_is_the_reapers_and_its_daemons_end_with_it(tmp_path):
    pids = tmp_path / "pids"
    # a daemon that ignores SIGTERM, double forked into a session of its own
    daemon = "trap '' TERM; sleep 600"
    script = f'(setsid sh -c "{daemon}" & echo $! > {pids}); sleep 0.5; exit 3'
    start = time.monotonic()
    done = subprocess.run([*reaper_command(), "sh", "-c", script], timeout=30)
    assert done.returncode == 3
    [pid] = pids.read_text().split()
    assert not alive(int(pid))
    assert time.monotonic() - start < 10  # SIGKILL after the grace period, not a hang


def test_the_hubs_signal_reaches_the_server_which_ends_as_it_would(tmp_path):
    ready = tmp_path / "ready"
    script = (
        f"trap 'echo bye > {tmp_path}/bye; exit 0' INT; touch {ready}; while :; do sleep 0.1; done"
    )
    reaper = subprocess.Popen([*reaper_command(), "sh", "-c", script], start_new_session=True)
    deadline = time.monotonic() + 10
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(reaper.pid, signal.SIGINT)  # JupyterHub's first stop signal
    assert reaper.wait(10) == 0
    assert (tmp_path / "bye").read_text() == "bye\n"


def test_a_reaper_killed_outright_takes_its_server_with_it(tmp_path):
    """kill -9 of the reaper (the pid the hub records) leaves no server running unbilled:
    the server is told (SIGTERM, so it ends its kernels) as its reaper dies."""
    ready, bye = tmp_path / "ready", tmp_path / "bye"
    script = f"trap 'echo bye > {bye}; exit 0' TERM; echo $$ > {ready}; while :; do sleep 0.1; done"
    reaper = subprocess.Popen([*reaper_command(), "sh", "-c", script], start_new_session=True)
    deadline = time.monotonic() + 10
    while not (ready.exists() and ready.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    server = int(ready.read_text())
    reaper.kill()
    reaper.wait(10)
    deadline = time.monotonic() + 5
    while alive(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(server), "the server outlived its reaper"
    assert bye.read_text() == "bye\n"
