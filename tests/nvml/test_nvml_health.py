"""GPU faults seen through NVML: the health watcher (spawner/local/health.py) runs in a child
Python whose pynvml loads the fake libnvidia-ml.so.1, and the test changes the machine file
under it (tests/nvml/README.md: EVENTS, ECC, REMAP, lost GPUs)."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests import waiting
from tests.nvml.conftest import ROOT, fake_nvml_env, write_machine

H200_UUID = "GPU-9d5e1c2a-6f0b-4b8e-a3c7-1e2f3a4b5c6d"
OTHER_UUID = "GPU-1b2c3d4e-6f0b-4b8e-a3c7-1e2f3a4b5c6d"
A100_UUID = "GPU-4a1c7e90-2d3b-4c5d-8e9f-0a1b2c3d4e5f"
MIG_3G_UUID = "MIG-77b0f1e2-3c4d-5e6f-7a8b-9c0d1e2f3a4b"
MIG_1G_A_UUID = "MIG-0c2e4f60-8a1b-5c3d-9e7f-1a2b3c4d5e6f"
MIG_1G_B_UUID = "MIG-5d6e7f80-9a0b-5c1d-8e2f-3a4b5c6d7e8f"
RTX_UUID = "GPU-00000000-0000-0000-0000-000000004090"

H200 = f"NVIDIA H200|{H200_UUID}|143771|off"
OTHER_H200 = f"NVIDIA H200|{OTHER_UUID}|143771|off"
# GPU instances as an A100 numbers them: the 3g.40gb is 1, the 1g.10gb ones 7 and 8
A100_MIG = f"""
    NVIDIA A100-SXM4-80GB|{A100_UUID}|81920|on;
    @0|NVIDIA A100-SXM4-80GB MIG 3g.40gb|{MIG_3G_UUID}|40192;
    @3|NVIDIA A100-SXM4-80GB MIG 1g.10gb|{MIG_1G_A_UUID}|9984;
    @5|NVIDIA A100-SXM4-80GB MIG 1g.10gb|{MIG_1G_B_UUID}|9984
"""
A100_LOST = f"NVIDIA A100-SXM4-80GB|{A100_UUID}|81920|lost"
RTX = f"NVIDIA GeForce RTX 4090|{RTX_UUID}|24564|none"

# Runs in the child: the watcher on an asyncio loop, each report, drain and log record as
# one JSON line; a line on stdin stops it.
WATCH = textwrap.dedent(
    """
    import asyncio, json, logging, sys, threading
    from spawner.core.catalog import Catalog
    from spawner.local.health import LocalHealthWatcher

    class Lines(logging.Handler):
        def emit(self, record):
            print(json.dumps({"log": record.getMessage(), "level": record.levelname}), flush=True)

    async def main():
        options = json.loads(sys.argv[1])
        logging.basicConfig(level=logging.INFO, handlers=[Lines()])
        loop = asyncio.get_running_loop()
        loop_thread = threading.current_thread()

        def on_loop():
            return threading.current_thread() is loop_thread

        def report(fault):
            print(json.dumps({"fault": fault.view(), "on_loop": on_loop()}), flush=True)

        def drain(gpu, note):
            print(json.dumps({"drain": [gpu, note], "on_loop": on_loop()}), flush=True)

        watcher = LocalHealthWatcher(
            report=report,
            drain=drain,
            mode="nvml",
            inventory_file="hub_config/simulated-inventory.yaml",
            catalog=Catalog.load(),
            exclude=options["exclude"],
            node="ws",
            poll_seconds=0.2,
            ignore_xids=set(options["ignore_xids"]),
        )
        watcher.start()
        await loop.run_in_executor(None, sys.stdin.readline)
        await watcher.stop()
        print(json.dumps({"stopped": True}), flush=True)

    asyncio.run(main())
    """
)


class WatcherProcess:
    """The child running the watcher, and what it has said."""

    def __init__(self, child: subprocess.Popen[str]):
        self.child = child
        self.said: list[dict[str, Any]] = []
        self._lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.child.stdout is not None
        for line in self.child.stdout:
            self._lines.put(json.loads(line))
        self._lines.put(None)

    def _next(self, deadline: float) -> dict[str, Any] | None:
        try:
            message = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None
        if message is None:
            pytest.fail(f"the watcher's process ended: {self.logs()}")
        self.said.append(message)
        return message

    def _next_such(self, such: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
        """The next message said within a tenth of a second, if ``such`` holds for it."""
        message = self._next(time.monotonic() + 0.1)
        return message if message is not None and such(message) else None

    def wait_for(self, key: str, timeout: float = 10.0) -> dict[str, Any]:
        """The next message carrying ``key`` (fault, drain, log)."""
        return waiting.wait_for(
            lambda: self._next_such(lambda m: key in m),
            lambda: f"a message with {key}; said: {self.said}",
            timeout,
            step=0,  # _next_such waits for the next message itself
        )

    def wait_log(self, text: str, timeout: float = 10.0) -> None:
        waiting.wait_for(
            lambda: self._next_such(lambda m: text in m.get("log", "")),
            lambda: f"a log line with {text!r}; said: {self.said}",
            timeout,
            step=0,
        )

    def findings(self, seconds: float) -> list[dict[str, Any]]:
        """The reports and drains said within ``seconds``."""
        deadline = time.monotonic() + seconds
        found = []
        while time.monotonic() < deadline:
            message = self._next(deadline)
            if message is not None and ("fault" in message or "drain" in message):
                found.append(message)
        return found

    def logs(self, level: str | None = None) -> list[str]:
        return [m["log"] for m in self.said if "log" in m and level in (None, m["level"])]

    def stop(self) -> None:
        if self.child.poll() is None:
            assert self.child.stdin is not None
            self.child.stdin.write("\n")
            self.child.stdin.flush()
            self.wait_for("stopped", timeout=5)
            assert self.child.wait(timeout=5) == 0


@pytest.fixture
def machine(tmp_path) -> Path:
    return tmp_path / "machine"


@pytest.fixture
def watch(fake_nvml_dir, machine):
    """``watch(exclude=..., ignore_xids=..., library=...)``: the watcher running on the
    machine file, once it has taken its first reading."""
    started: list[WatcherProcess] = []

    def start(
        exclude: list[str] | None = None,
        ignore_xids: list[int] | None = None,
        library: Path | None = None,
    ) -> WatcherProcess:
        env = fake_nvml_env(library or fake_nvml_dir, file=str(machine))
        options = {"exclude": exclude or [], "ignore_xids": ignore_xids or []}
        child = subprocess.Popen(
            [sys.executable, "-c", WATCH, json.dumps(options)],
            env=env,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        watcher = WatcherProcess(child)
        started.append(watcher)
        watcher.wait_log("GPU health: watching")
        return watcher

    yield start
    for watcher in started:
        if watcher.child.poll() is None:
            watcher.child.kill()
            watcher.child.wait()


def fault_of(message: dict[str, Any]) -> tuple[str, str, str, list[str], str]:
    fault = message["fault"]
    assert message["on_loop"], "report must be called on the event loop"
    assert (fault["source"], fault["node"]) == ("nvml", "ws")
    detected = datetime.fromisoformat(fault["detected_at"])
    assert abs((datetime.now(UTC) - detected).total_seconds()) < 5
    return fault["kind"], fault["detail"], fault["gpu"], fault["devices"]


def test_xid_79_takes_out_the_whole_gpu_once(watch, machine):
    write_machine(machine, DEVICES=f"{H200};{OTHER_H200}")
    watcher = watch()
    write_machine(machine, DEVICES=f"{H200};{OTHER_H200}", EVENTS=f"1|{H200_UUID}|xid|79")
    assert fault_of(watcher.wait_for("fault")) == (
        "xid",
        "XID 79 (GPU has fallen off the bus)",
        H200_UUID,
        [H200_UUID],
    )
    assert watcher.findings(1.0) == []  # the event came once; so does the report
    watcher.stop()


@pytest.mark.parametrize("driver", ["current", "old"])
def test_an_xid_naming_an_instance_takes_out_that_mig_device_only(
    watch, machine, driver, fake_nvml_old_dir
):
    old = driver == "old"
    # R460 names MIG devices MIG-<GPU UUID>/<GPU instance>/<compute instance>
    slice_3g, slice_a, slice_b = (
        (f"MIG-{A100_UUID}/1/0", f"MIG-{A100_UUID}/7/0", f"MIG-{A100_UUID}/8/0")
        if old
        else (MIG_3G_UUID, MIG_1G_A_UUID, MIG_1G_B_UUID)
    )
    write_machine(machine, DEVICES=f"{H200};{A100_MIG}")
    watcher = watch(library=fake_nvml_old_dir if old else None)

    write_machine(
        machine, DEVICES=f"{H200};{A100_MIG}", EVENTS=f"1|{A100_UUID}|xid|94|8|0"
    )  # GPU instance 8, compute instance 0: the second 1g.10gb
    assert fault_of(watcher.wait_for("fault")) == (
        "xid",
        "XID 94 (contained ECC error)",
        A100_UUID,
        [slice_b],
    )
    write_machine(
        machine,
        DEVICES=f"{H200};{A100_MIG}",
        EVENTS=f"1|{A100_UUID}|xid|94|8|0; 2|{A100_UUID}|xid|79",
    )  # no instance: every MIG device of the GPU, not the GPU itself
    assert fault_of(watcher.wait_for("fault")) == (
        "xid",
        "XID 79 (GPU has fallen off the bus)",
        A100_UUID,
        [slice_3g, slice_a, slice_b],
    )
    watcher.stop()


def test_application_xids_and_ignored_xids_are_logged_and_never_reported(watch, machine):
    write_machine(machine, DEVICES=H200)
    watcher = watch(ignore_xids=[92])
    write_machine(
        machine,
        DEVICES=H200,
        EVENTS=f"1|{H200_UUID}|xid|13; 2|{H200_UUID}|xid|92; 3|{H200_UUID}|xid|31; "
        f"4|{H200_UUID}|xid|48",
    )
    # events come in order: when XID 48 is reported, the three before it were not
    assert fault_of(watcher.wait_for("fault"))[1] == "XID 48 (double-bit ECC error)"
    assert watcher.findings(0.5) == []
    logs = watcher.logs("INFO")
    assert f"GPU {H200_UUID}: XID 13, not a GPU fault: ignored" in logs
    ignored = f"GPU {H200_UUID}: XID 92 (high single-bit ECC error rate), not a GPU fault"
    assert f"{ignored}: ignored" in logs
    assert f"GPU {H200_UUID}: XID 31, not a GPU fault: ignored" in logs
    watcher.stop()


def test_a_double_bit_ecc_event_is_an_ecc_fault_of_the_gpu(watch, machine):
    write_machine(machine, DEVICES=f"{H200};{A100_MIG}")
    watcher = watch()
    write_machine(machine, DEVICES=f"{H200};{A100_MIG}", EVENTS=f"7|{A100_UUID}|dbe|0")
    assert fault_of(watcher.wait_for("fault")) == (
        "ecc",
        "double-bit ECC error",
        A100_UUID,
        [MIG_3G_UUID, MIG_1G_A_UUID, MIG_1G_B_UUID],
    )
    watcher.stop()


def test_an_ecc_count_rising_is_reported_again_only_when_it_rises_further(watch, machine):
    write_machine(machine, DEVICES=f"{H200};{OTHER_H200}", ECC=f"{H200_UUID}|0|4")
    watcher = watch()
    write_machine(machine, DEVICES=f"{H200};{OTHER_H200}", ECC=f"{H200_UUID}|2|6")
    assert fault_of(watcher.wait_for("fault")) == (
        "ecc",
        "2 uncorrected ECC errors",
        H200_UUID,
        [H200_UUID],
    )
    # the same count again (another change of the machine) is nothing new
    write_machine(
        machine, DEVICES=f"{H200};{OTHER_H200}", ECC=f"{H200_UUID}|2|6", USE=f"{H200_UUID}|5|0|0"
    )
    assert watcher.findings(1.0) == []
    write_machine(machine, DEVICES=f"{H200};{OTHER_H200}", ECC=f"{H200_UUID}|3|7")
    assert fault_of(watcher.wait_for("fault"))[1] == "3 uncorrected ECC errors"
    watcher.stop()


def test_an_ecc_count_already_there_at_the_start_is_not_a_fault(watch, machine):
    write_machine(machine, DEVICES=H200, ECC=f"{H200_UUID}|5|5")
    watcher = watch()
    assert watcher.findings(1.0) == []
    write_machine(machine, DEVICES=H200, ECC=f"{H200_UUID}|6|6")
    assert fault_of(watcher.wait_for("fault"))[1] == (
        "6 uncorrected ECC errors (5 when the watch began)"
    )
    watcher.stop()


def test_a_failed_row_remap_is_a_fault_of_every_device_on_the_gpu(watch, machine):
    write_machine(machine, DEVICES=f"{H200};{A100_MIG}")
    watcher = watch()
    write_machine(machine, DEVICES=f"{H200};{A100_MIG}", REMAP=f"{A100_UUID}|0|3|0|1")
    assert fault_of(watcher.wait_for("fault")) == (
        "remap",
        "row remapping failed",
        A100_UUID,
        [MIG_3G_UUID, MIG_1G_A_UUID, MIG_1G_B_UUID],
    )
    assert watcher.findings(1.0) == []
    watcher.stop()


def test_a_pending_row_remap_drains_the_gpu_once_and_is_no_fault(watch, machine):
    write_machine(machine, DEVICES=f"{H200};{OTHER_H200}")
    watcher = watch()
    write_machine(machine, DEVICES=f"{H200};{OTHER_H200}", REMAP=f"{OTHER_UUID}|0|1|1|0")
    drained = watcher.wait_for("drain")
    assert drained == {
        "drain": [OTHER_UUID, "row remap pending: needs a GPU reset"],
        "on_loop": True,
    }
    assert watcher.findings(1.0) == []
    watcher.stop()


def test_a_lost_gpu_is_reported_once_with_the_mig_devices_it_had(watch, machine):
    write_machine(machine, DEVICES=f"{H200};{A100_MIG}")
    watcher = watch()
    write_machine(machine, DEVICES=f"{H200};{A100_LOST}")
    assert fault_of(watcher.wait_for("fault")) == (
        "lost",
        "GPU is lost: NVML cannot reach it",
        A100_UUID,
        [MIG_3G_UUID, MIG_1G_A_UUID, MIG_1G_B_UUID],
    )
    assert watcher.findings(1.0) == []
    # every call failing for it is lost too (FAIL_CALLS), for a GPU without MIG
    write_machine(machine, DEVICES=f"{H200};{A100_LOST}", FAIL_CALLS=f"*@{H200_UUID}=GPU_IS_LOST")
    assert fault_of(watcher.wait_for("fault"))[0::2] == ("lost", H200_UUID)
    watcher.stop()


def test_a_card_without_ecc_reports_nothing_of_ecc_or_remapping_and_raises_no_error(watch, machine):
    write_machine(machine, DEVICES=f"{RTX};{H200}")
    watcher = watch()
    write_machine(
        machine,
        DEVICES=f"{RTX};{H200}",
        ECC=f"{RTX_UUID}|9|9; {H200_UUID}|1|1",
        REMAP=f"{RTX_UUID}|0|2|1|1",
        EVENTS=f"1|{RTX_UUID}|dbe|0",
    )
    # the H200's count, read in the same pass, is the only finding
    assert fault_of(watcher.wait_for("fault"))[2] == H200_UUID
    assert watcher.findings(1.0) == []
    assert [line for line in watcher.logs("WARNING") if RTX_UUID in line] == []
    assert not [m for m in watcher.said if m.get("level") == "ERROR"]
    watcher.stop()


# Runs in the child: an event wait of 3 s on one thread while the inventory is read.
WAIT_AND_READ = textwrap.dedent(
    """
    import json, threading, time
    from spawner.core.catalog import Catalog
    from spawner.local import nvml
    from spawner.local.inventory import nvml_devices

    watch = nvml.EventWatch()
    waited = {}

    def wait():
        start = time.monotonic()
        waited["event"] = watch.wait(3000)
        waited["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.3)
    start = time.monotonic()
    devices = nvml_devices(Catalog.load())
    read = time.monotonic() - start
    thread.join()
    watch.close()
    print(json.dumps({"read": read, "devices": len(devices), **waited}))
    """
)


def test_an_event_wait_does_not_hold_up_the_inventory(fake_nvml_dir, machine):
    write_machine(machine, DEVICES=f"{H200};{A100_MIG}")
    env = fake_nvml_env(fake_nvml_dir, file=str(machine))
    child = subprocess.run(
        [sys.executable, "-c", WAIT_AND_READ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    answer = json.loads(child.stdout.strip().splitlines()[-1])
    assert answer["devices"] == 4
    assert answer["event"] is None and answer["seconds"] >= 2.9  # nothing came: a timeout
    assert answer["read"] < 1.5  # not after the wait's 3 s


# The hub's way out: its loop ends (SIGTERM) without anyone stopping the watcher.
LEFT_RUNNING = textwrap.dedent(
    """
    import asyncio
    from spawner.core.catalog import Catalog
    from spawner.local.health import LocalHealthWatcher

    async def main():
        watcher = LocalHealthWatcher(
            report=print,
            mode="nvml",
            inventory_file="hub_config/simulated-inventory.yaml",
            catalog=Catalog.load(),
            poll_seconds=0.2,
        )
        watcher.start()
        await asyncio.sleep(1.5)  # its event thread waits for XIDs now
        print("leaving", flush=True)

    asyncio.run(main())
    """
)


def test_a_process_whose_loop_ends_exits_though_its_watcher_was_never_stopped(
    fake_nvml_dir, machine
):
    """A hub told to stop (SIGTERM) ends its loop without stopping the watcher: its wait for
    NVML events must not keep the process alive (it did, until the hub was killed)."""
    write_machine(machine, DEVICES=H200)
    env = fake_nvml_env(fake_nvml_dir, file=str(machine))
    child = subprocess.Popen(
        [sys.executable, "-c", LEFT_RUNNING], env=env, cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        said, _ = child.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        pytest.fail("the process never exited: the watcher's event thread held it")
    assert "leaving" in said and child.returncode == 0
