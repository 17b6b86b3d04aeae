"""docs/install-kubernetes.md followed as far as a machine without a cluster can: its commands'
chart path is the chart, `helm dependency build` leaves what the chart needs, every values file
its commands name (the examples, and the one the page writes out) exists, renders for the
release and namespace the command says, lints strictly and is valid Kubernetes, and what the
page says of images and of uninstalling holds for what renders."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from hub_config.z2jh import configure
from tests.helm.test_chart import hub_values, validate_all, z2jh_config

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "gputap"
DOC = ROOT / "docs" / "install-kubernetes.md"
VENDORED = ROOT.parent / "shared" / "vendor" / "helm" / "jupyterhub-4.4.0.tgz"
KUBE_VERSIONS = ["1.30.0", kubernetes_validate.utils.latest_version()]


def copy_chart(where: Path, with_subchart: bool = True) -> Path:
    """A copy of the chart; with the vendored z2jh package in charts/, as `helm dependency
    build` leaves it."""
    if with_subchart and not VENDORED.exists():
        pytest.fail(f"the vendored z2jh chart is missing: {VENDORED}")
    target = where / "gputap"
    shutil.copytree(CHART, target, ignore=shutil.ignore_patterns("charts"))
    (target / "charts").mkdir()
    if with_subchart:
        shutil.copy(VENDORED, target / "charts" / VENDORED.name)
    return target


def doc_text() -> str:
    return DOC.read_text()


def section(title: str) -> str:
    parts = re.split(r"^## ", doc_text(), flags=re.M)
    (found,) = [p for p in parts if p.startswith(title)]
    return found


def blocks(text: str, lang: str) -> list[tuple[str, str]]:
    """(the text before, the body) of each fenced block of that language."""
    found = []
    for match in re.finditer(rf"```{lang}\n(.*?)```", text, flags=re.S):
        found.append((text[: match.start()], match.group(1)))
    return found


def commands(text: str | None = None) -> list[list[str]]:
    found = []
    for _, body in blocks(doc_text() if text is None else text, "sh"):
        for line in body.replace("\\\n", " ").splitlines():
            if line.strip():
                found.append(shlex.split(line))
    return found


def inline_files() -> dict[str, dict]:
    """The values files the page writes out: a yaml block right after "`NAME.yaml`:"."""
    found = {}
    for before, body in blocks(doc_text(), "yaml"):
        named = re.search(r"`([\w.-]+\.yaml)`:\s*$", before)
        assert named, f"a yaml block without a file name before it: {body[:60]}"
        found[named.group(1)] = yaml.safe_load(body)
    return found


def helm_commands(verb: str) -> list[list[str]]:
    return [c for c in commands() if c[:2] == ["helm", verb]]


def option(cmd: list[str], *names: str) -> list[str]:
    return [cmd[i + 1] for i, word in enumerate(cmd) if word in names]


def values_files(cmd: list[str]) -> list[dict]:
    files = inline_files()
    out = []
    for name in option(cmd, "--values", "-f"):
        if name in files:
            out.append(files[name])
        else:
            path = ROOT / name
            assert path.is_file(), f"{' '.join(cmd)}: {name} does not exist"
            out.append(yaml.safe_load(path.read_text()))
    return out


def merged(layers: list[dict]) -> dict:
    """Values files merged as Helm merges them: later files win, mappings merge."""

    def merge(a: dict, b: dict) -> dict:
        out = dict(a)
        for key, value in b.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merge(out[key], value)
            else:
                out[key] = value
        return out

    result: dict = {}
    for layer in layers:
        result = merge(result, layer)
    return result


@pytest.fixture(scope="module")
def chart_dir(tmp_path_factory) -> Path:
    return copy_chart(tmp_path_factory.mktemp("chart"))


def release_of(cmd: list[str]) -> dict:
    return {"name": cmd[2], "namespace": option(cmd, "--namespace", "-n")[0]}


def render(chart_dir: Path, cmd: list[str]) -> list[dict]:
    rendered = helm.Chart.load(chart_dir).render(
        merged(values_files(cmd)), **release_of(cmd), is_install=True
    )
    return [
        doc
        for name, text in sorted(rendered.items())
        if name.endswith((".yaml", ".yml"))
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def test_the_page_installs_upgrades_and_uninstalls():
    assert helm_commands("install") and helm_commands("upgrade") and helm_commands("uninstall")
    assert helm_commands("dependency")


def test_every_chart_path_is_the_chart():
    paths = [c[3] for c in helm_commands("install") + helm_commands("upgrade")]
    paths += [c[3] for c in helm_commands("dependency")]
    for path in paths:
        assert yaml.safe_load((ROOT / path / "Chart.yaml").read_text())["name"] == "gputap", path
    assert {c[2] for c in helm_commands("dependency")} == {"build"}


def test_dependency_build_leaves_what_the_chart_needs(tmp_path):
    """What the page says `helm dependency build` puts in charts/ is what the chart needs:
    without it the subchart is missing, with it the dependency is satisfied."""
    assert "jupyterhub-4.4.0.tgz" in section("Fetch")
    bare = copy_chart(tmp_path / "bare", with_subchart=False)
    assert [d["status"] for d in helm.dependency_list(bare)] == ["missing"]
    built = copy_chart(tmp_path / "built")
    assert (built / "charts" / "jupyterhub-4.4.0.tgz").is_file()
    assert [d["status"] for d in helm.dependency_list(built)] == ["ok"]


def test_the_install_section_names_every_example():
    examples = sorted(p.name for p in (CHART / "examples").glob("*.yaml"))
    named = sorted(set(re.findall(r"`([\w-]+\.yaml)` \(", section("Install"))))
    assert named == examples


def install_and_upgrade() -> list[list[str]]:
    return helm_commands("install") + helm_commands("upgrade")


@pytest.mark.parametrize("index", range(len(install_and_upgrade())))
def test_each_command_values_render_lint_and_validate(chart_dir, index):
    cmd = install_and_upgrade()[index]
    assert option(cmd, "--values", "-f"), cmd
    values = merged(values_files(cmd))
    report = helm.lint(chart_dir, values, strict=True, namespace=release_of(cmd)["namespace"])
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report
    manifests = render(chart_dir, cmd)
    assert {"Deployment", "Secret", "ConfigMap", "Service"} <= {m["kind"] for m in manifests}
    validate_all(manifests)


def test_the_written_out_values_run_the_images_they_name(chart_dir):
    files = inline_files()
    assert set(files) == {"my-values.yaml"}
    (cmd,) = [c for c in helm_commands("install") if "my-values.yaml" in c]
    manifests = render(chart_dir, cmd)
    mine = files["my-values.yaml"]["jupyterhub"]
    (hub,) = [m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"] == "hub"]
    (container,) = [c for c in hub["spec"]["template"]["spec"]["containers"] if c["name"] == "hub"]
    assert container["image"] == f"{mine['hub']['image']['name']}:{mine['hub']['image']['tag']}"
    # the hub: z2jh's singleuser.image first, then gputap's configure
    single = mine["singleuser"]["image"]
    c = z2jh_config(hub_values(manifests))
    c.KubeSpawner.image = f"{single['name']}:{single['tag']}"
    gputap = merged([v["jupyterhub"]["custom"]["gputap"] for v in values_files(cmd)])
    release = release_of(cmd)
    environ = {"POD_NAMESPACE": release["namespace"], "HELM_RELEASE_NAME": release["name"]}
    configure(c, gputap, environ=environ)
    assert c.KubeSpawner.image == f"{single['name']}:{single['tag']}"


def claims(manifests: list[dict]) -> dict[str, dict]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == "PersistentVolumeClaim"}


def test_uninstall_says_what_becomes_of_every_claim_the_chart_makes(chart_dir):
    uninstall = section("Uninstall")
    assert "home-USER" in uninstall and "data disks stay" in uninstall
    keep = "helm.sh/resource-policy"
    for cmd in install_and_upgrade():
        made = claims(render(chart_dir, cmd))
        for name in made:
            assert f"`{name}`" in uninstall, f"{name}: the chart makes it, the page is silent"
            # the chart never makes users' homes or disks: the spawner does, so they stay
            assert not name.startswith(("home-", "disk-")), name
        kept = {n for n, c in made.items() if keep in (c["metadata"].get("annotations") or {})}
        with_mine = "my-values.yaml" in cmd
        # as the page says: hub-db-dir goes with the release unless my-values.yaml keeps it
        if "hub-db-dir" in made:
            assert ("hub-db-dir" in kept) == with_mine, cmd
