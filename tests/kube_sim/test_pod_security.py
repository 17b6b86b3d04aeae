"""The simulated cluster's Pod Security admission (pod_security.py) refuses what the real
restricted profile refuses, and admits a pod that sets what it asks."""

import copy

import pytest

from tests.kube_sim.pod_security import pod_specs, restricted_violations

GOOD = {
    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    "containers": [
        {
            "name": "notebook",
            "securityContext": {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            },
        }
    ],
    "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": "h"}}],
}


def changed(path: str, value) -> dict:
    spec = copy.deepcopy(GOOD)
    *keys, last = path.split(".")
    target = spec
    for key in keys:
        target = target[int(key)] if key.isdigit() else target[key]
    if value is None:
        del target[last]
    else:
        target[last] = value
    return spec


def test_a_pod_that_sets_what_restricted_asks_is_admitted():
    assert restricted_violations(GOOD) == []


@pytest.mark.parametrize(
    "path,value,says",
    [
        ("securityContext.runAsNonRoot", None, "runAsNonRoot != true"),
        ("securityContext.seccompProfile", None, "seccompProfile"),
        ("securityContext.seccompProfile", {"type": "Unconfined"}, "seccompProfile"),
        ("containers.0.securityContext.allowPrivilegeEscalation", None, "allowPrivilegeEscalation"),
        ("containers.0.securityContext.capabilities", None, "unrestricted capabilities"),
        ("containers.0.securityContext.privileged", True, "privileged"),
        ("containers.0.securityContext.runAsUser", 0, "runAsUser=0"),
        (
            "volumes",
            [{"name": "d", "nfs": {"server": "s", "path": "/"}}],
            "restricted volume types",
        ),
        ("volumes", [{"name": "d", "hostPath": {"path": "/"}}], "restricted volume types"),
        ("hostNetwork", True, "host namespaces"),
    ],
)
def test_each_thing_restricted_refuses_is_named(path, value, says):
    assert any(says in v for v in restricted_violations(changed(path, value)))


def test_init_containers_are_held_to_it_too():
    spec = copy.deepcopy(GOOD)
    spec["initContainers"] = [{"name": "setup"}]
    assert any('"setup"' in v for v in restricted_violations(spec))


def test_pod_makers_give_their_templates():
    deployment = {"kind": "Deployment", "metadata": {"name": "d"}}
    deployment["spec"] = {"template": {"spec": GOOD}}
    assert pod_specs([deployment, {"kind": "Service", "metadata": {"name": "s"}}]) == {
        "Deployment/d": GOOD
    }


def test_the_kubelet_refuses_a_non_root_container_that_would_run_as_root():
    from tests.kube_sim.volumes import ImageUser, runs_as_root_against_policy

    images = {"gputap/singleuser": ImageUser(1000, 100, "/home/jovyan")}
    pod = {"metadata": {"name": "p", "namespace": "n", "uid": "u"}, "spec": GOOD}
    root_image = {"name": "notebook", "image": "busybox:1"}
    assert "runAsNonRoot and image will run as root" in runs_as_root_against_policy(
        pod, root_image, images
    )
    assert (
        runs_as_root_against_policy(pod, {**root_image, "image": "gputap/singleuser:0.1"}, images)
        == ""
    )
    as_user = {**root_image, "securityContext": {"runAsUser": 1000}}
    assert runs_as_root_against_policy(pod, as_user, images) == ""
