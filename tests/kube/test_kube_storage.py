"""Homes on the simulated cluster's storage (docs/kubernetes.md, "Storage"): a fresh volume is
root's, the server runs as the single-user image's user, and a ReadWriteOnce home attaches to
one node at a time, so a user's named servers run where their home is."""

import os

import requests

from tests.kube.conftest import kube_api, singleuser_image_user
from tests.kube.test_kube_spawn import pod_of, reach


def test_a_fresh_home_is_the_servers_group_so_the_images_user_writes_it(platform, cluster):
    platform.create_user("oda")
    r = platform.spawn("oda", {"kind": "card", "card": "L40S", "count": 1})
    assert r.status_code in (201, 202), r.text + platform.log_tail(120)
    platform.wait_ready("oda")
    reach(platform, "oda")
    image = singleuser_image_user()
    pod = pod_of(cluster, "oda")
    assert pod["spec"]["securityContext"]["fsGroup"] == image.gid
    assert pod["spec"]["containers"][0]["securityContext"]["runAsUser"] == image.uid
    # the server writes its home as the image's user, the file in the home's group
    r = requests.put(
        f"{platform.url}/user/oda/api/contents/notes.txt",
        json={"type": "file", "format": "text", "content": "kept"},
        headers={"Authorization": f"token {platform.user_token('oda')}"},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    claim = kube_api(cluster).read_namespaced_persistent_volume_claim("home-oda", "gputap")
    home = cluster.call(cluster.cluster.volumes.volume_dir, claim.spec.volume_name)
    info = os.stat(os.path.join(home, "notes.txt"))
    assert (info.st_uid, info.st_gid) == (image.uid, image.gid)
    platform.stop_server("oda")


def test_named_servers_run_on_the_node_that_holds_their_home(platform, cluster):
    platform.create_user("noa")
    r = platform.spawn("noa", {"kind": "card", "card": "A100-80GB", "count": 1})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("noa")
    assert pod_of(cluster, "noa")["spec"]["nodeName"] == "gpu-a100"
    # the home (ReadWriteOnce) is attached to gpu-a100: L40S cards are on another node
    r = platform.spawn("noa", {"kind": "card", "card": "L40S", "count": 1}, server_name="second")
    assert r.status_code == 409, r.text + platform.log_tail(80)
    message = r.json()["message"]
    assert "No L40S" in message and "gpu-a100" in message, message
    assert "ReadWriteOnce" in message and "stop it" in message, message
    # a spec request elsewhere served by the cheaper L40S gets an A100 next to the home
    spec = {"kind": "spec", "min_memory_gb": 40, "min_tflops": 300}
    r = platform.spawn("noa", spec, server_name="third")
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("noa", server_name="third")
    third = [
        p
        for p in cluster.pods("gputap")
        if p["metadata"]["labels"].get("gputap.io/server") == "third"
        and "deletionTimestamp" not in p["metadata"]
    ]
    assert [p["spec"]["nodeName"] for p in third] == ["gpu-a100"]
    assert third[0]["metadata"]["labels"]["gputap.io/card"] == "A100-80GB"
    platform.stop_server("noa", server_name="third")
    platform.stop_server("noa")
