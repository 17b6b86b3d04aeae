"""GPU faults on Kubernetes (docs/gpu-faults.md), as the simulated cluster's device plugin,
kubelet and health agents report them: the device of a running server fails → the unit is
held out, the session ends at the detection second, and the server runs again on another
device with its files; no later spawn gets the faulty device until an admin returns it; a
fault on a free device only takes it out; a node going bad moves every server on it."""

import time
from datetime import datetime

import pytest
import requests

from tests.kube.conftest import gputap_cluster, kube_platform
from tests.kube.test_kube_spawn import pod_of

L40S = {"kind": "card", "card": "L40S"}


@pytest.fixture(scope="module")
def cluster(chart_rbac):
    with gputap_cluster(chart_rbac, seed=11) as c:
        c.gpu_node("gpu-l40s-a", product="NVIDIA-L40S", gpus=2, memory_mib=46068)
        c.gpu_node("gpu-l40s-b", product="NVIDIA-L40S", gpus=2, memory_mib=46068)
        yield c


@pytest.fixture(scope="module")
def platform(cluster, tmp_path_factory):
    p = kube_platform(
        cluster,
        tmp_path_factory.mktemp("kube-gpu-faults"),
        hub={"admin_users": ["root"]},
        faults={"save_grace_seconds": 1},
    )
    p.start()
    yield p
    p.shutdown()


def parse(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def api(platform, path: str, method: str = "GET", body=None, token: str | None = None):
    headers = {"Authorization": f"token {token}"} if token else {}
    session = requests if token else platform.api
    return session.request(
        method, f"{platform.url}/hub/gputap/api/{path}", json=body, headers=headers, timeout=60
    )


def device_of(cluster, user: str) -> tuple[str, str]:
    pod = pod_of(cluster, user)
    [device] = cluster.visible_gpus("gputap", pod["metadata"]["name"])
    return pod["spec"]["nodeName"], device


def running_again(platform, token: str, user: str):
    def done():
        view = api(platform, f"users/{user}/server", token=token).json()
        change = view.get("change") or {}
        return view if view["running"] and change.get("state") == "done" else None

    return done


def started(platform, user: str) -> str:
    platform.create_user(user)
    token = platform.user_token(user)
    assert platform.spawn(user, L40S).status_code in (201, 202)
    platform.wait_ready(user, timeout=90)
    return token


def test_a_faulty_gpu_moves_its_server_and_stays_out_until_returned(platform, cluster):
    token = started(platform, "ada")
    r = requests.put(
        f"{platform.url}/user/ada/api/contents/notes.txt",
        json={"type": "file", "format": "text", "content": "kept"},
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    node, device = device_of(cluster, "ada")
    [session] = platform.sessions("ada")

    injected = time.time()
    cluster.gpu_fault(node, int(device.rsplit("-", 1)[1]))
    book_id = f"{node}/{device}"

    def out():
        devices = api(platform, "admin/gpus").json()["devices"]
        return any(d["id"] == book_id and d["state"] == "faulty" for d in devices) and time.time()

    assert platform.wait_for(out) - injected <= 30
    [fault] = [
        f for f in api(platform, "admin/gpu-faults").json()["faults"] if book_id in f["devices"]
    ]
    detected = parse(fault["detected_at"])

    def ended():
        s = next(s for s in platform.sessions("ada") if s["id"] == session["id"])
        return s if s["state"] == "ended" else None

    closed = platform.wait_for(ended)
    assert abs(parse(closed["ended_at"]) - detected) <= 1, (closed, fault)

    view = platform.wait_for(running_again(platform, token, "ada"), timeout=120)
    assert view["change"]["reason"] == "fault"
    new_node, new_device = device_of(cluster, "ada")
    assert (new_node, new_device) != (node, device)
    r = requests.get(
        f"{platform.url}/user/ada/api/contents/notes.txt",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["content"] == "kept"
    new = next(s for s in platform.sessions("ada") if s["id"] != session["id"])
    assert parse(new["started_at"]) >= detected

    # the device plugin offers the device again after a restart: gputap keeps it out
    cluster.gpu_heal(node, int(device.rsplit("-", 1)[1]))
    time.sleep(1.5)
    for user in ("bo", "cy"):
        started(platform, user)
        assert device_of(cluster, user) != (node, device)
    # all four L40S but the faulty one are taken: the next spawn is refused, not placed on it
    platform.create_user("di")
    platform.spawn("di", L40S)
    time.sleep(3)
    assert not (platform.server("di") or {}).get("ready")

    back = api(platform, f"admin/gpus/{book_id}/return", "POST", {})
    assert back.status_code == 200, back.text
    # one entry per broken device, whichever of the pod and the node told first
    devices = api(platform, "admin/gpus").json()["devices"]
    assert [d for d in devices if d["state"] != "healthy"] == []
    nodes = {n["name"]: n for n in api(platform, "admin/gpus").json()["nodes"]}
    assert nodes[node]["held_out"] == {}
    for user in ("ada", "bo", "cy"):
        platform.stop_server(user)


def test_a_fault_on_a_free_gpu_only_takes_it_out(platform, cluster):
    before = len(api(platform, "admin/gpu-faults").json()["faults"])
    cluster.gpu_fault("gpu-l40s-b", 1, report=False)  # as before Kubernetes 1.36

    def seen():
        faults = api(platform, "admin/gpu-faults").json()["faults"]
        return faults[0] if len(faults) > before else None

    fault = platform.wait_for(seen)
    assert fault["node"] == "gpu-l40s-b" and fault["units"] == 1
    assert fault["servers"] == []
    nodes = {n["name"]: n for n in api(platform, "admin/gpus").json()["nodes"]}
    assert nodes["gpu-l40s-b"]["held_out"] == {"nvidia.com/gpu": 1}
    assert nodes["gpu-l40s-b"]["gpus"]["nvidia.com/gpu"] == {
        "offering": "L40S",
        "capacity": 2,
        "allocatable": 1,
        "held_out": 1,
    }
    # the GPU was replaced and the device plugin restarted: an admin returns the unit
    cluster.gpu_heal("gpu-l40s-b", 1)
    [held] = [
        d
        for d in api(platform, "admin/gpus").json()["devices"]
        if d["state"] == "faulty" and d["node"] == "gpu-l40s-b"
    ]
    assert held["id"] == f"gpu-l40s-b/nvidia.com/gpu@{fault['id']}"
    back = api(platform, f"admin/gpus/{held['id']}/return", "POST", {})
    assert back.status_code == 200, back.text
    nodes = {n["name"]: n for n in api(platform, "admin/gpus").json()["nodes"]}
    assert nodes["gpu-l40s-b"]["held_out"] == {}


def test_a_node_going_bad_moves_every_server_on_it(platform, cluster):
    for user in ("eve", "fay"):
        started(platform, user)
    nodes = {user: device_of(cluster, user)[0] for user in ("eve", "fay")}
    bad = nodes["eve"]
    on_bad = [u for u, n in nodes.items() if n == bad]
    tokens = {u: platform.user_token(u) for u in on_bad}
    cluster.set_condition(bad, "GPUXIDErrors", "True", reason="XID79")

    def closed():
        listed = {n["name"]: n for n in api(platform, "admin/gpus").json()["nodes"]}
        return listed[bad]["closed"]

    platform.wait_for(closed)
    refused = api(platform, f"admin/gpus/node:{bad}/return", "POST", {})
    assert refused.status_code == 409 and "GPUXIDErrors" in refused.json()["message"]
    for user in on_bad:
        platform.wait_for(running_again(platform, tokens[user], user), timeout=120)
        assert device_of(cluster, user)[0] != bad
    cluster.clear_condition(bad, "GPUXIDErrors")
    time.sleep(1.5)
    back = api(platform, f"admin/gpus/node:{bad}/return", "POST", {})
    assert back.status_code == 200, back.text
    for user in ("eve", "fay"):
        platform.stop_server(user)
