"""Data disks on the Kubernetes backend: a claim per disk, mounted into the server's pod when
attached (the pod restarts), gone from the pod when detached, deleted with the disk."""

import json

import pytest
from kubernetes.client.exceptions import ApiException

from tests.disks_client import needs_storage_billing, started, user, wait_restarted
from tests.kube.conftest import kube_api
from tests.kube.test_kube_spawn import pod_of

# the simulated cluster has GPU nodes only (tainted): a slice is the smallest server
SLICE = {"kind": "slice", "card": "H100-80GB", "profile": "1g.10gb"}


@pytest.fixture(scope="module")
def storage_billing(platform):
    return needs_storage_billing(platform)


def container_env(pod) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}


def test_an_attached_disk_is_mounted_in_the_pod(platform, cluster, storage_billing):
    kim = user(platform, "kim")
    r = kim.create("kim", {"name": "data", "size_gb": 3})
    assert r.status_code == 201, r.text
    assert r.json()["path"] == "/mnt/disks/data" and r.json()["used_bytes"] is None
    claim = kube_api(cluster).read_namespaced_persistent_volume_claim("disk-kim--data", "gputap")
    assert claim.spec.resources.requests == {"storage": "3Gi"}

    assert platform.spawn("kim", SLICE).status_code in (201, 202)
    before = started(platform, "kim")
    assert json.loads(container_env(pod_of(cluster, "kim"))["GPUTAP_DISKS"]) == []
    r = kim.attach("kim", "data", "")
    assert r.status_code == 202, r.text
    assert r.json()["restart"]["state"] == "stopping"
    wait_restarted(platform, "kim", before)

    pod = pod_of(cluster, "kim")
    assert {"name": "disk-data", "persistentVolumeClaim": {"claimName": "disk-kim--data"}} in pod[
        "spec"
    ]["volumes"]
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "disk-data", "mountPath": "/mnt/disks/data"} in mounts
    assert {"name": "home", "mountPath": "/home/jovyan"} in mounts  # the home stays
    hook = pod["spec"]["containers"][0]["lifecycle"]["postStart"]["exec"]["command"]
    assert hook[:2] == ["sh", "-c"] and "/mnt/disks" in hook[2]
    assert json.loads(container_env(pod)["GPUTAP_DISKS"]) == [
        {"name": "data", "path": "/mnt/disks/data"}
    ]
    assert kim.list("kim").json()["disks"][0]["attached_running"] is True

    r = kim.delete("kim", "data")
    assert r.status_code == 409
    during = started(platform, "kim")
    assert kim.detach("kim", "data").status_code == 202
    wait_restarted(platform, "kim", during)
    pod = pod_of(cluster, "kim")
    assert not [v for v in pod["spec"]["volumes"] if v["name"] == "disk-data"]
    assert json.loads(container_env(pod)["GPUTAP_DISKS"]) == []

    assert kim.delete("kim", "data").status_code == 204
    with pytest.raises(ApiException) as gone:
        kube_api(cluster).read_namespaced_persistent_volume_claim("disk-kim--data", "gputap")
    assert gone.value.status == 404
    platform.stop_server("kim")
