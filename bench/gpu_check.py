"""Check gputap against this machine's GPUs, in about a minute.

    make gpu-check                     # or: .venv/bin/python bench/gpu_check.py [--seconds 8]

Prints, with the settings gputap would run with (GPUTAP_SETTINGS):

1. what NVML reports: driver, every GPU and MIG device, pending MIG modes, calls that fail;
2. what gputap offers for it: each device's offering, memory and price (or "unpriced"), the
   GPUs kept out by ``spawner.exclude_gpus``, and warnings such as unknown cards;
3. whether a server sees exactly its device: for each offered device, a process started with
   the environment the local spawner gives a server reads its GPUs through the Lab extension's
   NVML reader (and CUDA, when PyTorch with CUDA is installed) and must find that one alone;
4. whether the idle rule is right: with PyTorch and CUDA, a matmul on the first device must
   count as busy and a process that only holds a CUDA context as idle, judged by the Lab
   extension's own rule (sampler.BusyRule); without them, what the rule says of each device
   now.

Each check ends in PASS, FAIL or SKIP (with why); the exit status is 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "extensions" / "gputap-lab")]

import pynvml  # noqa: E402

from billing_service.domain.pricing import make_price_book  # noqa: E402
from gputap_common.money import format_credits  # noqa: E402
from gputap_common.settings import load_settings  # noqa: E402
from gputap_lab.gpu import GPUUnavailable, NvmlReader  # noqa: E402
from gputap_lab.sampler import BusyRule  # noqa: E402
from spawner.core.catalog import Catalog, discovered_card  # noqa: E402
from spawner.local import nvml  # noqa: E402
from spawner.local.inventory import Device, InventoryUnavailable, nvml_devices  # noqa: E402

# Run in a child with a server's environment: which GPUs does it see?
SEES = """
import json, os, sys
from gputap_lab.gpu import NvmlReader, visible_devices
answer = {"nvml": [d.uuid for d in NvmlReader(visible_devices(os.environ)).read()]}
try:
    import torch
except ImportError:
    answer["cuda"] = "torch is not installed"
else:
    if torch.cuda.is_available():
        answer["cuda"] = [str(torch.cuda.get_device_properties(i).uuid)
                          for i in range(torch.cuda.device_count())]
    else:
        answer["cuda"] = "torch has no CUDA here"
print(json.dumps(answer))
"""

# Run in a child on one device: a matmul loop, or a context that only sleeps.
WORK = """
import sys, time, torch
seconds, kind = float(sys.argv[1]), sys.argv[2]
x = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
torch.cuda.synchronize()
print("ready", flush=True)
end = time.time() + seconds
while time.time() < end:
    if kind == "matmul":
        for _ in range(20):
            x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()
    else:
        time.sleep(0.1)
"""


class Report:
    def __init__(self) -> None:
        self.results: list[str] = []

    def result(self, outcome: str, what: str, detail: str = "") -> None:
        self.results.append(outcome)
        print(f"  {outcome:4} {what}" + (f": {detail}" if detail else ""))

    def summary(self) -> int:
        counts = {k: self.results.count(k) for k in ("PASS", "FAIL", "SKIP")}
        print(f"\n{counts['PASS']} passed, {counts['FAIL']} failed, {counts['SKIP']} skipped")
        return 1 if counts["FAIL"] else 0


def nvml_report() -> bool:
    """Print what NVML says of every GPU; False when NVML cannot be used."""
    print("What NVML reports")
    try:
        with nvml.session():
            cuda = pynvml.nvmlSystemGetCudaDriverVersion()
            print(f"  driver {nvml.driver_version()}, CUDA {cuda // 1000}.{cuda % 1000 // 10}")
            count = pynvml.nvmlDeviceGetCount()
            print(f"  {count} GPU(s)")
            for index in range(count):
                _report_gpu(index)
    except nvml.Unavailable as e:
        print(f"  {e}")
        return False
    return True


def _report_gpu(index: int) -> None:
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        uuid = nvml.text(pynvml.nvmlDeviceGetUUID(handle))
        name = nvml.text(pynvml.nvmlDeviceGetName(handle))
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        modes = nvml.mig_modes(handle)
    except nvml.DEVICE_ERRORS as e:
        print(f"  GPU {index}: {e}")
        return
    mig = "not MIG-capable" if modes is None else f"MIG {'on' if modes[0] else 'off'}"
    if modes is not None and modes[0] != modes[1]:
        mig += f" ({'on' if modes[1] else 'off'} after the next GPU reset)"
    used, total = memory.used // 2**20, memory.total // 2**20
    print(f"  GPU {index}: {name}, {uuid}, {used} of {total} MiB used, {mig}")
    if not modes or not modes[0]:
        return
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig_handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            mig_name = nvml.text(pynvml.nvmlDeviceGetName(mig_handle))
            mig_uuid = nvml.text(pynvml.nvmlDeviceGetUUID(mig_handle))
            instance = pynvml.nvmlDeviceGetGpuInstanceId(mig_handle)
        except pynvml.NVMLError_NotFound:
            continue
        except nvml.DEVICE_ERRORS as e:
            print(f"    MIG slot {slot}: {e}")
            continue
        print(f"    MIG slot {slot}: {mig_name}, {mig_uuid}, GPU instance {instance}")


class _Lines(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        print(f"  {record.levelname.lower()}: {record.getMessage()}")


def offers(settings, report: Report) -> tuple[list[Device], Catalog]:
    """Print what gputap offers for this machine's GPUs."""
    print("\nWhat gputap offers")
    catalog = Catalog.load(settings.catalog)
    log = logging.getLogger("spawner.local.inventory")
    log.addHandler(_Lines())
    log.setLevel(logging.INFO)
    log.propagate = False
    try:
        devices = nvml_devices(catalog, settings.spawner["exclude_gpus"])
    except InventoryUnavailable as e:
        print(f"  {e}: gputap serves the simulated inventory (spawner.inventory auto)")
        return [], catalog
    finally:
        log.removeHandler(log.handlers[-1])
    book = make_price_book(settings.billing["prices"])
    for d in devices:
        card = catalog.cards.get(d.card) or discovered_card(d.product, d.memory_mib)
        price = book.price(d.key)
        shown = (
            f"{format_credits(price)}/h"
            if price is not None
            else f"unpriced (set billing.prices.{d.key} to sell it)"
        )
        speed = f"{card.fp16_tflops:g} FP16 TFLOPS" if card.known else "TFLOPS unknown"
        print(f"  {d.uuid}: {d.key} ({card.name}), {d.memory_mib} MiB, {speed}, {shown}")
    if devices:
        report.result("PASS", f"{len(devices)} device(s) offered")
    else:
        report.result("FAIL", "no device offered", "see the warnings above")
    return devices, catalog


def server_env(device: str) -> dict[str, str]:
    """The environment a server on ``device`` gets (GPULocalSpawner.get_env)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES",)}
    path = os.pathsep.join([str(ROOT), str(ROOT / "extensions" / "gputap-lab")])
    return {**env, "CUDA_VISIBLE_DEVICES": device, "NVIDIA_VISIBLE_DEVICES": device,
            "PYTHONPATH": path}  # fmt: skip


def sees_exactly(devices: list[Device], report: Report, limit: int) -> None:
    print("\nDoes a server see exactly its device?")
    for d in devices[:limit]:
        child = subprocess.run(
            [sys.executable, "-c", SEES], env=server_env(d.uuid), capture_output=True, text=True
        )
        if child.returncode != 0:
            report.result("FAIL", d.uuid, child.stderr.strip().splitlines()[-1])
            continue
        seen = json.loads(child.stdout.strip().splitlines()[-1])
        if seen["nvml"] == [d.uuid]:
            report.result("PASS", f"{d.uuid} through NVML", "that device alone")
        else:
            report.result("FAIL", f"{d.uuid} through NVML", f"saw {seen['nvml']}")
        cuda = seen["cuda"]
        if isinstance(cuda, str):
            report.result("SKIP", f"{d.uuid} through CUDA", cuda)
        elif len(cuda) == 1 and d.uuid.removeprefix("GPU-") in cuda[0]:
            report.result("PASS", f"{d.uuid} through CUDA", "one CUDA device, this one")
        else:
            report.result("FAIL", f"{d.uuid} through CUDA", f"saw {cuda}")
    if len(devices) > limit:
        print(f"  (the other {len(devices) - limit} not checked: --devices {len(devices)})")


def judge(device: str, seconds: float, steady: float) -> tuple[list[bool], str, str]:
    """Read ``device`` every second for ``seconds`` and judge each reading by the Lab's rule:
    (busy per reading, the last reading shown, where its activity came from)."""
    reader, rule = NvmlReader([device]), BusyRule(10, steady)
    verdicts: list[bool] = []
    sample = None
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(1.0)
            [sample] = reader.read()
            verdicts.append(rule([sample], datetime.now(UTC)))
    except GPUUnavailable as e:
        return verdicts, str(e), "none"
    finally:
        reader.close()
    if sample is None:
        return verdicts, "no reading", "none"
    source = sample.activity_source or "none"
    shown = (
        f"{sample.utilization_percent} % ({source})"
        if sample.utilization_percent is not None
        else f"no utilisation, {sample.compute_processes} process(es) ({source})"
    )
    return verdicts, shown + (f", {sample.error}" if sample.error else ""), source


def idle_rule(devices: list[Device], report: Report, seconds: float) -> None:
    print("\nDoes the idle rule see work as busy and a sleeping context as idle?")
    if not devices:
        report.result("SKIP", "idle rule", "no device offered")
        return
    steady = max(2.0, seconds / 2)  # a slice judged by what it holds: steady this long is idle
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
    )
    if probe.stdout.strip() != "True":
        why = "PyTorch with CUDA is not installed" if probe.returncode else "CUDA is not usable"
        report.result("SKIP", "matmul and sleeping context", f"{why} (pip install torch)")
        print(
            f"  what the rule says of each device now (a slice judged by what it holds is idle "
            f"once that is steady for {steady:g} s here; servers use "
            "GPUTapLab.mig_steady_idle_minutes, 10 by default):"
        )
        for d in devices:
            verdicts, shown, _ = judge(d.uuid, min(seconds, 4), steady)
            busy = bool(verdicts) and verdicts[-1]
            print(f"    {d.uuid}: {'busy' if busy else 'idle'}, {shown}")
        return
    device = devices[0].uuid
    for kind in ("matmul", "sleep"):
        work = subprocess.Popen(
            [sys.executable, "-c", WORK, str(seconds + steady + 10), kind],
            env=server_env(device),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            work.stdout.readline()  # "ready": the context exists
            verdicts, shown, source = judge(device, seconds + steady, steady)
        finally:
            work.kill()
            work.wait()
        if kind == "sleep":
            ok, want = bool(verdicts) and not verdicts[-1], "idle at the end"
        elif source == "memory":
            # no per-instance activity (A100, A30 slices): busy while what it holds is new
            ok, want = bool(verdicts) and verdicts[0], "busy while its context is new"
        else:
            ok, want = bool(verdicts) and verdicts[-1], "busy"
        marks = "".join("B" if v else "." for v in verdicts)
        report.result("PASS" if ok else "FAIL", f"{kind} on {device}", f"{want}: {marks}, {shown}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8, help="length of each workload")
    parser.add_argument("--devices", type=int, default=8, help="devices checked for visibility")
    args = parser.parse_args(argv)
    settings = load_settings()
    report = Report()
    if not nvml_report():
        report.result("SKIP", "every check", "NVML cannot be used on this machine")
        return report.summary()
    devices, _ = offers(settings, report)
    sees_exactly(devices, report, args.devices)
    idle_rule(devices, report, args.seconds)
    return report.summary()


if __name__ == "__main__":
    sys.exit(main())
