"""ServiceAccount tokens and RBAC on the simulated API server, through the real sync client:
what a role grants is allowed, anything else is 403 in kube-apiserver's words, a missing or
unknown token is 401, and the audit says who did what under which rule."""

import json
import uuid

import kubernetes.client
import pytest
import requests
from kubernetes.client.rest import ApiException

from tests.kube_sim.rbac import Attributes, request_attributes, rule_allows

from .conftest import pod_body

RBAC = "rbac.authorization.k8s.io"


def client_for(kube, token: str) -> kubernetes.client.ApiClient:
    config = kubernetes.client.Configuration(
        host=kube.url, api_key={"BearerToken": f"Bearer {token}"}
    )
    return kubernetes.client.ApiClient(config)


@pytest.fixture
def account(kube, core, ns):
    """A ServiceAccount in ns with a Role (pods: get, list; pods/log: get; configmap "settings":
    get, update), and a ClusterRole (nodes: list) bound by a ClusterRoleBinding; its client."""
    core.create_namespaced_service_account(ns, {"metadata": {"name": "robot"}})
    rbac = kubernetes.client.RbacAuthorizationV1Api(core.api_client)
    rbac.create_namespaced_role(
        ns,
        {
            "metadata": {"name": "robot"},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": ["settings"],
                    "verbs": ["get", "update"],
                },
            ],
        },
    )
    subject = {"kind": "ServiceAccount", "name": "robot", "namespace": ns}
    ref = {"apiGroup": RBAC, "kind": "Role", "name": "robot"}
    rbac.create_namespaced_role_binding(
        ns, {"metadata": {"name": "robot"}, "subjects": [subject], "roleRef": ref}
    )
    node_reader = f"nodes-{ns}"
    rbac.create_cluster_role(
        {
            "metadata": {"name": node_reader},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": node_reader},
            "subjects": [subject],
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": node_reader},
        }
    )
    token = kube.service_account_token(ns, "robot")
    with client_for(kube, token) as client:
        yield kubernetes.client.CoreV1Api(client)


def refusal(call, *args, **kwargs) -> tuple[int, dict]:
    with pytest.raises(ApiException) as caught:
        call(*args, **kwargs)
    return caught.value.status, json.loads(caught.value.body)


def test_a_role_allows_what_it_grants_and_the_audit_names_the_rule(kube, core, account, ns):
    core.create_namespaced_pod(ns, pod_body("p1"))
    assert [p.metadata.name for p in account.list_namespaced_pod(ns).items] == ["p1"]
    assert account.read_namespaced_pod("p1", ns).metadata.name == "p1"
    user = f"system:serviceaccount:{ns}:robot"
    mine = [r for r in kube.audit if r.user == user]
    assert [(r.verb, r.resource, r.scope, r.name, r.allowed) for r in mine] == [
        ("list", "pods", ns, "", True),
        ("get", "pods", ns, "p1", True),
    ]
    grant = mine[0].grant
    assert (grant.binding_kind, grant.binding_name, grant.role_kind, grant.rule) == (
        "RoleBinding",
        "robot",
        "Role",
        0,
    )


def test_what_no_rule_grants_is_forbidden_in_the_apiservers_words(account, ns):
    code, body = refusal(account.create_namespaced_pod, ns, pod_body("p2"))
    assert code == 403
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'pods is forbidden: User "system:serviceaccount:{ns}:robot" cannot create '
        f'resource "pods" in API group "" in the namespace "{ns}"',
        "reason": "Forbidden",
        "details": {"kind": "pods"},
        "code": 403,
    }
    # a watch is its own verb: list does not grant it
    code, body = refusal(account.list_namespaced_pod, ns, watch=True)
    assert code == 403 and 'cannot watch resource "pods"' in body["message"]
    # another namespace is outside a Role
    code, body = refusal(account.list_namespaced_pod, "default")
    assert body["message"].endswith('in API group "" in the namespace "default"')


def test_cluster_scoped_resources_need_a_cluster_role(account, ns):
    assert account.list_node().items == []
    code, body = refusal(account.read_node, "gpu-1")
    assert code == 403
    assert body["message"] == (
        f'nodes "gpu-1" is forbidden: User "system:serviceaccount:{ns}:robot" cannot get '
        'resource "nodes" in API group "" at the cluster scope'
    )
    assert body["details"] == {"name": "gpu-1", "kind": "nodes"}
    # pods of every namespace are a cluster-scoped list
    code, body = refusal(account.list_pod_for_all_namespaces)
    assert 'cannot list resource "pods" in API group "" at the cluster scope' in body["message"]


def test_resource_names_limit_a_rule_to_those_objects(core, account, ns):
    for name in ("settings", "other"):
        core.create_namespaced_config_map(ns, {"metadata": {"name": name}, "data": {"k": "v"}})
    settings = account.read_namespaced_config_map("settings", ns)
    assert settings.data == {"k": "v"}
    settings.data = {"k": "w"}
    assert account.replace_namespaced_config_map("settings", ns, settings).data == {"k": "w"}
    code, body = refusal(account.patch_namespaced_config_map, "settings", ns, {"data": {}})
    assert code == 403 and 'cannot patch resource "configmaps"' in body["message"]
    code, body = refusal(account.delete_collection_namespaced_config_map, ns)
    assert code == 403 and 'cannot deletecollection resource "configmaps"' in body["message"]
    code, body = refusal(account.read_namespaced_config_map, "other", ns)
    assert code == 403 and body["message"].startswith('configmaps "other" is forbidden')
    # a list names no object, so a rule with resourceNames does not grant it
    code, _ = refusal(account.list_namespaced_config_map, ns)
    assert code == 403


def test_subresources_are_granted_on_their_own(kube, core, account, ns):
    core.create_namespaced_pod(ns, pod_body("p3", command=["sleep", "30"]))
    code, body = refusal(
        account.patch_namespaced_pod_status, "p3", ns, {"status": {"phase": "Failed"}}
    )
    assert code == 403 and 'cannot patch resource "pods/status"' in body["message"]
    assert body["message"].startswith('pods "p3" is forbidden')
    code, body = refusal(
        account.create_namespaced_pod_binding,
        "p3",
        ns,
        {"metadata": {"name": "p3"}, "target": {"kind": "Node", "name": "n1"}},
    )
    assert 'cannot create resource "pods/binding"' in body["message"]
    # pods/log is granted: the request passes RBAC and meets the pod's own state
    code, body = refusal(account.read_namespaced_pod_log, "p3", ns)
    assert code == 400 and body["reason"] == "BadRequest"
    log_request = [r for r in kube.audit if r.resource == "pods/log" and r.name == "p3"][-1]
    assert log_request.allowed and log_request.grant.rule == 1


def test_no_token_or_an_unknown_one_is_unauthorized(kube, account, ns):
    with kubernetes.client.ApiClient(kubernetes.client.Configuration(host=kube.url)) as anon:
        code, body = refusal(kubernetes.client.CoreV1Api(anon).list_namespaced_pod, ns)
    assert (code, body) == (
        401,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "Unauthorized",
            "reason": "Unauthorized",
            "code": 401,
        },
    )
    with client_for(kube, "not-a-token") as stranger:
        code, _ = refusal(kubernetes.client.CoreV1Api(stranger).list_namespaced_pod, ns)
    assert code == 401
    assert kube.audit[-1].code == 401 and kube.audit[-1].user == ""


def test_a_token_dies_with_its_service_account(kube, core, account, ns):
    assert account.list_namespaced_pod(ns).items == []
    core.delete_namespaced_service_account("robot", ns)
    code, _ = refusal(account.list_namespaced_pod, ns)
    assert code == 401
    # a new account of the same name is another account: the old token stays dead
    core.create_namespaced_service_account(ns, {"metadata": {"name": "robot"}})
    code, _ = refusal(account.list_namespaced_pod, ns)
    assert code == 401


def test_a_token_needs_an_existing_service_account(kube, ns):
    with pytest.raises(Exception, match='serviceaccounts "ghost" not found'):
        kube.service_account_token(ns, "ghost")


def test_a_role_binding_may_grant_a_cluster_role_in_its_namespace_only(kube, core, ns):
    rbac = kubernetes.client.RbacAuthorizationV1Api(core.api_client)
    reader = f"pod-reader-{ns}"
    rbac.create_cluster_role(
        {
            "metadata": {"name": reader},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        }
    )
    core.create_namespaced_service_account(ns, {"metadata": {"name": "viewer"}})
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "viewer"},
            "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": ns}],
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": reader},
        },
    )
    with client_for(kube, kube.service_account_token(ns, "viewer")) as client:
        viewer = kubernetes.client.CoreV1Api(client)
        assert viewer.list_namespaced_pod(ns).items == []
        code, _ = refusal(viewer.list_pod_for_all_namespaces)
        assert code == 403
        code, _ = refusal(viewer.list_namespaced_pod, "default")
        assert code == 403
    grant = [r for r in kube.audit if r.user.endswith(":viewer") and r.allowed][0].grant
    assert (grant.binding_kind, grant.role_kind, grant.role_name) == (
        "RoleBinding",
        "ClusterRole",
        reader,
    )


def test_a_binding_to_a_missing_role_says_so(kube, core, ns):
    rbac = kubernetes.client.RbacAuthorizationV1Api(core.api_client)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "orphan"}})
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "orphan"},
            "subjects": [{"kind": "ServiceAccount", "name": "orphan", "namespace": ns}],
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "absent"},
        },
    )
    with client_for(kube, kube.service_account_token(ns, "orphan")) as client:
        code, body = refusal(kubernetes.client.CoreV1Api(client).list_namespaced_pod, ns)
    assert code == 403
    assert body["message"].endswith(
        f'in the namespace "{ns}": RBAC: role.rbac.authorization.k8s.io "absent" not found'
    )


def test_discovery_is_open_to_every_authenticated_user(kube, account):
    assert kubernetes.client.VersionApi(account.api_client).get_code().minor == "31"
    groups = kubernetes.client.ApisApi(account.api_client).get_api_versions()
    assert RBAC in [g.name for g in groups.groups]
    resources = kubernetes.client.RbacAuthorizationV1Api(account.api_client).get_api_resources()
    assert {r.name for r in resources.resources} == {
        "roles",
        "clusterroles",
        "rolebindings",
        "clusterrolebindings",
    }


@pytest.mark.parametrize(
    "body, message",
    [
        (
            {"rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": []}]},
            "rules[0].verbs: Required value: verbs must contain at least one value",
        ),
        (
            {"rules": [{"resources": ["pods"], "verbs": ["get"]}]},
            "rules[0].apiGroups: Required value: resource rules must supply at least one api group",
        ),
    ],
)
def test_a_role_without_verbs_or_groups_is_invalid(core, ns, body, message):
    rbac = kubernetes.client.RbacAuthorizationV1Api(core.api_client)
    code, status = refusal(rbac.create_namespaced_role, ns, {"metadata": {"name": "r"}, **body})
    assert code == 422
    assert status["message"] == f'Role.rbac.authorization.k8s.io "r" is invalid: {message}'


def test_a_cluster_role_binding_refers_to_a_cluster_role_and_keeps_it(core):
    rbac = kubernetes.client.RbacAuthorizationV1Api(core.api_client)
    name = "b-" + uuid.uuid4().hex[:8]
    role_ref = {"apiGroup": RBAC, "kind": "Role", "name": "x"}
    code, status = refusal(
        rbac.create_cluster_role_binding, {"metadata": {"name": name}, "roleRef": role_ref}
    )
    assert code == 422
    assert (
        'roleRef.kind: Unsupported value: "Role": supported values: "ClusterRole"'
        in (status["message"])
    )
    role_ref["kind"] = "ClusterRole"
    rbac.create_cluster_role_binding({"metadata": {"name": name}, "roleRef": role_ref})
    code, status = refusal(rbac.patch_cluster_role_binding, name, {"roleRef": {"name": "other"}})
    assert code == 422 and status["message"].endswith("cannot change roleRef")


# -- request attributes and rules, without a server ------------------------------------------


@pytest.mark.parametrize(
    "method, path, query, expected",
    [
        ("GET", "/api/v1/namespaces/a/pods", {}, ("list", "", "pods", "", "a", "")),
        ("GET", "/api/v1/namespaces/a/pods", {"watch": "1"}, ("watch", "", "pods", "", "a", "")),
        ("GET", "/api/v1/pods", {"watch": "true"}, ("watch", "", "pods", "", "", "")),
        ("GET", "/api/v1/namespaces/a/pods/p", {}, ("get", "", "pods", "", "a", "p")),
        ("GET", "/api/v1/namespaces/a/pods/p/log", {}, ("get", "", "pods", "log", "a", "p")),
        (
            "POST",
            "/api/v1/namespaces/a/pods/p/binding",
            {},
            ("create", "", "pods", "binding", "a", "p"),
        ),
        ("PUT", "/api/v1/nodes/n/status", {}, ("update", "", "nodes", "status", "", "n")),
        (
            "PATCH",
            "/api/v1/namespaces/a/persistentvolumeclaims/c",
            {},
            ("patch", "", "persistentvolumeclaims", "", "a", "c"),
        ),
        ("DELETE", "/api/v1/namespaces/a/pods", {}, ("deletecollection", "", "pods", "", "a", "")),
        ("DELETE", "/api/v1/namespaces/a/pods/p", {}, ("delete", "", "pods", "", "a", "p")),
        ("GET", "/api/v1/namespaces/a", {}, ("get", "", "namespaces", "", "a", "a")),
        (
            "GET",
            "/api/v1/namespaces/a/pods",
            {"fieldSelector": "metadata.name=p"},
            ("list", "", "pods", "", "a", "p"),
        ),
        (
            "GET",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            {},
            ("list", RBAC, "clusterroles", "", "", ""),
        ),
        ("GET", "/api/v1/watch/namespaces/a/pods", {}, ("watch", "", "pods", "", "a", "")),
    ],
)
def test_request_attributes_are_the_apiservers(method, path, query, expected):
    a = request_attributes(method, path, query)
    assert a.resource_request
    assert (a.verb, a.api_group, a.resource, a.subresource, a.namespace, a.name) == expected


@pytest.mark.parametrize("path", ["/version", "/api", "/api/v1", "/apis", "/apis/apps/v1"])
def test_discovery_paths_are_not_resource_requests(path):
    assert request_attributes("GET", path, {}) == Attributes(verb="get", path=path)


def resource(verb, res, sub="", group="", name=""):
    return Attributes(verb, "", True, group, "v1", res, sub, "a", name)


@pytest.mark.parametrize(
    "rule, attrs, allowed",
    [
        (
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
            resource("get", "pods"),
            True,
        ),
        (
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
            resource("get", "pods", "log"),
            False,
        ),
        (
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
            resource("get", "pods", "log"),
            True,
        ),
        (
            {"apiGroups": [""], "resources": ["*/status"], "verbs": ["patch"]},
            resource("patch", "nodes", "status"),
            True,
        ),
        (
            {"apiGroups": [""], "resources": ["*/status"], "verbs": ["patch"]},
            resource("patch", "nodes"),
            False,
        ),
        (
            {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
            resource("delete", "roles", group=RBAC),
            True,
        ),
        (
            {"apiGroups": [""], "resources": ["roles"], "verbs": ["*"]},
            resource("get", "roles", group=RBAC),
            False,
        ),
        (
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": ["p"]},
            resource("get", "pods", name="p"),
            True,
        ),
        (
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"], "resourceNames": ["p"]},
            resource("get", "pods", name="q"),
            False,
        ),
        (
            {"nonResourceURLs": ["/apis/*"], "verbs": ["get"]},
            Attributes(verb="get", path="/apis/x/v1"),
            True,
        ),
        (
            {"nonResourceURLs": ["/apis/*"], "verbs": ["get"]},
            Attributes(verb="get", path="/metrics"),
            False,
        ),
        (
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
            Attributes(verb="get", path="/api/v1/pods"),
            False,
        ),
    ],
)
def test_rules_match_as_rbac_does(rule, attrs, allowed):
    assert rule_allows(rule, attrs) is allowed


def test_authorization_comes_before_the_path_is_known(kube, account, ns):
    """A path no rule grants is 403 whether or not it exists; for the administrator, 404."""
    widgets = f"{kube.url}/api/v1/namespaces/{ns}/widgets"
    headers = {"Authorization": account.api_client.configuration.api_key["BearerToken"]}
    r = requests.get(widgets, headers=headers, timeout=5)
    assert r.status_code == 403 and r.json()["message"].startswith("widgets is forbidden")
    r = requests.get(f"{kube.url}/metrics", headers=headers, timeout=5)
    assert r.status_code == 403
    user = f"system:serviceaccount:{ns}:robot"
    assert r.json()["message"] == f'forbidden: User "{user}" cannot get path "/metrics"'
    admin = {"Authorization": f"Bearer {kube.admin_token}"}
    assert requests.get(widgets, headers=admin, timeout=5).status_code == 404
    assert requests.get(f"{kube.url}/metrics", headers=admin, timeout=5).status_code == 404
