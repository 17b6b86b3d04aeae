"""Environments on one machine that ``make setup`` builds and ``make demo`` offers.

An environment's servers need, beside its own packages, what every gputap server runs:
``jupyterhub-singleuser`` at the hub's own JupyterHub, JupyterLab, NVML's bindings,
jupyter-server-proxy and TensorBoard at pyproject.toml's ranges (:func:`server_requirements`),
and the gputap-lab extension (installed from extensions/gputap-lab). ``python -m
hub_config.environments requirements`` prints those and the data-science environment's own
packages, one per line, for pip (the Makefile's ``.venv-ds``).

The data-science environment, ``data-science``, holds numpy, pandas, matplotlib and PyTorch's
CPU build (``torch==2.13.0``, which pip takes from these machines' disk): a first cell of
``import torch, matplotlib`` works. :func:`demo_environments` offers it when it is built and
the settings do not name an environment of that key.
"""

from __future__ import annotations

import json
import sys
import tomllib
from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
#: what every environment's servers run, at pyproject.toml's ranges (JupyterHub: the hub's)
SERVER_PACKAGES = ("jupyterlab", "nvidia-ml-py", "jupyter-server-proxy", "tensorboard")
#: the data-science environment's own packages
DATA_SCIENCE_PACKAGES = (
    "torch==2.13.0",
    "numpy>=2,<3",
    "pandas>=2.2,<4",
    "matplotlib>=3.9,<4",
)
DATA_SCIENCE_KEY = "data-science"
#: where `make setup` builds it
DATA_SCIENCE_DIR = ROOT / ".venv-ds"


def server_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """jupyterhub at the hub's own version, and SERVER_PACKAGES at pyproject's ranges."""
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    wanted = {canonicalize_name(name) for name in SERVER_PACKAGES}
    ranged = [d for d in dependencies if canonicalize_name(Requirement(d).name) in wanted]
    return [f"jupyterhub=={version('jupyterhub')}", *ranged]


def demo_environments(
    environments: Mapping[str, Any], built: Path = DATA_SCIENCE_DIR
) -> dict[str, str]:
    """Settings overrides adding the data-science environment when ``built`` holds it and
    the settings' ``environments`` have no entry of its key (an operator's is theirs)."""
    if DATA_SCIENCE_KEY in environments or not (built / "bin" / "jupyterhub-singleuser").exists():
        return {}
    entry = {
        "name": "Data science (PyTorch 2.13 CPU)",
        "description": "numpy, pandas, matplotlib and PyTorch 2.13 (CPU build), with TensorBoard.",
        "framework": "PyTorch",
        "tags": ["pytorch-2.13", "cpu", "pandas", "matplotlib"],
        "python": str(built),
    }
    return {f"GPUTAP__ENVIRONMENTS__{DATA_SCIENCE_KEY}": json.dumps(entry)}


def main(argv: list[str]) -> int:
    if argv != ["requirements"]:
        print("usage: python -m hub_config.environments requirements", file=sys.stderr)
        return 2
    print("\n".join([*server_requirements(), *DATA_SCIENCE_PACKAGES]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
