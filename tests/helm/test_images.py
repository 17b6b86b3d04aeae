"""The container images (images/*/Dockerfile) against the chart: the hub image's base is the
z2jh hub image at the chart's `jupyterhub` dependency version, the hub image's pins are what that
base ships (or an upgrade gputap's ranges need), the image names and tags in values.yaml are the
ones the Dockerfiles are built as (docs/install-kubernetes.md), and each Dockerfile, read as
Docker reads it (no container engine runs here), starts from pinned bases, adds no URLs and
ends as a non-root user the chart's pods run as."""

from __future__ import annotations

import re
import shlex
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from gputap_common.settings import defaults
from hub_config.environments import SERVER_PACKAGES  # what every environment's servers run
from hub_config.z2jh import configure
from tests.helm.dockerfile import Dockerfile, DockerfileError, parse_dockerfile
from tests.helm.test_chart import (
    IDS,
    VALUE_FILES,
    hub_environ,
    hub_values,
    render,
    values_of,
    z2jh_config,
)
from tests.helm.test_install_doc import copy_chart

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "gputap"
IMAGES = ROOT / "images"
LAB = ROOT / "extensions" / "gputap-lab"
INSTALL_DOC = ROOT / "docs" / "install-kubernetes.md"
VENDOR = ROOT.parent / "shared" / "vendor" / "helm"
VENDORED = VENDOR / "jupyterhub-4.4.0.tgz"
HUB_CONSTRAINTS = IMAGES / "hub" / "constraints.txt"


def chart_meta() -> dict:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())


def values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def z2jh_values() -> dict:
    with tarfile.open(VENDORED) as tgz:
        return yaml.safe_load(tgz.extractfile("jupyterhub/values.yaml").read())


def dockerfile(name: str) -> Dockerfile:
    return parse_dockerfile((IMAGES / name / "Dockerfile").read_text())


def jupyterhub_dependency() -> dict:
    (dep,) = [d for d in chart_meta()["dependencies"] if d["name"] == "jupyterhub"]
    return dep


# --- the Dockerfile reader itself: it must see what these checks look for ---


def test_the_reader_follows_continuations_comments_and_stages():
    parsed = parse_dockerfile(
        "# syntax comment\nFROM node:20.19.0-bookworm-slim AS lab\nRUN a \\\n  # inside\n"
        "  && b\nFROM python:3.11.13-slim-bookworm\nCOPY --from=lab /w /w\nUSER 1000:100\n"
    )
    assert [s.image for s in parsed.stages] == [
        "node:20.19.0-bookworm-slim",
        "python:3.11.13-slim-bookworm",
    ]
    assert parsed.stages[0].name == "lab"
    assert parsed.stages[0].instructions[0] == ("RUN", "a && b")
    assert parsed.final.user == "1000:100"


def test_the_reader_refuses_instructions_before_from():
    with pytest.raises(DockerfileError, match="before FROM"):
        parse_dockerfile("RUN true\nFROM python:3.11.13-slim\n")


@pytest.mark.parametrize(
    "text, problem",
    [
        ("FROM python\nUSER 1000\n", "pinned"),
        ("FROM python:latest\nUSER 1000\n", "pinned"),
        ("FROM python:3-slim\nUSER 1000\n", "pinned"),
        ("FROM python:3.11-slim\nUSER 1000\n", "pinned"),
        ("FROM python:3.11.13-slim\n", "root"),
        ("FROM python:3.11.13-slim\nUSER 1000\nUSER root\n", "root"),
        ("FROM python:3.11.13-slim\nUSER 0:0\n", "root"),
        ("FROM python:3.11.13-slim\nADD https://example.org/x.tgz /x\nUSER 1000\n", "ADD"),
    ],
)
def test_the_checks_catch_what_they_are_for(text, problem):
    assert any(problem in p for p in parse_dockerfile(text).problems()), problem


# --- the three images ---


@pytest.mark.parametrize("name", ["hub", "billing", "singleuser"])
def test_each_dockerfile_is_pinned_adds_no_urls_and_ends_non_root(name):
    assert dockerfile(name).problems() == []


def test_the_hub_image_is_z2jh_hub_at_the_chart_dependency_version():
    hub = dockerfile("hub")
    (stage,) = hub.stages
    base_name, base_tag = stage.image.rsplit(":", 1)
    z2jh_hub = z2jh_values()["hub"]["image"]
    assert base_name == z2jh_hub["name"] == "quay.io/jupyterhub/k8s-hub"
    assert base_tag == jupyterhub_dependency()["version"] == z2jh_hub["tag"]


def test_the_images_run_as_the_users_the_chart_runs_their_pods_as():
    z2jh = z2jh_values()
    # z2jh's hub pod: runAsNonRoot with runAsUser 1000; a numeric USER is what runAsNonRoot
    # can check without the chart saying it
    assert dockerfile("hub").final.user == f"{z2jh['hub']['containerSecurityContext']['runAsUser']}"
    # single-user pods: KubeSpawner's uid and fsGid from singleuser.uid / singleuser.fsGid
    singleuser = dockerfile("singleuser")
    uid, gid = z2jh["singleuser"]["uid"], z2jh["singleuser"]["fsGid"]
    assert singleuser.final.user == f"{uid}:{gid}"
    # ... and gputap's spawner, which sets them off the chart too (hub_config/hub.py): the
    # pods' runAsUser and fsGroup, so that a fresh home (owned by root) is the server's
    kube = defaults()["spawner"]["kubernetes"]
    assert singleuser.final.user == f"{kube['uid']}:{kube['fs_gid']}"
    workdirs = [a for i, a in singleuser.final.instructions if i == "WORKDIR"]
    assert workdirs[-1] == "/home/jovyan"  # where the spawner mounts the home
    useradd = [a for i, a in singleuser.final.instructions if i == "RUN" and "useradd" in a]
    assert len(useradd) == 1
    words = shlex.split(useradd[0].split("useradd", 1)[1].split("&&")[0])
    assert words[words.index("--uid") + 1] == str(uid)
    assert words[words.index("--gid") + 1] == str(gid)
    assert words[-1] == "jovyan"
    # Ubuntu 24.04 images (the CUDA base) already have user `ubuntu` with UID 1000: useradd
    # --uid 1000 fails unless it is removed first
    if "ubuntu24.04" in singleuser.final.image:
        assert re.search(r"userdel\s+(-r\s+|--remove\s+)?ubuntu\b.*&&\s*useradd", useradd[0]), (
            useradd[0]
        )
    assert dockerfile("billing").final.user not in ("", "root", "0")


# --- the hub image's Python packages: what the base ships, or an upgrade gputap needs ---


def base_ships() -> dict[str, Version]:
    """What quay.io/jupyterhub/k8s-hub ships, as the vendored chart's README lists it."""
    text = (VENDOR / "README.md").read_text()
    match = re.search(r"requirements\.txt:\s*(.+?)\.\s", text.replace("\n", " "))
    assert match, "the vendored README no longer lists the hub image's versions"
    ships = {}
    for item in match.group(1).split(","):
        name, version = item.split()
        ships[canonicalize_name(name)] = Version(version)
    return ships


def constraints() -> tuple[dict[str, Version], dict[str, Version]]:
    """(pins the base ships, pins that upgrade the base), from images/hub/constraints.txt:
    lines after a comment line starting '# upgraded' are upgrades."""
    same, upgraded, target = {}, {}, None
    for line in HUB_CONSTRAINTS.read_text().splitlines():
        line = line.strip()
        if line.startswith("# as the base ships"):
            target = same
        elif line.startswith("# upgraded"):
            target = upgraded
        elif line and not line.startswith("#"):
            assert target is not None, f"{line}: under neither heading"
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"{line}: a constraint is an exact pin"
            target[canonicalize_name(req.name)] = Version(spec.version)
    return same, upgraded


def gputap_requirements() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    return {canonicalize_name(r.name): r for r in reqs}


def test_the_hub_dockerfile_installs_gputap_under_the_constraints():
    (stage,) = dockerfile("hub").stages
    runs = [a for i, a in stage.instructions if i == "RUN" and "pip install" in a]
    assert len(runs) == 1
    assert re.search(r"(-c|--constraint)\s+\S*constraints\.txt", runs[0]), runs[0]
    copies = [a for i, a in stage.instructions if i == "COPY"]
    assert any("images/hub/constraints.txt" in a for a in copies), copies


def test_the_hub_pins_are_the_base_or_an_upgrade_gputap_needs():
    ships = base_ships()
    # the lines the issue names: JupyterHub 5.5.0 and KubeSpawner 7.0.0 in z2jh 4.4.0
    assert ships["jupyterhub"] == Version("5.5.0")
    assert ships["jupyterhub-kubespawner"] == Version("7.0.0")
    same, upgraded = constraints()
    needs = gputap_requirements()
    assert set(same) | set(upgraded) == set(ships), "pin every package the base ships"
    assert not set(same) & set(upgraded)
    for name, version in same.items():
        assert version == ships[name], f"{name}: the base ships {ships[name]}, pinned {version}"
    for name, version in upgraded.items():
        assert version > ships[name], f"{name}: {version} is no upgrade of {ships[name]}"
        # an upgrade is there only because gputap's range refuses the base's version
        assert name in needs and ships[name] not in needs[name].specifier, name
    for name, version in {**same, **upgraded}.items():
        if name in needs:
            assert version in needs[name].specifier, f"{name} {version} outside {needs[name]}"
    # JupyterHub itself is the base's: z2jh's jupyterhub_config.py is written for it
    assert "jupyterhub" in same


# --- names and tags in values.yaml, the Dockerfiles and the install guide ---


def built_as() -> dict[str, str]:
    """image folder → the name:tag docs/install-kubernetes.md builds it as."""
    found = {}
    for match in re.finditer(
        r"docker build -f images/(\w+)/Dockerfile -t (\S+) \.", INSTALL_DOC.read_text()
    ):
        assert found.setdefault(match.group(1), match.group(2)) == match.group(2)
    return found


def test_values_name_the_images_the_guide_builds():
    app_version = str(chart_meta()["appVersion"])
    built = built_as()
    assert set(built) == {"hub", "billing", "singleuser"}
    jupyterhub = values()["jupyterhub"]
    hub, singleuser = jupyterhub["hub"]["image"], jupyterhub["singleuser"]["image"]
    assert f"{hub['name']}:{hub['tag']}" == built["hub"]
    assert f"{singleuser['name']}:{singleuser['tag']}" == built["singleuser"]
    for name, image in built.items():
        assert image == f"gputap/{name}:{app_version}", (name, image)
    # gputap's spawner sets KubeSpawner.image itself (after z2jh's singleuser.image), so the
    # two say the same
    kube = jupyterhub["custom"]["gputap"]["spawner"]["kubernetes"]
    assert kube["image"] == built["singleuser"]
    # billing's image is the billing values' own key
    assert "billing.image" in INSTALL_DOC.read_text()
    billing = values()["billing"]["image"]
    # an empty tag is the chart's appVersion (templates/billing/deployment.yaml)
    assert f"{billing['name']}:{billing['tag'] or app_version}" == built["billing"]


def test_the_images_readme_builds_them_under_the_same_names():
    readme = (IMAGES / "README.md").read_text()
    for name, image in built_as().items():
        assert f"docker build -f images/{name}/Dockerfile -t {image} ." in readme, name


@pytest.fixture(scope="module")
def chart_dir(tmp_path_factory) -> Path:
    return copy_chart(tmp_path_factory.mktemp("chart"))


@pytest.mark.parametrize("values_file", VALUE_FILES, ids=IDS)
def test_the_rendered_pods_run_the_images_values_name(chart_dir, values_file):
    manifests = render(chart_dir, values_of(values_file))
    (hub,) = [m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"] == "hub"]
    (container,) = [c for c in hub["spec"]["template"]["spec"]["containers"] if c["name"] == "hub"]
    assert container["image"] == built_as()["hub"]
    # the servers' image, as the hub pod configures KubeSpawner: z2jh's config from the
    # rendered values, then gputap's configure
    rendered = hub_values(manifests)
    c = z2jh_config(rendered)
    image = rendered["singleuser"]["image"]
    c.KubeSpawner.image = f"{image['name']}:{image['tag']}"
    configure(c, rendered["custom"]["gputap"], environ=hub_environ(manifests))
    assert c.KubeSpawner.image == built_as()["singleuser"]


# --- the single-user image's Python packages: what a server on one machine runs ---


def test_the_singleuser_image_pins_the_servers_packages_inside_gputaps_ranges():
    runs = [a for i, a in dockerfile("singleuser").final.instructions if i == "RUN" and "pip" in a]
    installed = {}
    for run in runs:
        for word in shlex.split(run):
            if re.match(r"[A-Za-z]", word) and re.search(r"[<>=]", word):
                req = Requirement(word)
                installed[canonicalize_name(req.name)] = req.specifier
    # every package it names is pinned to one version (an image rebuilt next month is the same)
    for key, specifier in installed.items():
        (spec,) = specifier
        assert spec.operator == "==" and "*" not in spec.version, (key, str(specifier))
    # inside the ranges of gputap (the servers' packages) and of gputap-lab (its dependencies)
    lab = tomllib.loads((LAB / "pyproject.toml").read_text())["project"]["dependencies"]
    ranges = {
        canonicalize_name(name): gputap_requirements()[canonicalize_name(name)]
        for name in SERVER_PACKAGES
    }
    ranges.update({canonicalize_name(r.name): r for r in map(Requirement, lab)})
    for key, requirement in ranges.items():
        assert key in installed, f"images/singleuser/Dockerfile does not pin {key}"
        (spec,) = installed[key]
        assert Version(spec.version) in requirement.specifier, (key, spec.version, requirement)
    # the servers' config (apps, no update checks) and the apps' icons go with it
    copies = [a for i, a in dockerfile("singleuser").final.instructions if i == "COPY"]
    assert any(a.startswith("hub_config/singleuser/ ") for a in copies), copies


# --- the environment images (images/env-*) and the catalog that offers them ---

#: a framework tag's name -> the package whose version it states
FRAMEWORK_PACKAGES = {"pytorch": "torch", "tensorflow": "tensorflow", "vllm": "vllm"}
ENVIRONMENT_IMAGES = sorted(p.parent.name for p in IMAGES.glob("env-*/Dockerfile"))


def declared_environments() -> dict[str, dict]:
    """Every environment the chart's values and examples declare, by file and key."""
    found = {}
    for path in [CHART / "values.yaml", *sorted((CHART / "examples").glob("*.yaml"))]:
        gputap = (yaml.safe_load(path.read_text()) or {}).get("jupyterhub", {})
        for key, entry in (
            ((gputap.get("custom") or {}).get("gputap") or {}).get("environments", {}).items()
        ):
            found[f"{path.name}:{key}"] = entry
    return found


def pinned_versions(name: str) -> dict[str, str]:
    """package -> the version images/NAME/Dockerfile pins it to with ==."""
    pins = {}
    for instr, args in dockerfile(name).final.instructions:
        if instr != "RUN":
            continue
        for word in shlex.split(args):
            if re.match(r"[A-Za-z]", word) and "==" in word:
                req = Requirement(word)
                (spec,) = req.specifier
                pins[canonicalize_name(req.name)] = spec.version
    return pins


def test_there_are_pytorch_tensorflow_and_vllm_environment_images():
    assert ENVIRONMENT_IMAGES == ["env-pytorch", "env-tensorflow", "env-vllm"]


@pytest.mark.parametrize("name", ENVIRONMENT_IMAGES)
def test_each_environment_image_is_pinned_on_the_singleuser_image_and_built_as_readme_says(name):
    image = dockerfile(name)
    assert image.problems() == []
    (stage,) = image.stages
    app_version = str(chart_meta()["appVersion"])
    # the single-user image holds jupyterhub-singleuser, gputap-lab and jupyter-server-proxy
    # (test_the_singleuser_image_installs_the_servers_packages_at_gputaps_ranges)
    assert stage.image == f"gputap/singleuser:{app_version}"
    assert image.final.user.split(":")[0] == "1000"
    readme = (IMAGES / "README.md").read_text()
    built = f"docker build -f images/{name}/Dockerfile -t gputap/{name}:{app_version} ."
    assert built in readme and built in INSTALL_DOC.read_text()
    # every package it adds is pinned to one version (not a range, not an X.Y.* series)
    for instr, args in image.final.instructions:
        if instr == "RUN" and "pip install" in args:
            for word in shlex.split(args):
                if re.match(r"[A-Za-z]", word):
                    assert ("==" in word and "*" not in word) or word == "install", word


def test_the_catalog_and_the_environment_images_agree():
    declared = declared_environments()
    used = set()
    app_version = str(chart_meta()["appVersion"])
    for where, entry in declared.items():
        image = entry.get("image", "")
        if not image.startswith("gputap/env-"):
            continue
        name, tag = image.removeprefix("gputap/").split(":")
        assert name in ENVIRONMENT_IMAGES, f"{where}: no images/{name}/Dockerfile"
        assert tag == app_version, f"{where}: {image} is not the chart's version {app_version}"
        used.add(name)
        pins = pinned_versions(name)
        framework_tags = [t for t in entry.get("tags", []) if t.split("-")[0] in FRAMEWORK_PACKAGES]
        assert framework_tags, f"{where}: no framework tag (pytorch-X.Y, tensorflow-X.Y, vllm-X.Y)"
        for tag_text in framework_tags:
            framework, version = tag_text.split("-", 1)
            package = FRAMEWORK_PACKAGES[framework]
            assert package in pins, f"{where}: tag {tag_text}, but {name} does not pin {package}"
            assert (pins[package] + ".").startswith(version + "."), (where, tag_text, pins)
    assert used == set(ENVIRONMENT_IMAGES), "an environment image no example offers"
