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

#: every Kubernetes API call of gputap's hub-side code and billing, by who makes it:
#: (component, API group, resource, verb, scope, file, the text that makes the call there).
#: "hub" calls KubeSpawner does not make; "z2jh" the hub's calls z2jh's own Role grants.
CALLS = [
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
        "z2jh",
        "",
        "persistentvolumeclaims",
        "list",
        "namespace",
        "spawner/kube/disks.py",
        '"list_namespaced_persistent_volume_claim"',
    ),
    (
        "z2jh",
        "",
        "persistentvolumeclaims",
        "get",
        "namespace",
        "spawner/kube/disks.py",
        '"read_namespaced_persistent_volume_claim"',
    ),
    (
        "z2jh",
        "",
        "persistentvolumeclaims",
        "create",
        "namespace",
        "spawner/kube/disks.py",
        '"create_namespaced_persistent_volume_claim"',
    ),
    (
        "z2jh",
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

#: the files holding gputap's own Kubernetes calls (KubeSpawner's are z2jh's to grant)
CODE = [
    "spawner/kube/spawner.py",
    "spawner/kube/disks.py",
    "spawner/kube/watch.py",
    "spawner/kube/inventory.py",
    "spawner/kube/objects.py",
    "gputap_common/kube_watch.py",
    "billing_service/loops/kube_meter.py",
    "billing_service/app.py",
]
API_METHOD = re.compile(r"\b(?:list|read|create|delete|patch|replace)_[a-z_]+\b")


def test_every_call_in_the_table_is_in_the_code():
    for component, _group, resource, verb, _scope, path, text in CALLS:
        assert text in (ROOT / path).read_text(), f"{component} {verb} {resource}: {path}"


def test_the_code_makes_no_call_the_table_misses():
    """A new Kubernetes call in gputap's code fails here until the table (and the rules) say
    who makes it."""
    tabled = {m for *_, text in CALLS for m in API_METHOD.findall(text)}
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


def wanted(component: str, scope: str) -> set[tuple[str, str, str]]:
    return {(g, r, v) for c, g, r, v, s, *_ in CALLS if c == component and s == scope}


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
    assert grants(role["rules"]) == wanted("hub", "cluster")
    hub = the(manifests, "Deployment", "hub")
    account = hub["spec"]["template"]["spec"]["serviceAccountName"]
    assert bound_to(manifests, "ClusterRoleBinding", role) == [
        {"kind": "ServiceAccount", "name": account, "namespace": "gputap"}
    ]


def test_the_hub_may_patch_disks_in_the_servers_namespace(chart_dir):  # noqa: F811
    values = {
        "jupyterhub": {"custom": {"gputap": {"spawner": {"kubernetes": {"namespace": "gpu"}}}}}
    }
    manifests = render(chart_dir, values)
    role = the(manifests, "Role", "gputap-hub")
    assert role["metadata"]["namespace"] == "gpu"
    assert grants(role["rules"]) == wanted("hub", "namespace")
    assert bound_to(manifests, "RoleBinding", role) == [
        {"kind": "ServiceAccount", "name": "hub", "namespace": "gputap"}
    ]
    billing = the(manifests, "Role", "gputap-billing")
    assert billing["metadata"]["namespace"] == "gpu"


def test_what_z2jh_grants_the_hub_covers_the_rest_of_its_calls(manifests):
    z2jh = the(manifests, "Role", "hub")
    assert wanted("z2jh", "namespace") <= grants(z2jh["rules"])
    # and gputap adds only what z2jh's Role lacks
    gputap = the(manifests, "Role", "gputap-hub")
    assert not grants(gputap["rules"]) & grants(z2jh["rules"])


def test_billing_has_its_own_account_allowed_to_meter_pods_only(manifests):
    account = the(manifests, "ServiceAccount", "gputap-billing")
    assert account["metadata"]["namespace"] == "gputap"
    role = the(manifests, "Role", "gputap-billing")
    assert grants(role["rules"]) == wanted("billing", "namespace")
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


def test_rbac_create_false_renders_no_gputap_rules(chart_dir):  # noqa: F811
    manifests = render(chart_dir, {"rbac": {"create": False}})
    kinds = ["Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ServiceAccount"]
    assert gputaps(manifests, *kinds) == []


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
