"""bench/form_render.py still runs: a small cluster and few renders, so that a change to the
form's or the catalog's API cannot break the bench silently (make bench is not in make test)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_form_render_bench_prints_its_figures_and_target():
    out = subprocess.run(
        [sys.executable, "bench/form_render.py", "--nodes", "24", "--renders", "5"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "inventory: 24 nodes x 8 = 192 GPUs" in out.stdout
    assert re.search(r"\d+ of 150 environments offered", out.stdout), out.stdout
    assert re.search(r"p50 [\d.]+ ms\s+p99 [\d.]+ ms", out.stdout), out.stdout
    assert re.search(r"^target p50 < 20 ms: (met|not met)$", out.stdout, re.M), out.stdout
