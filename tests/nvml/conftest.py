"""Build the fake libnvidia-ml.so.1 and read the inventory through it in a child process.

pynvml loads the library once per process and keeps it, so each reading runs in a fresh
Python with ``LD_LIBRARY_PATH`` pointing at the fake: pynvml's real ctypes calls reach it
exactly as they would reach the driver's library.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from spawner.local.inventory import Device

HERE = Path(__file__).parent
ROOT = HERE.parent.parent

# Runs in the child: read the inventory, print devices or the error as one JSON line.
READ_INVENTORY = textwrap.dedent(
    """
    import dataclasses, json, logging, sys
    from spawner.core.catalog import Catalog
    from spawner.local.inventory import load_local_devices, nvml_devices
    from spawner.local.spawner import DEFAULT_INVENTORY_FILE

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    mode = sys.argv[1]
    try:
        if mode == "nvml_devices":
            devices = nvml_devices(Catalog.load())
        else:
            devices = load_local_devices(mode, DEFAULT_INVENTORY_FILE, Catalog.load())
    except Exception as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}))
    else:
        print(json.dumps({"devices": [dataclasses.asdict(d) for d in devices]}))
    """
)


@dataclass
class Reading:
    devices: list[Device] | None
    error: str | None
    message: str | None
    log: str


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory) -> Path:
    """A folder holding the fake built as libnvidia-ml.so.1."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build tests/nvml/fake_nvml.c; install gcc")
    out = tmp_path_factory.mktemp("fake-nvml")
    subprocess.run(
        ["gcc", "-Wall", "-Werror", "-shared", "-fPIC", "-o", out / "libnvidia-ml.so.1"]
        + [HERE / "fake_nvml.c"],
        check=True,
    )
    return out


@pytest.fixture
def read_inventory(fake_nvml_dir):
    """``read_inventory(mode, devices=..., fail=...)`` → :class:`Reading`.

    ``mode`` is ``nvml_devices`` (call it directly) or a ``load_local_devices`` mode with the
    shipped simulated inventory as its file. ``devices`` and ``fail`` become
    ``FAKE_NVML_DEVICES`` and ``FAKE_NVML_FAIL`` (see fake_nvml.c).
    """

    def read(mode: str, devices: str | None = None, fail: str | None = None) -> Reading:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML_")}
        env["LD_LIBRARY_PATH"] = str(fake_nvml_dir)
        env["PYTHONPATH"] = str(ROOT)
        if devices is not None:
            env["FAKE_NVML_DEVICES"] = devices
        if fail is not None:
            env["FAKE_NVML_FAIL"] = fail
        child = subprocess.run(
            [sys.executable, "-c", READ_INVENTORY, mode],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert child.returncode == 0, child.stderr
        answer = json.loads(child.stdout.strip().splitlines()[-1])
        found = answer.get("devices")
        return Reading(
            [Device(**d) for d in found] if found is not None else None,
            answer.get("error"),
            answer.get("message"),
            child.stderr,
        )

    return read
