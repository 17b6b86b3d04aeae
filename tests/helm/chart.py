"""The umbrella chart (helm/gputap) rendered with Helm's own Go code (helm-python-sdk): shared
by the chart tests and by tests/kube, which applies the rendered RBAC to the simulated
cluster."""

from __future__ import annotations

import shutil
from pathlib import Path

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "gputap"
# the packaged z2jh chart `helm dependency build` would fetch (/work/shared/vendor/helm/README.md)
VENDORED = ROOT.parent / "shared" / "vendor" / "helm" / "jupyterhub-4.4.0.tgz"
RELEASE = {"name": "gputap", "namespace": "gputap"}


def copy_chart(parent: Path) -> Path:
    """A copy of the chart under parent with the vendored subchart in charts/, as `helm
    dependency build` leaves it (a copy keeps parallel test workers from sharing one charts/
    folder). FileNotFoundError when the vendored chart is missing."""
    if not VENDORED.exists():
        raise FileNotFoundError(f"the vendored z2jh chart is missing: {VENDORED}")
    target = parent / "gputap"
    shutil.copytree(CHART, target, ignore=shutil.ignore_patterns("charts"))
    (target / "charts").mkdir()
    shutil.copy(VENDORED, target / "charts" / VENDORED.name)
    return target


def values_of(path: Path | None) -> dict:
    return {} if path is None else yaml.safe_load(path.read_text())


def render(chart_dir: Path, values: dict) -> list[dict]:
    """Every manifest `helm install` would create for release gputap in namespace gputap."""
    rendered = helm.Chart.load(chart_dir).render(values, **RELEASE, is_install=True)
    manifests = []
    for name, text in sorted(rendered.items()):
        if not name.endswith((".yaml", ".yml")):
            continue
        manifests += [doc for doc in yaml.safe_load_all(text) if doc]
    return manifests
