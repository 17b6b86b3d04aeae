"""Scale-out on the Kubernetes backend (issue 17, docs/scale-out.md), the real hub, proxy and
billing on the simulated cluster: worker pods built from the server's (its image, its home
claim on a shared file system), their own GPUs as limits, owned by the server's pod, labelled
as its group, one NetworkPolicy for the group; the hub reaches each agent at its pod's
address; billing meters each worker's pod as a session of its own; a request for more than
is free is refused saying what is free, or waits in the queue when asked; the group goes
when its server stops."""

from __future__ import annotations

from datetime import datetime, timedelta

import kubernetes
import pytest
import requests

from tests.kube.conftest import gputap_cluster, kube_api, kube_platform, shared_homes
from tests.kube.test_kube_spawn import pod_of
from tests.waiting import wait_for

A100 = {"kind": "card", "card": "A100-80GB", "count": 1}


@pytest.fixture(scope="module")
def cluster(chart_rbac):
    with gputap_cluster(chart_rbac, seed=17) as c:
        for name in ("gpu-a", "gpu-b"):
            c.gpu_node(name, product="NVIDIA-A100-SXM4-80GB", gpus=2, cpu="64", memory="512Gi")
        # the NVIDIA container runtime as a RuntimeClass of its own, as k3s registers it
        node_api = kubernetes.client.NodeV1Api(kube_api(c).api_client)
        node_api.create_runtime_class({"metadata": {"name": "nvidia"}, "handler": "nvidia"})
        yield c


@pytest.fixture(scope="module")
def platform(cluster, tmp_path_factory):
    p = kube_platform(
        cluster,
        tmp_path_factory.mktemp("kube-scale-out"),
        kubernetes={**shared_homes(cluster), "runtime_class": "nvidia"},
        scale_out={"idle_seconds": 0},
    )
    p.start()
    yield p
    p.shutdown()


def workers_url(platform, name: str) -> str:
    return f"{platform.url}/hub/gputap/api/users/{name}/server/workers"


def group(platform, name: str, token: str) -> dict:
    r = requests.get(workers_url(platform, name), headers=auth(token), timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"token {token}"}


def live_pods(cluster, role: str | None = None) -> list[dict]:
    return [
        p
        for p in cluster.pods("gputap")
        if "deletionTimestamp" not in p["metadata"]
        and (role is None or p["metadata"].get("labels", {}).get("gputap.io/role") == role)
    ]


def test_worker_pods_are_the_servers_own_with_their_gpus_owned_labelled_and_billed(
    platform, cluster
):
    platform.create_user("ada")
    token = platform.user_token("ada")
    r = platform.spawn("ada", A100)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("ada")
    server = pod_of(cluster, "ada")

    r = requests.post(workers_url(platform, "ada"), json={"count": 2}, headers=auth(token),
                      timeout=30)  # fmt: skip
    assert r.status_code == 202, r.text
    view = wait_for(
        lambda: (
            (v := group(platform, "ada", token))
            and [w["state"] for w in v["workers"]] == ["ready", "ready"]
            and v
        ),
        "the workers did not become ready",
        120,
        step=0.3,
    )
    assert view["rendezvous_host"] == server["status"]["podIP"]
    pods = {p["metadata"]["labels"]["gputap.io/worker"]: p for p in live_pods(cluster, "worker")}
    assert sorted(pods) == ["w1", "w2"]
    uid, name = server["metadata"]["uid"], server["metadata"]["name"]
    home = {v["name"]: v for v in server["spec"]["volumes"]}
    for pod in (server, *pods.values()):
        # the NVIDIA runtime's class; homes given to the group once, not at every start; the
        # offering's memory as the limit too (the catalog's 120 GB per A100)
        spec = pod["spec"]
        assert spec["runtimeClassName"] == "nvidia"
        assert spec["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
        resources = spec["containers"][0]["resources"]
        assert resources["limits"]["memory"] == resources["requests"]["memory"] == "120G"
    for worker, pod in pods.items():
        meta, spec = pod["metadata"], pod["spec"]
        assert meta["name"] == f"{name}-{worker}"
        assert meta["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}
        ]
        labels = meta["labels"]
        assert labels["gputap.io/user"] == server["metadata"]["labels"]["gputap.io/user"]
        assert labels["gputap.io/server"] == server["metadata"]["labels"]["gputap.io/server"]
        assert (labels["gputap.io/group"], labels["gputap.io/role"]) == (name, "worker")
        [container] = spec["containers"]
        assert container["name"] == "worker"
        assert container["image"] == server["spec"]["containers"][0]["image"]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "1", "memory": "120G"}
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["GPUTAP_WORKER_NAME"] == worker and env["GPUTAP_WORKER_TOKEN"]
        assert not [k for k in env if k.startswith(("JUPYTERHUB_", "JPY_"))]
        # the same home, at the same path
        claims = [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
        assert claims and all(home[v["name"]] == v for v in claims)
        assert cluster.visible_gpus("gputap", meta["name"])  # it sees a GPU of its own
        # the hub reached its agent at its own address
        [seen] = [w for w in view["workers"] if w["name"] == worker]
        assert seen["host"] == pod["status"]["podIP"] != server["status"]["podIP"]

    networking = kubernetes.client.NetworkingV1Api(kube_api(cluster).api_client)
    [policy] = networking.list_namespaced_network_policy(
        "gputap", label_selector=f"gputap.io/group={name}"
    ).items
    assert policy.metadata.owner_references[0].uid == uid
    assert policy.spec.pod_selector.match_labels == {
        "gputap.io/user": server["metadata"]["labels"]["gputap.io/user"],
        "gputap.io/server": server["metadata"]["labels"]["gputap.io/server"],
    }
    assert policy.spec.policy_types == ["Ingress", "Egress"]

    # billing meters each worker as a session of its own
    sessions = {s["worker"]: s for s in platform.sessions("ada")}
    assert sorted(sessions) == ["", "w1", "w2"]
    assert all(s["state"] == "running" for s in sessions.values())
    assert {w["session_id"] for w in view["workers"]} == {
        sessions["w1"]["id"],
        sessions["w2"]["id"],
    }
    for worker, pod in pods.items():  # from its agent's first answer, after its container ran
        [status] = pod["status"]["containerStatuses"]
        started = datetime.fromisoformat(status["state"]["running"]["startedAt"])
        begun = datetime.fromisoformat(sessions[worker]["started_at"])
        assert started <= begun <= started + timedelta(seconds=60), (worker, begun, started)

    # the group goes with its server: pods, sessions
    platform.stop_server("ada")
    wait_for(
        lambda: not live_pods(cluster, "worker"), "worker pods outlived their server", 60, step=0.3
    )
    ended = {s["worker"]: s for s in platform.sessions("ada")}
    assert all(s["state"] == "ended" for s in ended.values()), ended
    # the group stops before its server; the server's end comes from its pod, whose times
    # the API gives in whole seconds
    server_end = datetime.fromisoformat(ended[""]["ended_at"])
    for worker in ("w1", "w2"):
        worker_end = datetime.fromisoformat(ended[worker]["ended_at"])
        assert worker_end < server_end + timedelta(seconds=1), (worker_end, server_end)


def test_more_than_is_free_is_refused_saying_what_is_free_or_waits_in_the_queue(platform, cluster):
    platform.create_user("bob")
    token = platform.user_token("bob")
    r = platform.spawn("bob", A100)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("bob")
    before = {p["metadata"]["name"] for p in live_pods(cluster)}

    # 4 A100s in all, the server has one: 4 more are not free
    r = requests.post(workers_url(platform, "bob"), json={"count": 4}, headers=auth(token),
                      timeout=30)  # fmt: skip
    assert r.status_code == 409, r.text
    message = r.json()["message"]
    assert "A100" in message and "free" in message, message
    assert {p["metadata"]["name"] for p in live_pods(cluster)} == before
    assert group(platform, "bob", token)["count"] == 0

    # asked to queue: three start now, the fourth waits for a GPU
    r = requests.post(workers_url(platform, "bob"), json={"count": 4, "queue": True},
                      headers=auth(token), timeout=30)  # fmt: skip
    assert r.status_code == 202, r.text
    view = wait_for(
        lambda: (
            (v := group(platform, "bob", token))
            and sorted(w["state"] for w in v["workers"]) == ["ready", "ready", "ready", "waiting"]
            and v
        ),
        "three workers ready and one waiting",
        120,
        step=0.3,
    )
    [waiting] = [w for w in view["workers"] if w["state"] == "waiting"]
    assert waiting["reason"]
    assert len(live_pods(cluster, "worker")) == 3
    billed = [s for s in platform.sessions("bob") if s["worker"]]
    assert len(billed) == 3  # nothing is billed while waiting

    r = requests.delete(workers_url(platform, "bob"), headers=auth(token), timeout=30)
    assert r.status_code == 202, r.text
    wait_for(
        lambda: not live_pods(cluster, "worker"), "worker pods left after the stop", 60, step=0.3
    )
    wait_for(
        lambda: group(platform, "bob", token)["count"] == 0, "the group did not end", 60, step=0.3
    )
    billed = [s for s in platform.sessions("bob") if s["worker"]]
    assert len(billed) == 3 and all(s["state"] == "ended" for s in billed), billed
    platform.stop_server("bob")


def test_the_garbage_collector_deletes_the_group_with_the_servers_pod(platform, cluster):
    """The server's pod deleted by someone else (an operator, a drained node): the cluster
    itself deletes what it owns, the group's pods and its NetworkPolicy, and billing closes
    the workers' sessions."""
    platform.create_user("cy")
    token = platform.user_token("cy")
    r = platform.spawn("cy", A100)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("cy")
    server = pod_of(cluster, "cy")
    name = server["metadata"]["name"]
    r = requests.post(workers_url(platform, "cy"), json={"count": 1}, headers=auth(token),
                      timeout=30)  # fmt: skip
    assert r.status_code == 202, r.text
    wait_for(
        lambda: [w["state"] for w in group(platform, "cy", token)["workers"]] == ["ready"],
        "the worker did not become ready",
        120,
        step=0.3,
    )

    # (the raw response: the client's model refuses the float cpu request KubeSpawner sent)
    kube_api(cluster).delete_namespaced_pod(name, "gputap", _preload_content=False)
    networking = kubernetes.client.NetworkingV1Api(kube_api(cluster).api_client)
    wait_for(
        lambda: (
            not [p for p in cluster.pods("gputap") if p["metadata"]["name"] == f"{name}-w1"]
            and not networking.list_namespaced_network_policy(
                "gputap", label_selector=f"gputap.io/group={name}"
            ).items
        ),
        "the worker's pod or the group's policy outlived the server's pod",
        60,
        step=0.3,
    )
    wait_for(
        lambda: all(s["state"] == "ended" for s in platform.sessions("cy")),
        "a session of the group stayed open",
        60,
        step=0.3,
    )
