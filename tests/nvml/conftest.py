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
    from spawner.local.inventory import load_local_devices, nvml_busy, nvml_devices
    from spawner.local.spawner import DEFAULT_INVENTORY_FILE

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    mode, exclude = sys.argv[1], json.loads(sys.argv[2])
    try:
        if mode == "nvml_devices":
            devices = nvml_devices(Catalog.load(), exclude)
        elif mode == "nvml_busy":
            print(json.dumps({"busy": nvml_busy(exclude)}))
            sys.exit(0)
        else:
            devices = load_local_devices(mode, DEFAULT_INVENTORY_FILE, Catalog.load(), exclude)
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
    busy: dict[str, list[int]] | None = None


def build_fake(out: Path, *flags: str) -> Path:
    """Build tests/nvml/fake_nvml.c as ``out``/libnvidia-ml.so.1."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build tests/nvml/fake_nvml.c; install gcc")
    subprocess.run(
        ["gcc", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", *flags]
        + ["-o", out / "libnvidia-ml.so.1", HERE / "fake_nvml.c", "-lpthread"],
        check=True,
    )
    return out


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory) -> Path:
    """A folder holding the fake built as libnvidia-ml.so.1 (a current driver)."""
    return build_fake(tmp_path_factory.mktemp("fake-nvml"))


@pytest.fixture(scope="session")
def fake_nvml_old_dir(tmp_path_factory) -> Path:
    """The fake as a driver of the R460 era: no ``_v3`` process call, no ``MemoryInfo_v2``,
    names without "NVIDIA ", MIG UUIDs ``MIG-GPU-<uuid>/<gi>/<ci>``."""
    return build_fake(tmp_path_factory.mktemp("fake-nvml-old"), "-DFAKE_NVML_OLD_DRIVER")


def write_machine(path: Path, **keys: str) -> None:
    """Describe the machine in a ``FAKE_NVML_FILE`` (DEVICES=, USE=, FAIL_CALLS=,
    PRIVILEGED=), atomically, so a process reading the fake sees the change at its next call."""
    text = "".join(f"{key}={' '.join(value.split())}\n" for key, value in keys.items())
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def fake_nvml_env(library: Path, **fake: str) -> dict[str, str]:
    """The environment of a child Python whose pynvml loads the fake from ``library``: this
    one's, without its own ``FAKE_NVML_*``, and ``fake`` as ``FAKE_NVML_<KEY>`` (file=,
    devices=, fail= ..., see fake_nvml.c)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML_")}
    env.update(LD_LIBRARY_PATH=str(library), PYTHONPATH=str(ROOT))
    env.update({f"FAKE_NVML_{key.upper()}": value for key, value in fake.items()})
    return env


@pytest.fixture
def read_inventory(fake_nvml_dir):
    """``read_inventory(mode, devices=..., fail=...)`` → :class:`Reading`.

    ``mode`` is ``nvml_devices`` (call it directly) or a ``load_local_devices`` mode with the
    shipped simulated inventory as its file. ``devices`` and ``fail`` become
    ``FAKE_NVML_DEVICES`` and ``FAKE_NVML_FAIL``, other keywords ``FAKE_NVML_<KEY>`` (see
    fake_nvml.c); ``library`` is another build's folder (``fake_nvml_old_dir``); ``exclude``
    the GPUs kept out, or, with mode ``nvml_busy``, the UUIDs to check for processes.
    """

    def read(
        mode: str,
        devices: str | None = None,
        fail: str | None = None,
        library: Path | None = None,
        exclude: list[str] | None = None,
        **fake: str,
    ) -> Reading:
        if devices is not None:
            fake["devices"] = devices
        if fail is not None:
            fake["fail"] = fail
        env = fake_nvml_env(library or fake_nvml_dir, **fake)  # use=, fail_calls=, privileged=
        child = subprocess.run(
            [sys.executable, "-c", READ_INVENTORY, mode, json.dumps(exclude or [])],
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
            answer.get("busy"),
        )

    return read
