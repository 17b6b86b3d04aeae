"""The real sync `kubernetes` client against the simulated API server."""

import json

import pytest
import requests
from kubernetes import watch
from kubernetes.client.rest import ApiException

from tests.kube_sim.conftest import pod_body


def status_of(exc: ApiException) -> dict:
    return json.loads(exc.body)


def test_pod_create_get_list_patch_delete(core, ns):
    created = core.create_namespaced_pod(ns, pod_body("jupyter-ada"))
    assert created.metadata.uid and created.metadata.resource_version
    assert created.status.phase == "Pending"
    got = core.read_namespaced_pod("jupyter-ada", ns)
    assert got.metadata.uid == created.metadata.uid
    patched = core.patch_namespaced_pod("jupyter-ada", ns, {"metadata": {"labels": {"x": "y"}}})
    assert patched.metadata.labels == {"app": "jupyterhub", "x": "y"}
    assert int(patched.metadata.resource_version) > int(created.metadata.resource_version)
    listed = core.list_namespaced_pod(ns)
    assert [p.metadata.name for p in listed.items] == ["jupyter-ada"]
    assert int(listed.metadata.resource_version) >= int(patched.metadata.resource_version)
    core.delete_namespaced_pod("jupyter-ada", ns, grace_period_seconds=0)
    with pytest.raises(ApiException) as e:
        core.read_namespaced_pod("jupyter-ada", ns)
    assert e.value.status == 404


def test_json_patch_and_replace(core, ns):
    core.create_namespaced_config_map(ns, {"metadata": {"name": "cfg"}, "data": {"a": "1"}})
    patched = core.patch_namespaced_config_map(
        "cfg", ns, [{"op": "add", "path": "/data/b", "value": "2"}]
    )
    assert patched.data == {"a": "1", "b": "2"}
    patched.data = {"c": "3"}
    replaced = core.replace_namespaced_config_map("cfg", ns, patched)
    assert replaced.data == {"c": "3"}
    patched.data = {"stale": "write"}  # still carries the old resourceVersion
    with pytest.raises(ApiException) as e:
        core.replace_namespaced_config_map("cfg", ns, patched)
    assert e.value.status == 409 and status_of(e.value)["reason"] == "Conflict"


def test_secret_pvc_service_round_trip(core, ns):
    secret = core.create_namespaced_secret(
        ns, {"metadata": {"name": "token"}, "stringData": {"key": "s3cret"}}
    )
    assert secret.data == {"key": "czNjcmV0"} and secret.type == "Opaque"
    pvc = core.create_namespaced_persistent_volume_claim(
        ns,
        {
            "metadata": {"name": "claim-ada"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "10Gi"}},
            },
        },
    )
    # the default class binds where the first pod lands (tests/kube_sim/test_volumes.py)
    assert pvc.status.phase == "Pending" and pvc.spec.storage_class_name == "standard-rwo"
    svc = core.create_namespaced_service(
        ns, {"metadata": {"name": "jupyter-ada"}, "spec": {"ports": [{"port": 8888}]}}
    )
    assert svc.spec.cluster_ip and svc.spec.ports[0].target_port == 8888
    for read, delete, name in [
        (core.read_namespaced_secret, core.delete_namespaced_secret, "token"),
        (
            core.read_namespaced_persistent_volume_claim,
            core.delete_namespaced_persistent_volume_claim,
            "claim-ada",
        ),
        (core.read_namespaced_service, core.delete_namespaced_service, "jupyter-ada"),
    ]:
        assert read(name, ns).metadata.name == name
        delete(name, ns)
        with pytest.raises(ApiException) as e:
            read(name, ns)
        assert e.value.status == 404


def test_errors_carry_kubernetes_status_bodies(core, ns):
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("nobody", ns)
    assert missing.value.status == 404
    assert status_of(missing.value) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'pods "nobody" not found',
        "reason": "NotFound",
        "details": {"name": "nobody", "kind": "pods"},
        "code": 404,
    }
    core.create_namespaced_pod(ns, pod_body("twice"))
    with pytest.raises(ApiException) as dup:
        core.create_namespaced_pod(ns, pod_body("twice"))
    assert dup.value.status == 409 and status_of(dup.value)["reason"] == "AlreadyExists"
    no_containers = {"metadata": {"name": "empty"}, "spec": {"containers": []}}
    with pytest.raises(ApiException) as bad:
        core.create_namespaced_pod(ns, no_containers)
    assert bad.value.status == 422 and status_of(bad.value)["reason"] == "Invalid"
    assert "spec.containers" in status_of(bad.value)["message"]
    with pytest.raises(ApiException) as bad_name:
        core.create_namespaced_pod(ns, pod_body("Jupyter_Ada"))
    assert bad_name.value.status == 422
    with pytest.raises(ApiException) as no_ns:
        core.create_namespaced_pod("no-such-namespace", pod_body("x"))
    assert no_ns.value.status == 404
    assert status_of(no_ns.value)["details"] == {"name": "no-such-namespace", "kind": "namespaces"}


def test_list_with_label_and_field_selectors(core, ns):
    for name, tier in [("a", "gpu"), ("b", "cpu"), ("c", "gpu")]:
        body = pod_body(name)
        body["metadata"]["labels"]["tier"] = tier
        core.create_namespaced_pod(ns, body)
    names = lambda r: sorted(p.metadata.name for p in r.items)  # noqa: E731
    assert names(core.list_namespaced_pod(ns, label_selector="tier=gpu")) == ["a", "c"]
    assert names(core.list_namespaced_pod(ns, label_selector="tier notin (gpu)")) == ["b"]
    assert names(core.list_namespaced_pod(ns, field_selector="metadata.name=b")) == ["b"]
    everywhere = core.list_pod_for_all_namespaces(field_selector=f"metadata.namespace={ns}")
    assert names(everywhere) == ["a", "b", "c"]
    with pytest.raises(ApiException) as e:
        core.list_namespaced_pod(ns, field_selector="spec.bogus=1")
    assert e.value.status == 400


def test_watch_sees_added_modified_deleted_in_order_from_a_resource_version(core, ns):
    start = core.list_namespaced_config_map(ns).metadata.resource_version
    core.create_namespaced_config_map(ns, {"metadata": {"name": "w"}, "data": {"v": "1"}})
    core.patch_namespaced_config_map("w", ns, {"data": {"v": "2"}})
    core.delete_namespaced_config_map("w", ns)
    seen = []
    w = watch.Watch()
    for event in w.stream(
        core.list_namespaced_config_map, ns, resource_version=start, timeout_seconds=2
    ):
        seen.append((event["type"], event["object"].data["v"]))
        if len(seen) == 3:
            w.stop()
    assert seen == [("ADDED", "1"), ("MODIFIED", "2"), ("DELETED", "2")]


def test_discovery_endpoints(core):
    from kubernetes.client import VersionApi

    version = VersionApi(core.api_client).get_code()
    assert version.major == "1"
    assert core.get_api_resources().group_version == "v1"


def test_resource_quantities_written_as_numbers_come_back_as_strings(core, ns):
    """The API server parses a quantity sent as a JSON number (KubeSpawner sends
    cpu_guarantee as a float) and answers its canonical string: clients model quantities as
    strings, and the sync client refuses a pod whose cpu is a number."""
    resources = {
        "requests": {"cpu": 1.71, "memory": "17G"},
        "limits": {"cpu": 2, "x.io/y": 0.5, "x.io/z": 2000, "x.io/w": 0.0001},
    }
    body = pod_body("numbers", resources=resources)
    # the typed client would send strings: post the JSON as KubeSpawner's client does
    host = core.api_client.configuration.host
    auth = {"Authorization": core.api_client.configuration.api_key["BearerToken"]}
    created = requests.post(
        f"{host}/api/v1/namespaces/{ns}/pods", json=body, headers=auth, timeout=10
    ).json()
    stored = created["spec"]["containers"][0]["resources"]
    assert stored == {
        "requests": {"cpu": "1710m", "memory": "17G"},
        "limits": {"cpu": "2", "x.io/y": "500m", "x.io/z": "2k", "x.io/w": "1m"},
    }
    pod = core.read_namespaced_pod("numbers", ns)
    assert pod.spec.containers[0].resources.requests["cpu"] == "1710m"
