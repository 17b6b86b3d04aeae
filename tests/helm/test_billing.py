"""Billing as the chart's own Deployment (helm/gputap/templates/billing/): SQLite on a PVC with
one replica by default, PostgreSQL by a URL from a Secret for more; migrations in an init
container; probes on billing's health endpoint; a non-root read-only container; settings from
``custom.gputap`` in a ConfigMap whose checksum rolls the pods; the hub token from z2jh's
Secret ``hub``; and the hub reaching billing at its Service (hub_config/z2jh.py)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import helm_python as helm
import pytest
import yaml
from traitlets.config import Config

from billing_service.app import BadCookieSecret, cookie_secret
from billing_service.config import load_billing_config, load_billing_settings
from billing_service.domain.courses import course_rules
from gputap_common import scopes
from gputap_common.settings import SettingsError, settings_from_mapping
from hub_config.hub import _services
from hub_config.z2jh import configure
from tests.helm import test_chart
from tests.helm.test_chart import RELEASE, hub_values, validate_all

# the chart with the vendored z2jh in charts/, as test_chart.py prepares it
chart_dir = test_chart.chart_dir

POSTGRES = {"database": {"urlSecret": {"name": "gputap-db", "key": "billing-url"}}}


def render(chart_dir: Path, values: dict) -> list[dict]:
    rendered = helm.Chart.load(chart_dir).render(values, **RELEASE, is_install=True)
    return [
        doc
        for name, text in sorted(rendered.items())
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def one(manifests: list[dict], kind: str, name: str) -> dict:
    found = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def billing_container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_default_billing_is_one_sqlite_replica_on_a_pvc(chart_dir):
    manifests = render(chart_dir, {})
    deployment = one(manifests, "Deployment", "gputap-billing")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    labels = {
        "app.kubernetes.io/name": "gputap",
        "app.kubernetes.io/instance": "gputap",
        "app.kubernetes.io/component": "billing",
    }
    assert spec["selector"]["matchLabels"] == labels
    pod = spec["template"]["spec"]
    assert labels.items() <= spec["template"]["metadata"]["labels"].items()
    assert pod["serviceAccountName"] == "gputap-billing"
    claim = one(manifests, "PersistentVolumeClaim", "gputap-billing")
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == "gputap-billing"
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}}
    container = billing_container(deployment)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts["/tmp"] == "tmp" and mounts["/var/lib/gputap-billing"] == "data"
    assert container["command"] == ["python", "-m", "billing_service"]
    assert container["resources"]["requests"] and container["resources"]["limits"]
    validate_all(manifests)


def test_migrations_run_before_billing_starts(chart_dir):
    deployment = one(render(chart_dir, {}), "Deployment", "gputap-billing")
    pod = deployment["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    container = billing_container(deployment)
    assert init["command"] == ["python", "-m", "billing_service", "upgrade-db"]
    # the same image, settings and database as billing itself
    for key in ["image", "env", "volumeMounts", "securityContext"]:
        assert init[key] == container[key], key


def test_billing_runs_non_root_read_only(chart_dir):
    deployment = one(render(chart_dir, {}), "Deployment", "gputap-billing")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["fsGroup"] == 1000  # the image's billing user
    for container in [billing_container(deployment), *pod["initContainers"]]:
        assert container["securityContext"] == {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }


def test_probes_ask_billing_health_on_its_port(chart_dir):
    manifests = render(chart_dir, {})
    container = billing_container(one(manifests, "Deployment", "gputap-billing"))
    (port,) = container["ports"]
    assert port["containerPort"] == 8091  # billing.port's default
    for probe in ["readinessProbe", "livenessProbe"]:
        get = container[probe]["httpGet"]
        assert get == {"path": "/services/billing/health", "port": "http"}, probe
    service = one(manifests, "Service", "gputap-billing")
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8091, "targetPort": "http", "protocol": "TCP"}
    ]
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "billing"


def environ_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_billing_runs_with_z2jh_token_as_a_hub_service(chart_dir):
    manifests = render(chart_dir, {})
    env = environ_of(billing_container(one(manifests, "Deployment", "gputap-billing")))
    assert env["JUPYTERHUB_API_TOKEN"] == {
        "secretKeyRef": {"name": "hub", "key": "hub.services.billing.apiToken"}
    }
    assert env["JUPYTERHUB_API_URL"] == "http://hub:8081/hub/api"
    assert env["JUPYTERHUB_SERVICE_PREFIX"] == "/services/billing/"
    assert env["JUPYTERHUB_SERVICE_URL"] == "http://0.0.0.0:8091"
    assert env["GPUTAP_SETTINGS"] == "/etc/gputap-billing/settings.yaml"
    # z2jh made that token: the hub Secret holds it and the hub registers billing with it
    hub_secret = one(manifests, "Secret", "hub")
    assert "hub.services.billing.apiToken" in hub_secret["data"]
    values = hub_values(manifests)
    assert "billing" in values["hub"]["services"]
    # and z2jh's hub NetworkPolicy lets it in: it admits pods with this label only
    (policy,) = [
        m for m in manifests if m["kind"] == "NetworkPolicy" and m["metadata"]["name"] == "hub"
    ]
    admitted = [
        peer["podSelector"]["matchLabels"]
        for rule in policy["spec"]["ingress"]
        for peer in rule.get("from", [])
        if "podSelector" in peer
    ]
    pod = one(manifests, "Deployment", "gputap-billing")["spec"]["template"]["metadata"]
    assert any(labels.items() <= pod["labels"].items() for labels in admitted), admitted


def test_billing_role_has_exactly_the_scopes_of_one_machine(chart_dir, tmp_path):
    values = hub_values(render(chart_dir, {}))
    c = Config()
    _services(c, settings_from_mapping({"data_dir": str(tmp_path)}, "test", {}), "t")
    (machine,) = [r for r in c.JupyterHub.load_roles if r["name"] == "gputap-billing"]
    chart = values["hub"]["loadRoles"]["gputap-billing"]
    assert chart["services"] == ["billing"]
    assert sorted(chart["scopes"]) == sorted(machine["scopes"])
    (billing,) = [s for s in c.JupyterHub.services if s["name"] == "billing"]
    service = values["hub"]["services"]["billing"]
    assert service["oauth_no_confirm"] is True
    assert service["oauth_client_allowed_scopes"] == billing["oauth_client_allowed_scopes"]


def settings_in(manifests: list[dict], tmp_path: Path):
    config_map = one(manifests, "ConfigMap", "gputap-billing")
    path = tmp_path / "settings.yaml"
    path.write_text(config_map["data"]["settings.yaml"])
    return load_billing_settings(path, {})


def test_billing_settings_come_from_custom_gputap(chart_dir, tmp_path):
    gputap = {
        "billing": {"trial_credit": "3.50", "spot_discount_percent": 40},
        "hub": {"admin_users": ["octo"]},
    }
    manifests = render(chart_dir, {"jupyterhub": {"custom": {"gputap": gputap}}})
    text = one(manifests, "ConfigMap", "gputap-billing")["data"]["settings.yaml"]
    raw = yaml.safe_load(text)
    assert set(raw) <= {"data_dir", "billing", "spawner", "environments"}  # never the hub's
    settings = settings_in(manifests, tmp_path)
    assert settings.billing["trial_credit"] == "3.50"
    assert settings.billing["spot_discount_percent"] == 40
    assert settings.billing["database_url"] == "sqlite:////var/lib/gputap-billing/billing.sqlite"
    assert settings.spawner["backend"] == "kubernetes"
    # billing meters the servers' namespace: the release's unless set
    assert settings.spawner["kubernetes"]["namespace"] == "gputap"
    elsewhere = {"spawner": {"kubernetes": {"namespace": "gpu-users"}}}
    manifests = render(chart_dir, {"jupyterhub": {"custom": {"gputap": elsewhere}}})
    assert settings_in(manifests, tmp_path).spawner["kubernetes"]["namespace"] == "gpu-users"


def test_a_course_may_pin_one_of_the_charts_environments(chart_dir, tmp_path, monkeypatch):
    """Billing knows the environments of custom.gputap, as on one machine
    (hub.billing_settings): an instructor's course may pin the example's PyTorch, and one
    the hub does not offer is refused."""
    example = test_chart.values_of(test_chart.CHART / "examples" / "github-postgres.yaml")
    manifests = render(chart_dir, example)
    raw = yaml.safe_load(one(manifests, "ConfigMap", "gputap-billing")["data"]["settings.yaml"])
    assert raw["environments"] == example["jupyterhub"]["custom"]["gputap"]["environments"]
    settings_in(manifests, tmp_path)  # writes tmp_path/settings.yaml
    # what billing's container reads: GPUTAP_SETTINGS names the mounted ConfigMap
    monkeypatch.setenv("GPUTAP_SETTINGS", str(tmp_path / "settings.yaml"))
    config = load_billing_config()
    assert {"pytorch", "tensorflow", "vllm"} <= config.environments
    course = {"name": "Deep learning", "allowed": ["T4"], "environment": "pytorch"}
    assert course_rules(course, {"T4"}, config.environments).environment == "pytorch"
    with pytest.raises(ValueError, match="'jax' is not one of the hub's environments"):
        course_rules({**course, "environment": "jax"}, {"T4"}, config.environments)


def checksum(manifests: list[dict]) -> str:
    deployment = one(manifests, "Deployment", "gputap-billing")
    return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]


def test_a_billing_setting_change_rolls_billing(chart_dir):
    before = render(chart_dir, {})
    text = one(before, "ConfigMap", "gputap-billing")["data"]["settings.yaml"]
    assert checksum(before) == hashlib.sha256(text.encode()).hexdigest()
    cheaper = {"jupyterhub": {"custom": {"gputap": {"billing": {"trial_credit": "1.00"}}}}}
    assert checksum(render(chart_dir, cheaper)) != checksum(before)
    # a hub-only change leaves billing running
    hub_only = {"jupyterhub": {"custom": {"gputap": {"hub": {"admin_users": ["octo"]}}}}}
    assert checksum(render(chart_dir, hub_only)) == checksum(before)


def test_postgres_from_a_secret_allows_two_replicas(chart_dir):
    manifests = render(chart_dir, {"billing": {**POSTGRES, "replicas": 2}})
    deployment = one(manifests, "Deployment", "gputap-billing")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert not [
        m
        for m in manifests
        if m["kind"] == "PersistentVolumeClaim" and "billing" in m["metadata"]["name"]
    ]
    pod = deployment["spec"]["template"]["spec"]
    assert "data" in {v["name"] for v in pod["volumes"]}  # an emptyDir: nothing kept there
    for container in [billing_container(deployment), *pod["initContainers"]]:
        env = environ_of(container)
        assert env["GPUTAP__BILLING__DATABASE_URL"] == {
            "secretKeyRef": {"name": "gputap-db", "key": "billing-url"}
        }
    validate_all(manifests)


def test_two_sqlite_replicas_fail_rendering_saying_why(chart_dir):
    with pytest.raises(helm.HelmError) as caught:
        render(chart_dir, {"billing": {"replicas": 2}})
    message = str(caught.value)
    assert "billing.replicas is 2" in message
    assert "billing.database.urlSecret" in message


@pytest.mark.parametrize(
    "billing, named",
    [
        ({"replica": 2}, "replica"),
        ({"replicas": 0}, "replicas"),
        ({"database": {"urlSecret": {"name": "gputap-db"}}}, "key"),
        ({"image": {"tg": "1"}}, "tg"),
    ],
)
def test_a_wrong_billing_value_fails_rendering_naming_it(chart_dir, billing, named):
    with pytest.raises(helm.HelmError) as caught:
        render(chart_dir, {"billing": billing})
    assert named in str(caught.value)


def test_image_and_resources_come_from_values(chart_dir):
    values = {
        "billing": {
            "image": {"name": "registry.example.org/gputap-billing", "tag": "1.2.3"},
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
        }
    }
    deployment = one(render(chart_dir, values), "Deployment", "gputap-billing")
    container = billing_container(deployment)
    assert container["image"] == "registry.example.org/gputap-billing:1.2.3"
    assert container["resources"] == values["billing"]["resources"]


def test_the_hub_reaches_billing_at_its_service(chart_dir):
    values = hub_values(render(chart_dir, {}))
    c = Config()
    # as z2jh's jupyterhub_config.py leaves them before gputap's extraConfig runs
    c.JupyterHub.services = [
        {"name": "billing", **values["hub"]["services"]["billing"], "api_token": "z2jh"}
    ]
    c.JupyterHub.load_roles = [{"name": k, **v} for k, v in values["hub"]["loadRoles"].items()]
    environ = {"HELM_RELEASE_NAME": "gputap", "POD_NAMESPACE": "gputap"}
    configure(c, values["custom"]["gputap"], environ=environ)
    services = {s["name"]: s for s in c.JupyterHub.services}
    assert services["billing"]["url"] == "http://gputap-billing:8091"
    assert c.GPUSpawnerMixin.billing_url == "http://gputap-billing:8091/services/billing/"
    token = c.GPUSpawnerMixin.billing_token
    assert len(token) >= 32 and services["gputap-hub"]["api_token"] == token
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert roles["gputap-hub"]["services"] == ["gputap-hub"]
    assert set(roles["gputap-hub"]["scopes"]) == {scopes.BILLING_HUB, scopes.BILLING_ACCESS}
    assert roles["gputap-billing"]["services"] == ["billing"]
    # another release name: the chart's fullname rule
    c2 = Config()
    c2.JupyterHub.services = [{"name": "billing", "api_token": "z2jh"}]
    kubernetes = {"spawner": {"backend": "kubernetes"}}
    configure(c2, kubernetes, environ={"HELM_RELEASE_NAME": "prod", "POD_NAMESPACE": "ns"})
    assert c2.GPUSpawnerMixin.billing_url == "http://prod-gputap-billing:8091/services/billing/"


def test_the_postgres_example_runs_two_billing_replicas(chart_dir):
    example = yaml.safe_load((chart_dir / "examples" / "github-postgres.yaml").read_text())
    deployment = one(render(chart_dir, example), "Deployment", "gputap-billing")
    assert deployment["spec"]["replicas"] == 2
    env = environ_of(billing_container(deployment))
    assert env["GPUTAP__BILLING__DATABASE_URL"]["secretKeyRef"]["name"] == "gputap-db"


def test_the_hub_refuses_to_start_without_billing_declared():
    gputap = {"spawner": {"backend": "kubernetes"}}
    environ = {"HELM_RELEASE_NAME": "gputap", "POD_NAMESPACE": "gputap"}
    with pytest.raises(SettingsError, match="jupyterhub.hub.services.billing"):
        configure(Config(), gputap, environ=environ)
    c = Config()
    c.JupyterHub.services = [{"name": "billing", "api_token": "z2jh"}]
    with pytest.raises(SettingsError, match="HELM_RELEASE_NAME"):
        configure(c, gputap, environ={"POD_NAMESPACE": "gputap"})


def test_the_init_container_migrates_the_rendered_settings_database(chart_dir, tmp_path):
    """The init container's command, run with its rendered environment and settings file
    (the data directory moved from the pod's volume to a temporary one)."""
    manifests = render(chart_dir, {})
    deployment = one(manifests, "Deployment", "gputap-billing")
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    text = one(manifests, "ConfigMap", "gputap-billing")["data"]["settings.yaml"]
    settings = yaml.safe_load(text) | {"data_dir": str(tmp_path)}
    (tmp_path / "settings.yaml").write_text(yaml.safe_dump(settings))
    plain = {e["name"]: e["value"] for e in init["env"] if "value" in e}
    environ = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPUTAP")},
        **plain,
        "GPUTAP_SETTINGS": str(tmp_path / "settings.yaml"),
    }
    command = [sys.executable, *init["command"][1:]]
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "billing.sqlite").exists()


def secret_env(manifests: list[dict], container: dict) -> dict[str, str]:
    """The container's environment as the kubelet gives it: values, and keys of the rendered
    Secrets it refers to."""
    secrets_ = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "Secret"}
    environ = {}
    for item in container["env"]:
        ref = item.get("valueFrom", {}).get("secretKeyRef")
        if ref is None:
            environ[item["name"]] = item["value"]
        elif ref["name"] in secrets_:
            secret = secrets_[ref["name"]]
            data = secret.get("data", {})
            if ref["key"] in data:
                environ[item["name"]] = base64.b64decode(data[ref["key"]]).decode()
            else:
                environ[item["name"]] = secret.get("stringData", {})[ref["key"]]
    return environ


def test_two_billing_replicas_sign_logins_with_one_secret(chart_dir, tmp_path):
    """Behind billing's Service a browser's next request may reach the other replica: both
    must accept the login cookie one of them set, so they sign with one secret from a
    Secret, not each one its own on its own emptyDir."""
    manifests = render(chart_dir, {"billing": {**POSTGRES, "replicas": 2}})
    container = billing_container(one(manifests, "Deployment", "gputap-billing"))
    environ = secret_env(manifests, container)
    first = cookie_secret(tmp_path / "a" / "billing_cookie_secret", environ)
    second = cookie_secret(tmp_path / "b" / "billing_cookie_secret", environ)
    assert first == second and len(first) >= 32
    # the chart made it: kept across upgrades, never in a ConfigMap
    secret = one(manifests, "Secret", "gputap-billing")
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for m in manifests:
        if m["kind"] == "ConfigMap":
            assert environ["GPUTAP_BILLING_COOKIE_SECRET"] not in yaml.safe_dump(m)


def test_billing_refuses_a_short_cookie_secret(tmp_path):
    with pytest.raises(BadCookieSecret, match="GPUTAP_BILLING_COOKIE_SECRET.*at least 32"):
        cookie_secret(tmp_path / "billing_cookie_secret", {"GPUTAP_BILLING_COOKIE_SECRET": "x"})
    assert not (tmp_path / "billing_cookie_secret").exists()
