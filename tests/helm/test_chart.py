"""The umbrella Helm chart (helm/gputap) rendered with Helm's own Go code (helm-python-sdk, no
binary): default values and every example render, lint strictly clean, every manifest is valid
Kubernetes for 1.30 and the newest version kubernetes-validate knows, the schema refuses a
misspelt gputap key by name, and the hub's extraConfig hands `custom.gputap` to gputap's own
loader."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from traitlets.config import Config

from gputap_common.settings import SettingsError, settings_from_mapping
from gputap_common.settings.render import (
    HELM_SCHEMA_COMMAND,
    HELM_SCHEMA_FILE,
    helm_values_schema,
)
from hub_config.z2jh import configure

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "gputap"
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
# the packaged z2jh chart `helm dependency build` would fetch (/work/shared/vendor/helm/README.md)
VENDORED = ROOT.parent / "shared" / "vendor" / "helm" / "jupyterhub-4.4.0.tgz"
KUBE_VERSIONS = ["1.30.0", kubernetes_validate.utils.latest_version()]
RELEASE = {"name": "gputap", "namespace": "gputap"}


def test_three_examples_are_kept():
    assert [p.name for p in EXAMPLES] == [
        "github-postgres.yaml",
        "mig-spot-courses.yaml",
        "minimal-sqlite.yaml",
    ]


@pytest.fixture(scope="module")
def chart_dir(tmp_path_factory) -> Path:
    """A copy of the chart with the vendored subchart in charts/, as `helm dependency build`
    leaves it (the copy keeps parallel test workers from sharing one charts/ folder)."""
    if not VENDORED.exists():
        pytest.fail(f"the vendored z2jh chart is missing: {VENDORED}")
    target = tmp_path_factory.mktemp("chart") / "gputap"
    shutil.copytree(CHART, target, ignore=shutil.ignore_patterns("charts"))
    (target / "charts").mkdir()
    shutil.copy(VENDORED, target / "charts" / VENDORED.name)
    return target


def values_of(path: Path | None) -> dict:
    return {} if path is None else yaml.safe_load(path.read_text())


def render(chart_dir: Path, values: dict) -> list[dict]:
    rendered = helm.Chart.load(chart_dir).render(values, **RELEASE, is_install=True)
    manifests = []
    for name, text in sorted(rendered.items()):
        if not name.endswith((".yaml", ".yml")):
            continue
        manifests += [doc for doc in yaml.safe_load_all(text) if doc]
    return manifests


VALUE_FILES = [None, *EXAMPLES]
IDS = ["defaults", *(p.stem for p in EXAMPLES)]


def test_the_subchart_is_the_pinned_z2jh(chart_dir):
    assert helm.dependency_list(chart_dir) == [
        {
            "name": "jupyterhub",
            "version": "4.4.0",
            "repository": "https://hub.jupyter.org/helm-chart/",
            "status": "ok",
        }
    ]
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    z2jh = helm.Chart.load(chart_dir / "charts" / VENDORED.name).metadata
    assert meta["kubeVersion"] == z2jh["kubeVersion"] == ">=1.28.0-0"


def test_a_missing_subchart_is_found(tmp_path):
    bare = tmp_path / "gputap"
    shutil.copytree(CHART, bare, ignore=shutil.ignore_patterns("charts"))
    assert [d["status"] for d in helm.dependency_list(bare)] == ["missing"]


def test_the_lock_matches_chart_yaml(tmp_path):
    """`helm dependency build` accepts Chart.lock (it refuses one out of sync with Chart.yaml
    before fetching; here the fetch itself cannot reach the repository)."""
    copy = tmp_path / "gputap"
    shutil.copytree(CHART, copy, ignore=shutil.ignore_patterns("charts"))
    with pytest.raises(helm.HelmError) as caught:
        helm.dependency_build(copy)
    assert "out of sync" not in str(caught.value)
    lock = yaml.safe_load((CHART / "Chart.lock").read_text())
    assert lock["dependencies"] == [
        {
            "name": "jupyterhub",
            "repository": "https://hub.jupyter.org/helm-chart/",
            "version": "4.4.0",
        }
    ]
    # and a stale digest is refused, so the check above can fail
    stale = lock | {"digest": "sha256:" + "0" * 64}
    (copy / "Chart.lock").write_text(yaml.safe_dump(stale))
    with pytest.raises(helm.HelmError, match="out of sync"):
        helm.dependency_build(copy)


@pytest.mark.parametrize("values_file", VALUE_FILES, ids=IDS)
def test_strict_lint_has_no_errors(chart_dir, values_file):
    report = helm.lint(chart_dir, values_of(values_file), strict=True, namespace="gputap")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and problems == [], report


@pytest.mark.parametrize("values_file", VALUE_FILES, ids=IDS)
def test_every_manifest_is_valid_kubernetes(chart_dir, values_file):
    manifests = render(chart_dir, values_of(values_file))
    assert len(manifests) >= 20
    kinds = {m["kind"] for m in manifests}
    assert {"Deployment", "Secret", "ConfigMap", "Service"} <= kinds
    validate_all(manifests)


def validate_all(manifests: list[dict]) -> None:
    """Every manifest valid Kubernetes, strictly, for each version of KUBE_VERSIONS."""
    for version in KUBE_VERSIONS:
        for manifest in manifests:
            where = f"{manifest['kind']}/{manifest['metadata']['name']} on Kubernetes {version}"
            try:
                kubernetes_validate.validate(manifest, version, strict=True)
            except kubernetes_validate.utils.ValidationError as e:
                pytest.fail(f"{where}: {e.message} at {list(e.path)}")


def hub_values(manifests: list[dict]) -> dict:
    """What z2jh's get_config reads in the hub pod: Secret `hub`, key values.yaml."""
    import base64

    (secret,) = [m for m in manifests if m["kind"] == "Secret" and m["metadata"]["name"] == "hub"]
    text = secret.get("stringData", {}).get("values.yaml")
    if text is None:
        text = base64.b64decode(secret["data"]["values.yaml"]).decode()
    return yaml.safe_load(text)


# what the examples' Secrets would hold, by the variable the hub container reads them as
SECRET_VALUES = {
    "GPUTAP__HUB__GITHUB__CLIENT_SECRET": "0123456789abcdef0123456789abcdef01234567",
    "GPUTAP__BILLING__DATABASE_URL": "postgresql+psycopg://gputap:pw@postgres:5432/billing",
}


def hub_environ(manifests: list[dict]) -> dict[str, str]:
    """The hub container's gputap variables (from Secrets: stand-in values) and namespace."""
    (hub,) = [m for m in manifests if m["kind"] == "Deployment" and m["metadata"]["name"] == "hub"]
    (container,) = [c for c in hub["spec"]["template"]["spec"]["containers"] if c["name"] == "hub"]
    names = [e["name"] for e in container["env"] if e["name"].startswith("GPUTAP__")]
    assert set(names) <= set(SECRET_VALUES), names
    (release,) = [e["value"] for e in container["env"] if e["name"] == "HELM_RELEASE_NAME"]
    secrets = {name: SECRET_VALUES[name] for name in names}
    return {"POD_NAMESPACE": "gpu-ns", "HELM_RELEASE_NAME": release, **secrets}


def z2jh_config(values: dict) -> Config:
    """JupyterHub's config as z2jh's jupyterhub_config.py leaves it for hub.extraConfig:
    services from hub.services (tokens from Secret `hub`), roles from hub.loadRoles."""
    c = Config()
    c.JupyterHub.services = [
        {"name": key, **service, "api_token": f"z2jh-{key}"}
        for key, service in values["hub"].get("services", {}).items()
    ]
    c.JupyterHub.load_roles = [
        {"name": key, **role} for key, role in values["hub"].get("loadRoles", {}).items()
    ]
    c.KubeSpawner.uid = values["singleuser"]["uid"]
    c.KubeSpawner.fs_gid = values["singleuser"]["fsGid"]
    return c


@pytest.mark.parametrize("values_file", VALUE_FILES, ids=IDS)
def test_the_hub_reads_custom_gputap_through_gputap_loader(chart_dir, values_file):
    manifests = render(chart_dir, values_of(values_file))
    values = hub_values(manifests)
    snippet = values["hub"]["extraConfig"]["gputap"]
    assert 'configure(c, get_config("custom.gputap"))' in snippet
    c = z2jh_config(values)
    settings = configure(c, values["custom"]["gputap"], environ=hub_environ(manifests))
    assert c.JupyterHub.spawner_class == "gputap-kubernetes"
    assert settings.spawner["backend"] == "kubernetes"
    expected_ns = values["custom"]["gputap"]["spawner"].get("kubernetes", {}).get("namespace")
    assert c.KubeSpawner.namespace == (expected_ns or "gpu-ns")
    assert c.KubeSpawner.pvc_name_template == "home-{username}"
    # servers run as the image's user, their volumes given to its group (z2jh's and gputap's)
    assert (c.KubeSpawner.uid, c.KubeSpawner.fs_gid) == (1000, 100)


def test_examples_set_what_they_say(chart_dir):
    rendered = {p.stem: render(chart_dir, values_of(p)) for p in EXAMPLES}
    by_name = {name: hub_values(manifests) for name, manifests in rendered.items()}
    environ = hub_environ(rendered["github-postgres"])
    github = configure(
        z2jh_config(by_name["github-postgres"]),
        by_name["github-postgres"]["custom"]["gputap"],
        environ=environ,
    )
    assert (
        github.hub["github"]["client_secret"] == SECRET_VALUES["GPUTAP__HUB__GITHUB__CLIENT_SECRET"]
    )
    assert github.billing["database_url"] == SECRET_VALUES["GPUTAP__BILLING__DATABASE_URL"]
    mig = settings_from_mapping(by_name["mig-spot-courses"]["custom"]["gputap"], "mig", {})
    assert mig.courses["instructor_teams"]
    assert any("/" in key for key in mig.billing["prices"])


def test_configure_refuses_a_backend_other_than_kubernetes():
    with pytest.raises(SettingsError, match="spawner.backend"):
        configure(Config(), {"spawner": {"backend": "local"}}, environ={})


def test_configure_names_a_misspelt_key():
    with pytest.raises(SettingsError, match="backnd"):
        configure(Config(), {"spawner": {"backnd": "kubernetes"}}, environ={})


def test_configure_refuses_a_server_user_other_than_z2jhs():
    c = Config()
    c.KubeSpawner.uid, c.KubeSpawner.fs_gid = 1000, 1000  # z2jh's singleuser.uid and fsGid
    with pytest.raises(SettingsError, match=r"singleuser.fsGid is 1000 .*kubernetes.fs_gid is 100"):
        configure(c, {"spawner": {"backend": "kubernetes"}}, environ={})


def test_values_schema_is_generated_from_the_settings_schema():
    assert json.loads(HELM_SCHEMA_FILE.read_text()) == helm_values_schema(), (
        f"regenerate it: {HELM_SCHEMA_COMMAND}"
    )


@pytest.mark.parametrize(
    "gputap, named",
    [
        ({"spawner": {"backnd": "kubernetes"}}, "backnd"),
        ({"biling": {}}, "biling"),
        ({"billing": {"spot_discount_percent": "lots"}}, "spot_discount_percent"),
    ],
)
def test_a_misspelt_gputap_key_fails_rendering_naming_it(chart_dir, gputap, named):
    values = {"jupyterhub": {"custom": {"gputap": gputap}}}
    with pytest.raises(helm.HelmError) as caught:
        helm.Chart.load(chart_dir).render(values, **RELEASE)
    assert named in str(caught.value)


def test_an_unknown_key_under_jupyterhub_fails_rendering(chart_dir):
    with pytest.raises(helm.HelmError, match="gputapp"):
        helm.Chart.load(chart_dir).render({"jupyterhub": {"gputapp": {}}}, **RELEASE)


def test_notes_say_where_to_sign_in_and_what_the_gpus_need(chart_dir):
    rendered = helm.Chart.load(chart_dir).render({}, **RELEASE, is_install=True)
    (notes,) = [text for name, text in rendered.items() if name == "gputap/templates/NOTES.txt"]
    for needed in [
        "kubectl --namespace gputap get service proxy-public",
        "/services/billing/health",
        "GPU Operator",
        "GPU Feature Discovery",
        '"mixed" strategy',
        "renameByDefault: true",
    ]:
        assert needed in notes, needed
    with_ingress = {"jupyterhub": {"ingress": {"enabled": True, "hosts": ["gpu.example.org"]}}}
    rendered = helm.Chart.load(chart_dir).render(with_ingress, **RELEASE, is_install=True)
    (notes,) = [text for name, text in rendered.items() if name == "gputap/templates/NOTES.txt"]
    assert "https://gpu.example.org/" in notes
