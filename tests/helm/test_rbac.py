"""The chart's RBAC, PriorityClasses and NetworkPolicy (helm/gputap/templates/rbac/,
priorityclasses.yaml, networkpolicies.yaml): every Kubernetes API call gputap's own code makes
is granted, to the component that makes it, and nothing else is; the hub uses the
PriorityClasses the chart creates, by their release-named names; billing accepts only the hub
and the proxy. The calls are the table below, each checked against the code by its text; the
audit of every request on the simulated cluster is tests/kube/test_kube_rbac.py."""

from __future__ import annotations

import re
from pathlib import Path

import helm_python as helm
import kubespawner
import pytest
import yaml

from gputap_common.settings import settings_from_mapping
from hub_config.z2jh import configure
from tests.helm.test_chart import (
    IDS,
    RELEASE,
    VALUE_FILES,
    chart_dir,  # noqa: F401 (the fixture)
    hub_values,
    render,
    validate_all,
    values_of,
    z2jh_config,
)

ROOT = Path(__file__).resolve().parents[2]

#: every Kubernetes API call of the hub (gputap's code and KubeSpawner's, with gputap's
#: settings) and of billing, by who makes it: (component, API group, resource, verb, scope,
#: file, the text that makes the call there). KubeSpawner's files are its installed package's.
CALLS = [
    *(
        ("kubespawner", "", resource, verb, "namespace", f"kubespawner/{file}", text)
        for resource, verb, file, text in [
            ("pods", "create", "spawner.py", "self.api.create_namespaced_pod("),
            ("pods", "delete", "spawner.py", "self.api.delete_namespaced_pod("),
            ("pods", "list", "spawner.py", 'kind="pods"'),
            ("pods", "watch", "reflector.py", "async with w.stream(method"),
            ("events", "list", "spawner.py", 'kind="events"'),
            ("events", "watch", "reflector.py", "async with w.stream(method"),
            (
                "persistentvolumeclaims",
                "create",
                "spawner.py",
                "self.api.create_namespaced_persistent_volume_claim(",
            ),
            (
                "persistentvolumeclaims",
                "get",
                "spawner.py",
                "self.api.read_namespaced_persistent_volume_claim(",
            ),
            (
                "persistentvolumeclaims",
                "delete",
                "spawner.py",
                "self.api.delete_namespaced_persistent_volume_claim(",
            ),
        ]
    ),
    # a server's worker group (docs/scale-out.md): its pods and its NetworkPolicy
    (
        "hub",
        "",
        "pods",
        "create",
        "namespace",
        "spawner/kube/workers.py",
        "await spawner.api.create_namespaced_pod(",
    ),
    (
        "hub",
        "",
        "pods",
        "delete",
        "namespace",
        "spawner/kube/workers.py",
        "await self.spawner.api.delete_namespaced_pod(",
    ),
    (
        "hub",
        "networking.k8s.io",
        "networkpolicies",
        "create",
        "namespace",
        "spawner/kube/workers.py",
        "await api.create_namespaced_network_policy(",
    ),
    ("hub", "", "nodes", "list", "cluster", "spawner/kube/watch.py", '"list_node"'),
    ("hub", "", "nodes", "watch", "cluster", "spawner/kube/watch.py", "events = watch_objects("),
    (
        "hub",
        "",
        "pods",
        "list",
        "cluster",
        "spawner/kube/watch.py",
        '"list_pod_for_all_namespaces"',
    ),
    ("hub", "", "pods", "watch", "cluster", "spawner/kube/watch.py", "events = watch_objects("),
    (
        "hub",
        "",
        "persistentvolumeclaims",
        "patch",
        "namespace",
        "spawner/kube/disks.py",
        '"patch_namespaced_persistent_volume_claim"',
    ),
    (
        "hub",
        "",
        "persistentvolumeclaims",
        "list",
        "namespace",
        "spawner/kube/disks.py",
        '"list_namespaced_persistent_volume_claim"',
    ),
    (
        "hub",
        "",
        "persistentvolumeclaims",
        "get",
        "namespace",
        "spawner/kube/disks.py",
        '"read_namespaced_persistent_volume_claim"',
    ),
    (
        "hub",
        "",
        "persistentvolumeclaims",
        "create",
        "namespace",
        "spawner/kube/disks.py",
        '"create_namespaced_persistent_volume_claim"',
    ),
    (
        "hub",
        "",
        "persistentvolumeclaims",
        "delete",
        "namespace",
        "spawner/kube/disks.py",
        '"delete_namespaced_persistent_volume_claim"',
    ),
    (
        "billing",
        "",
        "pods",
        "list",
        "namespace",
        "billing_service/loops/kube_meter.py",
        "self.api.list_namespaced_pod, self.namespace, label_selector",
    ),
    (
        "billing",
        "",
        "pods",
        "watch",
        "namespace",
        "billing_service/loops/kube_meter.py",
        "watch_objects(\n            self.api.list_namespaced_pod",
    ),
    (
        "billing",
        "",
        "events",
        "list",
        "namespace",
        "billing_service/loops/kube_meter.py",
        "self.api.list_namespaced_event",
    ),
]

#: gputap's own code, every file of it, so that a new file's Kubernetes calls are caught too
#: (KubeSpawner's are z2jh's to grant)
CODE = sorted(
    str(path.relative_to(ROOT))
    for package in ["spawner", "billing_service", "gputap_common"]
    for path in (ROOT / package).glob("**/*.py")
)
API_METHOD = re.compile(r"\b(?:list|read|create|delete|patch|replace)_[a-z_]+\b")


def source(component: str, path: str) -> str:
    base = Path(kubespawner.__file__).parents[1] if component == "kubespawner" else ROOT
    return (base / path).read_text()


def test_every_call_in_the_table_is_in_the_code():
    for component, _group, resource, verb, _scope, path, text in CALLS:
        assert text in source(component, path), f"{component} {verb} {resource}: {path}"


def test_the_code_makes_no_call_the_table_misses():
    """A new Kubernetes call in gputap's code fails here until the table (and the rules) say
    who makes it."""
    tabled = {m for c, *_, text in CALLS if c != "kubespawner" for m in API_METHOD.findall(text)}
    assert {"spawner/kube/spawner.py", "billing_service/loops/kube_meter.py"} <= set(CODE)
    for path in CODE:
        text = (ROOT / path).read_text()
        found = {m for m in API_METHOD.findall(text) if "namespace" in m or m.endswith("_node")}
        found |= set(re.findall(r"\bcreate_priority_class\b", text))
        assert found <= tabled, f"{path} calls {sorted(found - tabled)}: add them to CALLS"


def gputaps(manifests: list[dict], *kinds: str) -> list[dict]:
    """The objects of gputap's own templates (z2jh's carry its labels, and some of their names
    start with the release's too)."""
    return [
        m
        for m in manifests
        if m["kind"] in kinds
        and (m["metadata"].get("labels") or {}).get("app.kubernetes.io/name") == "gputap"
    ]


def the(manifests: list[dict], kind: str, name: str) -> dict:
    found = [m for m in manifests if m["kind"] == kind and m["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def grants(rules: list[dict]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def wanted(scope: str, *components: str) -> set[tuple[str, str, str]]:
    return {(g, r, v) for c, g, r, v, s, *_ in CALLS if c in components and s == scope}


def bound_to(manifests: list[dict], binding_kind: str, role: dict) -> list[dict]:
    (binding,) = [
        m
        for m in manifests
        if m["kind"] == binding_kind
        and m["roleRef"]
        == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role["kind"],
            "name": role["metadata"]["name"],
        }
    ]
    return binding["subjects"]


@pytest.fixture(scope="module")
def manifests(chart_dir) -> list[dict]:  # noqa: F811
    return render(chart_dir, {})


def test_the_hub_may_watch_nodes_and_pods_cluster_wide_and_nothing_more(manifests):
    role = the(manifests, "ClusterRole", "gputap-hub")
    assert grants(role["rules"]) == wanted("cluster", "hub")
    hub = the(manifests, "Deployment", "hub")
    account = hub["spec"]["template"]["spec"]["serviceAccountName"]
    assert bound_to(manifests, "ClusterRoleBinding", role) == [
        {"kind": "ServiceAccount", "name": account, "namespace": "gputap"}
    ]


def test_the_hub_may_make_servers_homes_and_disks_in_the_servers_namespace(chart_dir):  # noqa: F811
    values = {
        "jupyterhub": {"custom": {"gputap": {"spawner": {"kubernetes": {"namespace": "gpu"}}}}}
    }
    manifests = render(chart_dir, values)
    role = the(manifests, "Role", "gputap-hub")
    assert role["metadata"]["namespace"] == "gpu"
    assert grants(role["rules"]) == wanted("namespace", "hub", "kubespawner")
    assert bound_to(manifests, "RoleBinding", role) == [
        {"kind": "ServiceAccount", "name": "hub", "namespace": "gputap"}
    ]
    billing = the(manifests, "Role", "gputap-billing")
    assert billing["metadata"]["namespace"] == "gpu"


def test_z2jh_grants_the_hub_nothing(manifests):
    """z2jh's Role "hub" (secrets, services, gets and watches nobody makes) is not rendered:
    the hub has gputap's roles only."""
    assert not [
        m
        for m in manifests
        if m["kind"] in ("Role", "RoleBinding") and m["metadata"]["name"] == "hub"
    ]
    hub_bindings = [
        m
        for m in manifests
        if m["kind"].endswith("RoleBinding")
        and {"kind": "ServiceAccount", "name": "hub", "namespace": "gputap"} in m["subjects"]
    ]
    assert sorted(b["roleRef"]["name"] for b in hub_bindings) == ["gputap-hub", "gputap-hub"]


def z2jh_components_rbac(manifests: list[dict]) -> list[dict]:
    """The RBAC objects of z2jh's components other than the hub."""
    return sorted(
        (
            m
            for m in manifests
            if m["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
            and (m["metadata"].get("labels") or {}).get("app.kubernetes.io/name") == "jupyterhub"
            and m["metadata"]["labels"].get("component") != "hub"
        ),
        key=lambda m: (m["kind"], m["metadata"]["name"]),
    )


#: z2jh's components with RBAC of their own: the user-scheduler, the image-puller hook's
#: awaiter, and autohttps (Let's Encrypt)
COMPONENTS = {
    "jupyterhub": {
        "scheduling": {"userScheduler": {"enabled": True}},
        "prePuller": {"hook": {"enabled": True}},
        "proxy": {
            "https": {
                "enabled": True,
                "type": "letsencrypt",
                "hosts": ["gpu.example.org"],
                "letsencrypt": {"contactEmail": "ops@example.org"},
            }
        },
    }
}


@pytest.mark.parametrize("values", [{}, COMPONENTS], ids=["defaults", "every-component"])
def test_z2jh_components_keep_z2jhs_own_rbac(chart_dir, values):  # noqa: F811
    ours = z2jh_components_rbac(render(chart_dir, values))
    z2jh_values = {
        **values,
        "jupyterhub": {**values.get("jupyterhub", {}), "rbac": {"create": True}},
    }
    z2jhs = z2jh_components_rbac(render(chart_dir, z2jh_values))
    assert ours == z2jhs
    expected = {"user-scheduler", "hook-image-awaiter"} | ({"autohttps"} if values else set())
    names = {m["metadata"]["name"].removeprefix("gputap-") for m in ours}
    assert names == expected


def test_billing_has_its_own_account_allowed_to_meter_pods_only(manifests):
    account = the(manifests, "ServiceAccount", "gputap-billing")
    assert account["metadata"]["namespace"] == "gputap"
    role = the(manifests, "Role", "gputap-billing")
    assert grants(role["rules"]) == wanted("namespace", "billing")
    assert bound_to(manifests, "RoleBinding", role) == [
        {"kind": "ServiceAccount", "name": "gputap-billing", "namespace": "gputap"}
    ]
    assert not [m for m in manifests if m["kind"] == "ClusterRoleBinding" and "billing" in str(m)]


def test_no_rule_is_wider_than_the_code(manifests):
    """gputap's rules name no wildcard, no secret, nothing cluster-scoped but the hub's watch."""
    ours = gputaps(manifests, "Role", "ClusterRole")
    assert sorted(m["metadata"]["name"] for m in ours) == [
        "gputap-billing",
        "gputap-hub",
        "gputap-hub",
    ]
    for role in ours:
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
            assert "resourceNames" not in rule or rule["resourceNames"]
    allowed = {(g, r, v) for _c, g, r, v, *_ in CALLS}
    assert set().union(*(grants(r["rules"]) for r in ours)) <= allowed


def test_rbac_create_false_renders_no_rules(chart_dir):  # noqa: F811
    """The operator then makes all of them, z2jh's components' too (or sets
    jupyterhub.rbac.create for z2jh's own, its wide Role "hub" included)."""
    manifests = render(chart_dir, {"rbac": {"create": False}, **COMPONENTS})
    kinds = ["Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"]
    assert [m for m in manifests if m["kind"] in kinds] == []
    assert gputaps(manifests, "ServiceAccount") == []


def render_as(chart: Path, values: dict, release: str) -> list[dict]:
    rendered = helm.Chart.load(chart).render(
        values, name=release, namespace="gputap", is_install=True
    )
    texts = [text for name, text in sorted(rendered.items()) if name.endswith(".yaml")]
    return [doc for text in texts for doc in yaml.safe_load_all(text) if doc]


def priority_classes(manifests: list[dict]) -> dict[str, dict]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == "PriorityClass"}


def hub_env(manifests: list[dict]) -> dict[str, str]:
    hub = the(manifests, "Deployment", "hub")
    (container,) = [c for c in hub["spec"]["template"]["spec"]["containers"] if c["name"] == "hub"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    return {"HELM_RELEASE_NAME": env["HELM_RELEASE_NAME"], "POD_NAMESPACE": "gputap"}


@pytest.mark.parametrize(
    "release, on_demand, spot",
    [
        ("gputap", "gputap-on-demand", "gputap-spot"),
        ("lab", "lab-gputap-on-demand", "lab-gputap-spot"),
    ],
)
def test_the_chart_creates_release_named_priority_classes_the_hub_uses(
    chart_dir,  # noqa: F811
    release,
    on_demand,
    spot,
):
    manifests = render_as(chart_dir, {}, release)
    classes = priority_classes(manifests)
    assert sorted(classes) == sorted([on_demand, spot])
    assert classes[on_demand]["value"] > 0 > classes[spot]["value"]
    assert not classes[on_demand]["globalDefault"] and not classes[spot]["globalDefault"]
    c = z2jh_config(hub_values(manifests))
    configure(c, hub_values(manifests)["custom"]["gputap"], environ=hub_env(manifests))
    assert c.GPUKubeSpawner.on_demand_priority_class == on_demand
    assert c.GPUKubeSpawner.spot_priority_class == spot


def test_named_priority_classes_are_used_and_can_be_left_to_the_operator(chart_dir):  # noqa: F811
    names = {"on_demand": "gold", "spot": "scrap"}
    gputap = {"spawner": {"kubernetes": {"priority_classes": names}}}
    values = {"jupyterhub": {"custom": {"gputap": gputap}}}
    manifests = render(chart_dir, values)
    assert sorted(priority_classes(manifests)) == ["gold", "scrap"]
    c = z2jh_config(hub_values(manifests))
    configure(c, hub_values(manifests)["custom"]["gputap"], environ=hub_env(manifests))
    assert (c.GPUKubeSpawner.on_demand_priority_class, c.GPUKubeSpawner.spot_priority_class) == (
        "gold",
        "scrap",
    )
    assert (
        priority_classes(render(chart_dir, values | {"priorityClasses": {"create": False}})) == {}
    )


def test_the_spawner_no_longer_creates_priority_classes():
    text = (ROOT / "spawner/kube/spawner.py").read_text()
    assert "create_priority_class" not in text and "SchedulingV1Api" not in text


def test_billing_accepts_only_the_hub_and_the_proxy(chart_dir, manifests):  # noqa: F811
    policy = the(manifests, "NetworkPolicy", "gputap-billing")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "gputap",
        "app.kubernetes.io/instance": "gputap",
        "app.kubernetes.io/component": "billing",
    }
    (rule,) = policy["spec"]["ingress"]
    default_port = settings_from_mapping({}, "defaults", {}).billing["port"]
    assert rule["ports"] == [{"port": default_port, "protocol": "TCP"}]
    selected = []
    for deployment in [m for m in manifests if m["kind"] == "Deployment"]:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        for peer in rule["from"]:
            assert set(peer) == {"podSelector"}, peer  # the release's namespace only
            if peer["podSelector"]["matchLabels"].items() <= labels.items():
                selected.append(deployment["metadata"]["name"])
    assert sorted(selected) == ["hub", "proxy"]
    port = {"jupyterhub": {"custom": {"gputap": {"billing": {"port": 9000}}}}}
    moved = the(render(chart_dir, port), "NetworkPolicy", "gputap-billing")
    assert moved["spec"]["ingress"][0]["ports"] == [{"port": 9000, "protocol": "TCP"}]


def server_pod_labels(values: dict) -> dict[str, str]:
    """The labels of a GPU server's pod under the chart: what KubeSpawner's make_pod gives it
    from z2jh's configuration (common_labels, component, singleuser.extraLabels), with
    gputap's placement applied over it as GPUKubeSpawner's get_pod_manifest does."""
    from kubespawner.objects import make_pod

    from spawner.core.catalog import Catalog
    from spawner.core.placement import Placement
    from spawner.kube.objects import apply_pod_settings, gpu_pod_settings

    z2jh_labels = {  # z2jh's jupyterhub_config.py: KubeSpawner.common_labels and its component
        "app": "jupyterhub",
        "release": RELEASE["name"],
        "component": "singleuser-server",
        **values["singleuser"]["extraLabels"],
    }
    pod = make_pod(
        name="jupyter-alice",
        cmd=["jupyterhub-singleuser"],
        port=8888,
        image="gputap/singleuser:0.1.0",
        labels=z2jh_labels,
    )
    catalog = Catalog.load()
    placement = Placement(catalog.offering("A100-80GB"), 1, "gpu-a100", 8_000_000)
    settings = gpu_pod_settings(
        placement,
        catalog,
        username="alice",
        session_id="s-1",
        product="NVIDIA-A100-SXM4-80GB",
        hostname="gpu-a100",
    )
    return dict(apply_pod_settings(pod, settings).metadata.labels)


def test_servers_reach_the_hub_under_z2jhs_network_policies(manifests):
    """A server reports activity and asks the hub API (docs/kubernetes.md): z2jh's `hub`
    NetworkPolicy admits pods labelled hub.jupyter.org/network-access-hub, which z2jh's
    singleuser.extraLabels gives servers and gputap's own labels must not drop; the
    singleuser policy lets servers out to the hub's port."""
    labels = server_pod_labels(hub_values(manifests))
    assert labels["hub.jupyter.org/network-access-hub"] == "true"
    assert labels["gputap.io/card"] == "A100-80GB"  # gputap's labels are on it too
    hub = the(manifests, "Deployment", "hub")["spec"]["template"]
    (container,) = [c for c in hub["spec"]["containers"] if c["name"] == "hub"]
    hub_ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    policy = the(manifests, "NetworkPolicy", "hub")
    assert "Ingress" in policy["spec"]["policyTypes"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= hub["metadata"]["labels"].items()
    admitted = [
        hub_ports.get(port["port"], port["port"])
        for rule in policy["spec"]["ingress"]
        if any(
            set(peer) == {"podSelector"}
            and peer["podSelector"]["matchLabels"].items() <= labels.items()
            for peer in rule.get("from", [])
        )
        for port in rule.get("ports", [])
    ]
    assert 8081 in admitted, policy["spec"]["ingress"]
    singleuser = the(manifests, "NetworkPolicy", "singleuser")
    assert singleuser["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    out = [
        port["port"]
        for rule in singleuser["spec"]["egress"]
        if any(
            "podSelector" in peer
            and peer["podSelector"]["matchLabels"].items() <= hub["metadata"]["labels"].items()
            for peer in rule.get("to", [])
        )
        for port in rule.get("ports", [])
    ]
    assert 8081 in out, singleuser["spec"]["egress"]


@pytest.mark.parametrize("values_file", VALUE_FILES, ids=IDS)
def test_the_new_objects_are_valid_kubernetes(chart_dir, values_file):  # noqa: F811
    manifests = render(chart_dir, values_of(values_file))
    kinds = ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ServiceAccount"]
    ours = gputaps(manifests, *kinds, "PriorityClass", "NetworkPolicy")
    assert len(ours) == 10
    validate_all(ours)


@pytest.mark.parametrize(
    "values, named",
    [
        ({"rbac": {"craete": True}}, "craete"),
        ({"rbac": {"create": "yes"}}, "create"),
        ({"priorityClasses": {"spot": {"valeu": 1}}}, "valeu"),
        ({"priorityClasses": {"onDemand": {"value": "high"}}}, "value"),
        ({"priorityclasses": {}}, "priorityclasses"),
    ],
)
def test_a_misspelt_rbac_or_priority_key_fails_rendering_naming_it(chart_dir, values, named):  # noqa: F811
    with pytest.raises(helm.HelmError) as caught:
        helm.Chart.load(chart_dir).render(values, **RELEASE)
    assert named in str(caught.value)
