"""After any death of the hub (``kill -9`` too) the next start owns exactly one billing and
one idle culler, and stopping the hub or `make demo` leaves none of what they started.

The processes of one platform are told apart by what their environment names: its settings
file (the hub, billing, the proxy) or its hub's API port (the idle culler).
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from tests.platform import ROOT, Platform
from tests.waiting import wait_for

KINDS = {
    "hub": "jupyterhub",
    "billing": "billing_service",
    "culler": "idle_culler",  # jupyterhub_idle_culler, or a wrapper of it
    "proxy": "configurable-http-proxy",
    "demo": "hub_config.demo",
}


def processes(platform: Platform) -> dict[str, set[int]]:
    """The live processes of ``platform``, by kind."""
    found: dict[str, set[int]] = {kind: set() for kind in KINDS}
    api_port = f"127.0.0.1:{platform.hub_port}/"
    for proc in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            env = proc.environ()
            ours = env.get("GPUTAP_SETTINGS") == str(platform.settings_path) or api_port in env.get(
                "JUPYTERHUB_API_URL", ""
            )
            if not ours:
                continue
            words = " ".join(proc.info["cmdline"] or [])
            # most specific first: the demo's command line also names jupyterhub's config
            for kind in ("demo", "billing", "culler", "proxy", "hub"):
                if KINDS[kind] in words:
                    found[kind].add(proc.pid)
                    break
    return found


def none_left(platform: Platform) -> bool:
    return not any(processes(platform).values())


@pytest.fixture
def platform(tmp_path):
    p = Platform(tmp_path)
    yield p
    p.shutdown()
    for pids in processes(p).values():  # never leave a test's services behind
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_hub_killed_with_sigkill_leaves_no_billing_or_culler_to_its_next_start(platform):
    platform.start()
    first = processes(platform)
    assert len(first["billing"]) == 1 and len(first["culler"]) == 1, first

    platform.proc.kill()  # kill -9: the hub cleans nothing up
    platform.proc.wait()
    gone = wait_for(
        lambda: not (processes(platform)["billing"] | processes(platform)["culler"]),
        lambda: f"the dead hub's services gone; still running: {processes(platform)}",
        timeout=20,
        step=0.2,
    )
    assert gone, f"the dead hub's services still run: {processes(platform)}"

    platform.start()
    again = processes(platform)
    assert len(again["billing"]) == 1 and len(again["culler"]) == 1, again
    for kind in ("billing", "culler"):
        [pid] = again[kind]
        assert psutil.Process(pid).ppid() == platform.proc.pid  # the new hub's own
    assert platform.billing_up()
    time.sleep(2)  # a billing that lost its port would have exited by now
    assert processes(platform)["billing"] == again["billing"]
    assert "Address already in use" not in platform.log_tail(400)

    platform.stop_hub()
    assert wait_for(
        lambda: none_left(platform),
        lambda: f"nothing left running; left: {processes(platform)}",
        timeout=20,
        step=0.2,
    ), f"left running: {processes(platform)}"


def _ignore_sigint() -> None:
    # what a script's background job gets from its shell: SIGINT ignored, kept across exec
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def running_demo(
    platform: Platform, own_group: bool = False, from_script: bool = False
) -> Iterator[subprocess.Popen]:
    """`make demo`'s program on ``platform``'s settings, once it says it runs; killed at the
    end if still running. ``own_group``: a process group of its own, as a terminal's
    foreground job; ``from_script``: SIGINT ignored, as a script's background job."""
    demo = subprocess.Popen(
        [sys.executable, "-m", "hub_config.demo"],
        cwd=ROOT,
        env={**platform._env(), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=own_group,
        preexec_fn=_ignore_sigint if from_script else None,
    )
    try:
        for line in demo.stdout:
            if "gputap is running" in line:
                break
        else:
            raise AssertionError(f"the demo did not start ({demo.wait()})")
        yield demo
    finally:
        if demo.poll() is None:
            demo.kill()
        demo.wait()


def test_stopping_the_demo_stops_everything_it_started_even_when_killed(platform):
    for how in (signal.SIGINT, signal.SIGKILL):  # Ctrl-C, and a demo killed outright
        with running_demo(platform) as demo:
            started = processes(platform)
            for kind in ("hub", "billing", "culler", "proxy"):
                assert started[kind], (kind, started)
            demo.send_signal(how)
            demo.wait(60)
            stopped = wait_for(
                lambda: none_left(platform),
                lambda how=how: f"nothing left after {how.name}; running: {processes(platform)}",
                timeout=40,
                step=0.2,
            )
            assert stopped, f"after {how.name} still running: {processes(platform)}"


@pytest.mark.parametrize("started_from", ["a terminal", "a script"])
def test_ctrl_c_stops_the_demo_and_all_it_started_at_once(platform, started_from):
    """The hub, the proxy, billing and the culler (servers keep running: README)."""
    with running_demo(platform, own_group=True, from_script=started_from == "a script") as demo:
        pressed = time.monotonic()
        os.killpg(demo.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
        demo.wait(30)
        wait_for(
            lambda: none_left(platform),
            lambda: f"nothing left after Ctrl-C; running: {processes(platform)}",
            timeout=30,
            step=0.1,
        )
        took = time.monotonic() - pressed
        # a minute when the services inherited an ignored SIGINT; the 5 s target is measured
        # by bench/demo_stop.py (four tests at once on two cores slow this one)
        assert took <= 20, f"Ctrl-C took {took:.1f} s to stop everything ({started_from})"
