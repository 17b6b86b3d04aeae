"""metadata.ownerReferences at the simulated API server, through the real sync client: invalid
references are refused in the server's words (422), and OwnerReferencesPermissionEnforcement
refuses a ServiceAccount references it may not set (403), naming the missing right in the
audit."""

import kubernetes.client
import pytest
import requests

from tests.kube_sim.conftest import NOWHERE, exists, owned_by, pod_body, refusal

RBAC = "rbac.authorization.k8s.io"


def raw_create(kube, ns: str, plural: str, body: dict) -> tuple[int, dict]:
    """POST a body the client's models would refuse to send (required fields missing)."""
    response = requests.post(
        f"{kube.url}/api/v1/namespaces/{ns}/{plural}",
        json=body,
        headers={"Authorization": f"Bearer {kube.admin_token}"},
        timeout=10,
    )
    return response.status_code, response.json()


# -- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ref,detail",
    [
        (
            {"apiVersion": "v1", "kind": "Pod", "name": "o", "uid": ""},
            'metadata.ownerReferences.uid: Invalid value: "": uid must not be empty',
        ),
        (
            {"apiVersion": "v1", "kind": "Pod", "uid": "u"},
            'metadata.ownerReferences.name: Invalid value: "": name must not be empty',
        ),
        (
            {"apiVersion": "v1", "name": "o", "uid": "u"},
            'metadata.ownerReferences.kind: Invalid value: "": kind must not be empty',
        ),
        (
            {"apiVersion": "apps/", "kind": "Deployment", "name": "o", "uid": "u"},
            'metadata.ownerReferences.apiVersion: Invalid value: "apps/": version must not be '
            "empty",
        ),
        (
            {"apiVersion": "v1", "kind": "Event", "name": "e", "uid": "u"},
            'metadata.ownerReferences: Invalid value: {"apiVersion":"v1","kind":"Event",'
            '"name":"e","uid":"u"}: /v1, Kind=Event is disallowed from being an owner',
        ),
    ],
)
def test_an_invalid_reference_is_refused_in_the_api_servers_words(kube, ns, ref, detail):
    code, body = raw_create(
        kube, ns, "configmaps", {"metadata": {"name": "c", "ownerReferences": [ref]}}
    )
    assert code == 422
    assert body["reason"] == "Invalid"
    assert body["message"] == f'ConfigMap "c" is invalid: {detail}'
    field = detail.split(":")[0]
    assert [c["field"] for c in body["details"]["causes"]] == [field]


def test_several_errors_are_listed_and_only_one_controller_is_allowed(kube, core, ns):
    code, body = raw_create(
        kube,
        ns,
        "pods",
        {**pod_body("p"), "metadata": {"name": "p", "ownerReferences": [{"apiVersion": "v1"}]}},
    )
    assert code == 422
    assert body["message"] == (
        'Pod "p" is invalid: [metadata.ownerReferences.kind: Invalid value: "": kind must not '
        'be empty, metadata.ownerReferences.name: Invalid value: "": name must not be empty, '
        'metadata.ownerReferences.uid: Invalid value: "": uid must not be empty]'
    )
    a = {"apiVersion": "v1", "kind": "Pod", "name": "a", "uid": "1", "controller": True}
    b = {"apiVersion": "v1", "kind": "Pod", "name": "b", "uid": "2", "controller": True}
    policy = {"metadata": {"name": "np", "ownerReferences": [a, b]}, "spec": {"podSelector": {}}}
    net = kubernetes.client.NetworkingV1Api(core.api_client)
    code, body = refusal(net.create_namespaced_network_policy, ns, policy)
    assert code == 422
    assert body["details"]["group"] == "networking.k8s.io"
    assert body["message"] == (
        'NetworkPolicy.networking.k8s.io "np" is invalid: metadata.ownerReferences: Invalid '
        'value: [{"apiVersion":"v1","kind":"Pod","name":"a","uid":"1","controller":true},'
        '{"apiVersion":"v1","kind":"Pod","name":"b","uid":"2","controller":true}]: Only one '
        'reference can have Controller set to true. Found "true" in references for Pod/a and '
        "Pod/b"
    )


def test_updates_and_patches_are_validated_too(core, ns):
    cm = core.create_namespaced_config_map(ns, {"metadata": {"name": "c"}})
    cm.metadata.owner_references = [
        kubernetes.client.V1OwnerReference(api_version="v1", kind="Pod", name="o", uid="")
    ]
    # the client's model refuses an empty uid itself, so send the body as JSON
    body = core.api_client.sanitize_for_serialization(cm)
    body["metadata"]["ownerReferences"][0]["uid"] = ""
    code, status = refusal(core.replace_namespaced_config_map, "c", ns, body)
    assert (code, status["details"]["causes"][0]["field"]) == (422, "metadata.ownerReferences.uid")
    patch = {"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "uid": "u"}]}}
    code, status = refusal(core.patch_namespaced_config_map, "c", ns, patch)
    assert code == 422
    assert status["message"].endswith('name: Invalid value: "": name must not be empty')
    assert core.read_namespaced_config_map("c", ns).metadata.owner_references is None


# -- OwnerReferencesPermissionEnforcement -------------------------------------------------------


@pytest.fixture
def robot(kube, core, ns):
    """A ServiceAccount that may create, read, update and patch pods and configmaps (not
    delete them, nor update pods/finalizers); (its CoreV1Api, its role's name)."""
    core.create_namespaced_service_account(ns, {"metadata": {"name": "robot"}})
    rbac = kubernetes.client.RbacAuthorizationV1Api(core.api_client)
    verbs = ["create", "get", "list", "update", "patch"]
    rbac.create_namespaced_role(
        ns,
        {
            "metadata": {"name": "robot"},
            "rules": [{"apiGroups": [""], "resources": ["pods", "configmaps"], "verbs": verbs}],
        },
    )
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "robot"},
            "subjects": [{"kind": "ServiceAccount", "name": "robot", "namespace": ns}],
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": "robot"},
        },
    )
    config = kubernetes.client.Configuration(
        host=kube.url, api_key={"BearerToken": f"Bearer {kube.service_account_token(ns, 'robot')}"}
    )
    with kubernetes.client.ApiClient(config) as client:
        yield kubernetes.client.CoreV1Api(client)


def grant(core, ns, rule):
    rbac = kubernetes.client.RbacAuthorizationV1Api(core.api_client)
    role = rbac.read_namespaced_role("robot", ns)
    role.rules.append(kubernetes.client.V1PolicyRule(**rule))
    rbac.replace_namespaced_role("robot", ns, role)


def test_a_reference_without_block_owner_deletion_needs_no_more_rights(kube, robot, ns):
    server = robot.create_namespaced_pod(ns, pod_body("server", nodeSelector=NOWHERE))
    worker = pod_body("worker", nodeSelector=NOWHERE)
    worker["metadata"].update(owned_by(server, controller=True))
    assert robot.create_namespaced_pod(ns, worker).metadata.owner_references[0].controller


def test_block_owner_deletion_needs_update_of_the_owners_finalizers(kube, core, robot, ns):
    server = robot.create_namespaced_pod(ns, pod_body("server", nodeSelector=NOWHERE))
    worker = pod_body("worker", nodeSelector=NOWHERE)
    worker["metadata"].update(owned_by(server, blockOwnerDeletion=True))

    code, body = refusal(robot.create_namespaced_pod, ns, worker)
    assert (code, body["reason"]) == (403, "Forbidden")
    assert body["message"] == (
        'pods "worker" is forbidden: cannot set blockOwnerDeletion if an ownerReference refers '
        "to a resource you can't set finalizers on: , <nil>"
    )
    assert body["details"] == {"name": "worker", "kind": "pods"}
    [record] = [r for r in kube.audit if r.resource == "pods/finalizers"]
    assert (record.user, record.verb, record.scope, record.name, record.code) == (
        f"system:serviceaccount:{ns}:robot",
        "update",
        ns,
        "server",
        403,
    )
    assert not exists(core.read_namespaced_pod, "worker", ns)

    grant(core, ns, {"api_groups": [""], "resources": ["pods/finalizers"], "verbs": ["update"]})
    assert robot.create_namespaced_pod(ns, worker).metadata.owner_references[0].block_owner_deletion
    assert [r.allowed for r in kube.audit if r.resource == "pods/finalizers"][-1]
    # the administrator may do anything; an owner kind nobody serves cannot be checked at all
    core.create_namespaced_config_map(
        ns, {"metadata": {"name": "admin", **owned_by(server, blockOwnerDeletion=True)}}
    )
    ref = {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "u"}
    code, body = refusal(
        core.create_namespaced_config_map,
        ns,
        {"metadata": {"name": "d", "ownerReferences": [{**ref, "blockOwnerDeletion": True}]}},
    )
    assert code == 403
    assert body["message"] == (
        'configmaps "d" is forbidden: cannot set blockOwnerDeletion in this case because cannot '
        "find RESTMapping for APIVersion apps/v1 Kind Deployment: no matches for kind "
        '"Deployment" in version "apps/v1"'
    )


def test_changing_the_references_of_an_object_needs_its_delete(kube, core, robot, ns):
    server = robot.create_namespaced_pod(ns, pod_body("server", nodeSelector=NOWHERE))
    robot.create_namespaced_config_map(ns, {"metadata": {"name": "settings"}})
    patch = {"metadata": owned_by(server)}

    code, body = refusal(robot.patch_namespaced_config_map, "settings", ns, patch)
    assert code == 403
    assert body["message"] == (
        'configmaps "settings" is forbidden: cannot set an ownerRef on a resource you can\'t '
        "delete: , <nil>"
    )
    assert [r.code for r in kube.audit if r.verb == "delete" and r.name == "settings"] == [403]
    # an update that leaves the references as they are needs nothing more
    robot.patch_namespaced_config_map("settings", ns, {"data": {"a": "b"}})

    grant(core, ns, {"api_groups": [""], "resources": ["configmaps"], "verbs": ["delete"]})
    patched = robot.patch_namespaced_config_map("settings", ns, patch)
    assert patched.metadata.owner_references[0].uid == server.metadata.uid
