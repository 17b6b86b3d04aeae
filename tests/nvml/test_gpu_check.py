"""bench/gpu_check.py, the check a person with a GPU runs, against the fake libnvidia-ml: what it
prints there is what it prints on a real box (less the CUDA workloads, which need PyTorch with
CUDA and are reported as skipped)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
H200 = "GPU-11111111-0000-4000-8000-000000000001"
A100 = "GPU-22222222-0000-4000-8000-000000000002"
SLICE = "MIG-44444444-0000-4000-8000-000000000004"
PRO = "GPU-55555555-0000-4000-8000-000000000005"
LOST = "GPU-66666666-0000-4000-8000-000000000006"
MACHINE = f"""
    NVIDIA H200|{H200}|143771|off;
    NVIDIA A100-SXM4-80GB|{A100}|81920|on>off;
    @3|NVIDIA A100-SXM4-80GB MIG 1g.10gb|{SLICE}|9984;
    NVIDIA RTX PRO 6000 Blackwell Server Edition|{PRO}|97887|none;
    NVIDIA L4|{LOST}|23034|off
"""


def run_check(library: Path, **fake: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAKE_NVML_", "GPUTAP_"))}
    env.update(LD_LIBRARY_PATH=str(library), FAKE_NVML_DEVICES=MACHINE)
    env.update({f"FAKE_NVML_{k.upper()}": v for k, v in fake.items()})
    return subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--seconds", "3"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_check_reports_offers_and_judges_the_machine(fake_nvml_dir):
    check = run_check(
        fake_nvml_dir,
        # the H200 works in bursts; the slice holds a CUDA context and does nothing
        use=f"{H200}|100/300/1000|20000|1; {SLICE}|0|3000|1",
        fail_calls=f"nvmlDeviceGetMemoryInfo@{LOST}=GPU_IS_LOST",
    )
    out = check.stdout
    assert check.returncode == 0, out + check.stderr
    assert "driver 570.172.08, CUDA 12.8" in out
    assert f"GPU 1: NVIDIA A100-SXM4-80GB, {A100}, " in out
    assert "MIG on (off after the next GPU reset)" in out
    assert f"MIG slot 3: NVIDIA A100-SXM4-80GB MIG 1g.10gb, {SLICE}, GPU instance 7" in out
    assert "GPU 3: GPU is lost" in out
    # what gputap offers: prices from the settings' defaults, the unknown card unpriced
    assert f"{H200}: H200-141GB (NVIDIA H200 141GB), 143771 MiB, 989.4 FP16 TFLOPS, 15.00/h" in out
    assert f"{SLICE}: A100-80GB/1g.10gb (NVIDIA A100 80GB), 9984 MiB" in out
    assert "1.142857/h" in out
    assert (
        f"{PRO}: RTX-PRO-6000-Blackwell-Server-Edition (NVIDIA RTX PRO 6000 Blackwell Server "
        "Edition), 97887 MiB, TFLOPS unknown, unpriced (set "
        "billing.prices.RTX-PRO-6000-Blackwell-Server-Edition to sell it)"
    ) in out
    assert f"warning: GPU 3 ({LOST}): GPU is lost; left out, the other GPUs are served" in out
    assert "PASS 3 device(s) offered" in out
    for device in (H200, SLICE, PRO):
        assert f"PASS {device} through NVML: that device alone" in out
    assert "SKIP matmul and sleeping context" in out
    # bursts of 30 % on average are busy; the context that does nothing is idle
    assert f"{H200}: busy, " in out and "(utilization)" in out
    assert f"{SLICE}: idle, no utilisation, 1 process(es) (memory)" in out
    assert "4 passed, 0 failed, 4 skipped" in out


def test_the_check_on_an_old_driver(fake_nvml_old_dir):
    check = run_check(fake_nvml_old_dir, use=f"{SLICE}|0|3000|1")
    out = check.stdout
    assert check.returncode == 0, out + check.stderr
    assert "driver 460.106.00, CUDA 11.2" in out
    old_slice = f"MIG-{A100}/7/0"  # R460's MIG UUIDs
    assert f"GPU 0: H200, {H200}" in out
    assert f"{old_slice}: A100-80GB/1g.10gb" in out
    assert f"PASS {old_slice} through NVML: that device alone" in out
    assert f"{old_slice}: idle, no utilisation, 1 process(es) (memory)" in out
    assert "0 failed" in out


def test_without_a_driver_the_check_says_so(fake_nvml_dir):
    check = run_check(fake_nvml_dir, fail="driver")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "NVML unavailable: Driver Not Loaded" in check.stdout
    assert "SKIP every check: NVML cannot be used on this machine" in check.stdout
