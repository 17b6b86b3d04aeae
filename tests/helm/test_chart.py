"""The umbrella Helm chart (helm/gputap) rendered with Helm's own Go code (helm-python-sdk, no
binary): default values and every example render, lint strictly clean, every manifest is valid
Kubernetes for 1.30 and the newest version kubernetes-validate knows, the schema refuses a
misspelt gputap key by name, and the hub's extraConfig hands `custom.gputap` to gputap's own
loader."""

from __future__ import annotations

import json
import shutil
import sys
import types
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from traitlets.config import Config

from gputap_common import scopes
from gputap_common.settings import SettingsError, deep_merge, settings_from_mapping
from gputap_common.settings.render import (
    HELM_SCHEMA_COMMAND,
    HELM_SCHEMA_FILE,
    helm_values_schema,
)
from hub_config.hub import apply
from hub_config.z2jh import configure
from tests.helm.chart import CHART, RELEASE, VENDORED, copy_chart, render, values_of
from tests.kube_sim.pod_security import pod_specs, restricted_violations

EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
KUBE_VERSIONS = ["1.30.0", kubernetes_validate.utils.latest_version()]


def test_three_examples_are_kept():
    assert [p.name for p in EXAMPLES] == [
        "github-postgres.yaml",
        "mig-spot-courses.yaml",
        "minimal-sqlite.yaml",
    ]


@pytest.fixture(scope="module")
def chart_dir(tmp_path_factory) -> Path:
    """A copy of the chart with the vendored subchart (tests/helm/chart.py)."""
    try:
        return copy_chart(tmp_path_factory.mktemp("chart"))
    except FileNotFoundError as e:
        pytest.fail(str(e))


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


def passed_through(values: dict) -> Config:
    """z2jh's pass-through of hub.config, loaded before hub.extraConfig."""
    c = Config()
    for section, traits in values["hub"].get("config", {}).items():
        c[section].update(traits)
    return c


def z2jh_config(values: dict) -> Config:
    """JupyterHub's config as z2jh's jupyterhub_config.py leaves it for hub.extraConfig:
    hub.config passed through, services from hub.services (tokens from Secret `hub`), roles
    from hub.loadRoles."""
    c = passed_through(values)
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


def test_the_charts_extra_config_stops_the_hub_on_a_typo_with_one_line(monkeypatch, capsys):
    snippet = yaml.safe_load((CHART / "values.yaml").read_text())["jupyterhub"]["hub"][
        "extraConfig"
    ]["gputap"]
    z2jh = types.ModuleType("z2jh")
    z2jh.get_config = lambda key: {"spawner": {"backnd": "kubernetes"}}
    monkeypatch.setitem(sys.modules, "z2jh", z2jh)
    with pytest.raises(SystemExit) as stopped:
        exec(snippet, {"c": Config()})  # noqa: S102 (as z2jh's jupyterhub_config.py runs it)
    assert stopped.value.code == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("gputap settings (hub): jupyterhub.custom.gputap: ")
    assert "spawner.backnd is not a setting; did you mean spawner.backend?" in line


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
        '"single" strategy',
        "with or without renameByDefault",
    ]:
        assert needed in notes, needed
    with_ingress = {"jupyterhub": {"ingress": {"enabled": True, "hosts": ["gpu.example.org"]}}}
    rendered = helm.Chart.load(chart_dir).render(with_ingress, **RELEASE, is_install=True)
    (notes,) = [text for name, text in rendered.items() if name == "gputap/templates/NOTES.txt"]
    assert "https://gpu.example.org/" in notes


def test_admins_and_instructors_hold_billing_roles_as_on_one_machine(chart_dir):
    """On the chart as on one machine, billing admins are the hub's admin users and admin
    teams, and instructors the configured ones and instructor teams: without these roles the
    billing page tells an admin they may not grant credit, and an instructor that they have no
    course."""
    example = values_of(CHART / "examples" / "mig-spot-courses.yaml")
    gputap = example["jupyterhub"]["custom"]["gputap"]
    gputap["hub"] = {
        **gputap.get("hub", {}),
        "admin_users": ["octo-admin"],
        "github": {
            "client_id": "Iv1.0123456789abcdef",
            "client_secret": "0123456789abcdef0123456789abcdef01234567",
            "callback_url": "https://gputap.example.org/hub/oauth_callback",
            "allowed_organizations": ["acme"],
            "admin_teams": ["acme:platform"],
        },
    }
    gputap["courses"] = {**gputap.get("courses", {}), "instructors": ["prof-ada"]}
    manifests = render(chart_dir, example)
    values = hub_values(manifests)
    c = z2jh_config(values)
    settings = configure(c, values["custom"]["gputap"], environ=hub_environ(manifests))
    roles = {role["name"]: role for role in c.JupyterHub.load_roles}
    admin = roles["gputap-billing-admin"]
    assert admin["users"] == ["octo-admin"] and admin["groups"] == ["acme:platform"]
    assert set(admin["scopes"]) == {scopes.BILLING_ADMIN, scopes.BILLING_ACCESS}
    instructor = roles["gputap-instructor"]
    assert instructor["users"] == ["prof-ada"]
    assert instructor["groups"] == sorted(settings.courses["instructor_teams"])
    assert set(instructor["scopes"]) == {scopes.BILLING_INSTRUCTOR, scopes.BILLING_ACCESS}


def culler(c: Config) -> dict | None:
    found = [s for s in c.JupyterHub.services if "cull" in s["name"]]
    assert len(found) <= 1, f"more than one culler: {found}"
    return found[0] if found else None


def test_gputap_culls_idle_servers_from_custom_gputap_telling_why(chart_dir):
    """One settings source: custom.gputap.idle drives the culler, and it is gputap's (its stops
    say that the server was idle, and for how long), not z2jh's, which the chart turns off."""
    values = {"jupyterhub": {"custom": {"gputap": {"idle": {"timeout_seconds": 1800}}}}}
    manifests = render(chart_dir, values)
    rendered = hub_values(manifests)
    assert rendered["cull"]["enabled"] is False
    c = z2jh_config(rendered)
    configure(c, rendered["custom"]["gputap"], environ=hub_environ(manifests))
    service = culler(c)
    assert service is not None and "hub_config.idle_culler" in service["command"]
    assert "--timeout=1800" in service["command"]
    # it asks the hub in its own pod, as z2jh's culler does
    assert "--url=http://localhost:8081/hub/api" in service["command"]
    assert c.KubeSpawner.environment["JUPYTERHUB_ACTIVITY_INTERVAL"] == "60"
    roles = {role["name"]: role for role in c.JupyterHub.load_roles}
    assert roles["idle-culler"]["services"] == ["idle-culler"]


def test_two_cullers_are_refused_naming_both(chart_dir):
    manifests = render(chart_dir, {"jupyterhub": {"cull": {"enabled": True}}})
    rendered = hub_values(manifests)
    c = z2jh_config(rendered)
    c.JupyterHub.services.append(  # what z2jh's jupyterhub_config.py adds for cull.enabled
        {"name": "jupyterhub-idle-culler", "command": ["python3", "-m", "jupyterhub_idle_culler"]}
    )
    with pytest.raises(SettingsError, match=r"jupyterhub\.cull\.enabled.*custom\.gputap\.idle"):
        configure(c, rendered["custom"]["gputap"], environ=hub_environ(manifests))
    # with gputap's culler off, z2jh's may run alone
    off = {"idle": {"enabled": False}}
    configure(c, {**rendered["custom"]["gputap"], **off}, environ=hub_environ(manifests))


def test_singleuser_extra_env_is_kept_beside_gputap_environment(chart_dir):
    """z2jh's singleuser.extraEnv, which operators of z2jh set, reaches the servers beside
    custom.gputap's environment (which wins where both name a variable)."""
    values = {
        "jupyterhub": {
            "singleuser": {"extraEnv": {"HF_HOME": "/data/hf", "TZ": "Asia/Tokyo"}},
            "custom": {"gputap": {"spawner": {"kubernetes": {"environment": {"TZ": "UTC"}}}}},
        }
    }
    manifests = render(chart_dir, values)
    rendered = hub_values(manifests)
    c = z2jh_config(rendered)
    # what z2jh's jupyterhub_config.py sets from singleuser.extraEnv
    c.KubeSpawner.environment = dict(rendered["singleuser"]["extraEnv"])
    configure(c, rendered["custom"]["gputap"], environ=hub_environ(manifests))
    assert c.KubeSpawner.environment["HF_HOME"] == "/data/hf"
    assert c.KubeSpawner.environment["TZ"] == "UTC"


def test_shared_data_in_the_charts_values_is_mounted_read_only_in_every_server(chart_dir):
    """``custom.gputap.shared_data`` passes the chart's values schema and becomes read-only
    volumes of every server's pod, beside z2jh's own (the home)."""
    example = values_of(CHART / "examples" / "mig-spot-courses.yaml")
    example["jupyterhub"]["custom"]["gputap"]["shared_data"] = [
        {"name": "hf", "mount_path": "/models", "kind": "models", "claim": "hf-models"}
    ]
    manifests = render(chart_dir, example)
    values = hub_values(manifests)
    c = z2jh_config(values)
    configure(c, values["custom"]["gputap"], environ=hub_environ(manifests))
    assert {
        "name": "shared-hf",
        "persistentVolumeClaim": {"claimName": "hf-models", "readOnly": True},
    } in c.KubeSpawner.volumes
    assert {"name": "shared-hf", "mountPath": "/models", "readOnly": True} in (
        c.KubeSpawner.volume_mounts
    )
    assert c.KubeSpawner.environment["HF_HUB_CACHE"] == "/models"
    assert c.KubeSpawner.environment["HF_HUB_OFFLINE"] == "1"
    with pytest.raises(SettingsError, match=r"shared_data\[0\].mount_path /usr/models"):
        bad = {"spawner": {"backend": "kubernetes"}, "shared_data": [
            {"name": "hf", "mount_path": "/usr/models", "claim": "hf-models"}]}  # fmt: skip
        configure(z2jh_config(values), bad, environ=hub_environ(manifests))


def puller(manifests: list[dict]) -> dict | None:
    found = [m for m in manifests if m["metadata"]["name"].endswith("-environment-puller")]
    return found[0] if found else None


def test_the_environments_images_are_pre_pulled_on_every_node_servers_may_run_on(chart_dir):
    """The example's three environment images, each once, pulled by init containers of a
    DaemonSet that tolerates what servers tolerate; none without such environments, none when
    z2jh's continuous puller is off."""
    example = values_of(CHART / "examples" / "github-postgres.yaml")
    gputap = example["jupyterhub"]["custom"]["gputap"]
    gputap["environments"]["pytorch-copy"] = {"name": "Same", "image": "gputap/env-pytorch:0.1.0"}
    gputap["environments"]["plain"] = {"name": "The servers' own image",
                                       "image": "gputap/singleuser:0.1.0"}  # fmt: skip
    extra = {"key": "gputap.io/dedicated", "operator": "Equal", "value": "users",
             "effect": "NoSchedule"}  # fmt: skip
    example["jupyterhub"]["singleuser"] = {"extraTolerations": [extra]}
    daemonset = puller(render(chart_dir, example))
    spec = daemonset["spec"]["template"]["spec"]
    assert [c["image"] for c in spec["initContainers"]] == [
        "gputap/env-pytorch:0.1.0",
        "gputap/env-tensorflow:0.1.0",
        "gputap/env-vllm:0.1.0",
    ]
    assert all(c["command"] == ["/bin/sh", "-c", 'echo "Pulling complete"']
               for c in spec["initContainers"])  # fmt: skip
    [pause] = spec["containers"]
    assert pause["image"].startswith("registry.k8s.io/pause:")
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert {"key": "hub.jupyter.org/dedicated", "operator": "Equal", "value": "user",
            "effect": "NoSchedule"} in spec["tolerations"]  # fmt: skip
    assert extra in spec["tolerations"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["initContainers"][0]["securityContext"]["runAsNonRoot"] is True
    validate_all([daemonset])
    assert puller(render(chart_dir, values_of(None))) is None
    example["jupyterhub"]["prePuller"] = {"continuous": {"enabled": False}}
    assert puller(render(chart_dir, example)) is None


# what only the hub on a machine of its own sets (where it listens, its proxy, database and
# data directory), or each side its own way (billing's address and the spawner's token)
ONE_MACHINE_ONLY = {
    "JupyterHub": {
        "ip",
        "port",
        "hub_ip",
        "hub_port",
        "base_url",
        "db_url",
        "pid_file",
        "cookie_secret_file",
        "services",
        "load_roles",
    },  # fmt: skip
    "ConfigurableHTTPProxy": {"command", "api_url", "pid_file"},
    "GPUSpawnerMixin": {"billing_url", "billing_token"},
}


def without_one_machine_only(c: Config) -> dict:
    kept = {
        section: {
            k: v
            for k, v in dict(c[section]).items()
            if k not in ONE_MACHINE_ONLY.get(section, set())
        }  # fmt: skip
        for section in c
    }
    return {section: traits for section, traits in kept.items() if traits}


@pytest.mark.parametrize("values_file", VALUE_FILES, ids=IDS)
def test_the_charts_hub_is_configured_as_one_machines_for_the_same_settings(
    chart_dir, values_file, tmp_path
):
    """The chart's hub (z2jh.configure) sets what one machine's (hub.apply, backend kubernetes)
    sets for the same settings: environments, apps, worker groups, idle servers, disks, login,
    courses, cookies, the spawner's timeouts and its catalog; only where the hub listens, its
    proxy, database and billing's address differ."""
    manifests = render(chart_dir, values_of(values_file))
    values = hub_values(manifests)
    chart = z2jh_config(values)
    chart.CryptKeeper.keys = ["z2jh-crypt-key"]  # z2jh's, from its Secret `hub`
    settings = configure(chart, values["custom"]["gputap"], environ=hub_environ(manifests))
    # the same settings (the chart's namespace and PriorityClasses included) on one machine
    mapping = deep_merge(
        settings.raw,
        {
            "data_dir": str(tmp_path),
            "spawner": {"kubernetes": {"hub_ip": "10.42.0.1"}},
            # the users' subdomains the chart names (z2jh's own setting)
            "hub": {"subdomain_host": chart.JupyterHub.get("subdomain_host", "")},
        },
    )
    one = passed_through(values)
    one.KubeSpawner.uid, one.KubeSpawner.fs_gid = chart.KubeSpawner.uid, chart.KubeSpawner.fs_gid
    one.CryptKeeper.keys = ["z2jh-crypt-key"]
    apply(one, settings_from_mapping(mapping, "one machine", {}))
    assert without_one_machine_only(chart) == without_one_machine_only(one)
    # which covers what the chart used to leave out
    for trait in ["environments", "apps", "max_workers", "worker_idle_seconds"]:
        assert chart.GPUSpawnerMixin[trait] == one.GPUSpawnerMixin[trait], trait
    assert chart.GPUSpawnerMixin.environments == settings.environments
    assert chart.JupyterHub.tornado_settings["cookie_options"] == {"samesite": "Lax"}
    assert chart.Spawner.poll_interval == 10
    # the roles both give users, the spawner, billing's people and the culler
    chart_roles = {role["name"]: role for role in chart.JupyterHub.load_roles}
    one_roles = {role["name"]: role for role in one.JupyterHub.load_roles}
    for name in ["user", "gputap-hub", "gputap-billing-admin", "gputap-instructor", "idle-culler"]:
        assert chart_roles.get(name, {}).get("scopes") == one_roles.get(name, {}).get("scopes")


def test_the_charts_cookies_are_same_site_lax_beside_z2jhs_tornado_settings(chart_dir):
    """docs/security.md: the hub's cookies (and, through JUPYTERHUB_COOKIE_OPTIONS, the
    servers') are SameSite=Lax on the chart as on one machine; z2jh's own tornado_settings
    (slow_spawn_timeout: 0, the spawn page at once) stay. The hub polls servers every 10 s."""
    manifests = render(chart_dir, values_of(None))
    values = hub_values(manifests)
    c = z2jh_config(values)
    # what z2jh's jupyterhub_config.py sets
    c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}
    configure(c, values["custom"]["gputap"], environ=hub_environ(manifests))
    assert c.JupyterHub.tornado_settings == {
        "slow_spawn_timeout": 0,
        "cookie_options": {"samesite": "Lax"},
    }
    assert c.Spawner.poll_interval == 10


@pytest.mark.parametrize("values_file", VALUE_FILES, ids=IDS)
def test_every_pod_the_chart_makes_passes_pod_security_restricted(chart_dir, values_file):
    """z2jh's pods (hub, proxy, pullers, schedulers, placeholders), billing's and the
    environment puller's, in a namespace labelled pod-security.kubernetes.io/enforce:
    restricted (the servers' and workers' own pods: tests/kube, whose namespace is)."""
    specs = pod_specs(render(chart_dir, values_of(values_file)))
    assert len(specs) >= 6
    refused = {name: v for name, spec in specs.items() if (v := restricted_violations(spec))}
    assert refused == {}
