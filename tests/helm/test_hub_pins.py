"""The hub image's pinned set installs together: gputap resolved by pip under
images/hub/constraints.txt, as images/hub/Dockerfile installs it, gets exactly the pins (JupyterHub
5.5.0 as z2jh 4.4.0's hub image ships it, KubeSpawner 7.1.0, the idle culler 2.0.0, ...), each
inside gputap's own range in pyproject.toml; and `make test-jh55` runs the hub-side tests in
an environment holding exactly those pins (.venv-jh55), not the newest JupyterHub of .venv.

The resolution asks the package registries, as `make setup` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.helm.test_images import HUB_CONSTRAINTS, ROOT, constraints, gputap_requirements

# set by `make test-jh55` to the constraints its environment was built with
PINS_ENV = "GPUTAP_HUB_PINS"


def pins() -> dict[str, Version]:
    same, upgraded = constraints()
    return {**same, **upgraded}


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict[str, Version]:
    """package → version, as pip resolves the Dockerfile's install into an empty environment."""
    report = tmp_path_factory.mktemp("pip") / "report.json"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed"),
            *("--quiet", "--report", str(report), "--constraint", str(HUB_CONSTRAINTS)),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    installs = json.loads(report.read_text())["install"]
    return {
        canonicalize_name(i["metadata"]["name"]): Version(i["metadata"]["version"])
        for i in installs
    }


def test_gputap_resolves_under_the_hub_constraints_to_exactly_the_pins(resolved):
    assert "gputap" in resolved
    for name, version in pins().items():
        # a pin the resolution does not use is no longer one gputap's install needs
        assert resolved.get(name) == version, f"{name}: pinned {version}, gets {resolved.get(name)}"
    assert resolved["jupyterhub"] == Version("5.5.0")
    assert resolved["jupyterhub-kubespawner"] == Version("7.1.0")


def test_what_the_hub_image_gets_is_inside_gputaps_ranges(resolved):
    for name, requirement in gputap_requirements().items():
        assert name in resolved, f"{requirement}: not installed"
        assert resolved[name] in requirement.specifier, f"{name} {resolved[name]}: {requirement}"


@pytest.mark.skipif(PINS_ENV not in os.environ, reason="the hub image's set: make test-jh55")
def test_the_jh55_run_has_exactly_the_hub_images_pins():
    assert Path(os.environ[PINS_ENV]).resolve() == HUB_CONSTRAINTS
    for name, version in pins().items():
        assert Version(metadata.version(name)) == version, name
    import jupyterhub

    assert jupyterhub.__version__ == "5.5.0"
    # the servers the tests start run the single-user image's JupyterHub: the same
    singleuser = Path(sys.executable).parent / "jupyterhub-singleuser"
    version = subprocess.run(
        [str(singleuser), "--version"], capture_output=True, text=True, timeout=120
    )
    assert version.stdout.strip() == "5.5.0", version.stdout + version.stderr
