"""Worker groups, pure (spawner/core/workers.py), and a worker's pod and its group's
NetworkPolicy (spawner/kube/worker_objects.py)."""

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from tornado import web

from spawner.core.catalog import Catalog
from spawner.core.placement import CardRequest, CpuRequest, RequestError, SliceRequest, SpecRequest
from spawner.core.record import ServerRecord
from spawner.core.workers import READY, Worker, parse_worker_request
from spawner.kube.worker_objects import group_network_policy, hub_peer, worker_pod
from spawner.kube.workers import KubeWorkers
from spawner.local.workers import agent_program, ended_how, worker_host

CATALOG = Catalog.load()
A100 = CATALOG.offering("A100-80GB")
SLICE = CATALOG.offering("A100-80GB/1g.10gb")


def parse(body, offering=A100, count=2, most=8):
    return parse_worker_request(body, offering, count, CATALOG, most)


def test_workers_get_the_servers_card_and_gpus_unless_told():
    assert parse({"count": 3}).request == CardRequest("A100-80GB", 2)
    assert parse({"count": 3, "gpus": 1}).request == CardRequest("A100-80GB", 1)
    assert parse({"count": 1}, SLICE, 1).request == SliceRequest("A100-80GB", "1g.10gb")
    assert parse({"count": 1}, CATALOG.offering("cpu"), 1).request == CpuRequest()
    other = parse({"count": 2, "options": {"kind": "spec", "min_memory_gb": 40}, "queue": True})
    assert other.request == SpecRequest(min_memory_gb=40) and other.queue and other.count == 2


@pytest.mark.parametrize(
    "body, offering, message",
    [
        ({}, A100, "count is missing: how many workers (1 to 8)"),
        ({"count": 0}, A100, "count must be 1 to 8 (workers in the group), not 0"),
        ({"count": 9}, A100, "count must be 1 to 8 (workers in the group), not 9"),
        ({"count": "2"}, A100, "count must be a whole number (workers in the group), not '2'"),
        ({"count": True}, A100, "count must be a whole number"),
        ({"count": 1, "gpus": 0}, A100, "gpus must be 1 to 64 (GPUs per worker), not 0"),
        ({"count": 1, "queue": "yes"}, A100, "queue must be true or false, not 'yes'"),
        ({"count": 1, "options": []}, A100, "options must be a spawn's options"),
        ({"count": 1, "options": {"kind": "card", "card": "T4", "count": 2}, "gpus": 3}, A100,
         "gpus (3) and the options' count (2) disagree"),
        ({"count": 1, "options": {"kind": "card", "card": "Nope"}}, A100, "Nope"),
        ({"count": 1, "gpus": 2}, SLICE, "a worker of A100-80GB 1g.10gb slice has one of it"),
    ],
)  # fmt: skip
def test_a_bad_request_says_what_is_allowed(body, offering, message):
    with pytest.raises(RequestError) as e:
        parse(body, offering, 1)
    assert message in str(e.value)


def test_a_long_value_is_not_echoed_in_full():
    with pytest.raises(RequestError) as e:
        parse({"count": "x" * 5000})
    assert len(str(e.value)) < 200


def test_a_worker_survives_the_saved_state():
    record = ServerRecord("s-1", "A100-80GB", 2, course="intro", worker="w2", devices=("GPU-a",))
    at = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    worker = Worker(2, READY, "", record, "A100-80GB", "127.0.0.3", 4100, {"pid": 42}, at)
    again = Worker.from_state(worker.to_state())
    assert again.to_state() == worker.to_state()
    assert again.record == record and again.name == "w2" and again.handle == {"pid": 42}


def test_one_machine_names_ports_and_ends():
    assert worker_host(1) == "127.0.0.2" and worker_host(9) == "127.0.0.10"
    with pytest.raises(ValueError):
        worker_host(0)
    assert ended_how(0) == "exited" and ended_how(3) == "exited with code 3"
    assert ended_how(-9) == "was killed (signal 9)" and ended_how(137) == "was killed (signal 9)"


def test_the_agent_is_the_environments_own(tmp_path):
    env = tmp_path / "env" / "bin"
    env.mkdir(parents=True)
    (env / "jupyterhub-singleuser").write_text("#!/bin/sh\n")
    (env / "jupyterhub-singleuser").chmod(0o755)
    assert agent_program(str(tmp_path / "env"), []) == str(env / "gputap-worker")
    cmd = ["/usr/bin/python3", "-m", "x", "/opt/v/bin/jupyterhub-singleuser"]
    assert agent_program("", cmd) == "/opt/v/bin/gputap-worker"


SERVER_POD = {
    "metadata": {
        "name": "jupyter-alice",
        "namespace": "gputap",
        "uid": "0b7c-uid",
        "labels": {"gputap.io/user": "alice", "gputap.io/server": "default", "component": "x"},
    },
    "spec": {
        "containers": [
            {
                "name": "notebook",
                "image": "acme/torch:2",
                "env": [
                    {"name": "JUPYTERHUB_API_TOKEN", "value": "secret"},
                    {"name": "JPY_API_TOKEN", "value": "secret"},
                    {"name": "HF_HOME", "value": "/home/jovyan/.cache/hf"},
                ],
                "volumeMounts": [{"name": "home", "mountPath": "/home/jovyan"}],
                "workingDir": "/home/jovyan",
                "securityContext": {"runAsUser": 1000},
            }
        ],
        "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": "home-alice"}}],
        "securityContext": {"fsGroup": 100, "fsGroupChangePolicy": "OnRootMismatch"},
        "priorityClassName": "gputap-on-demand",
        "runtimeClassName": "nvidia",
        # z2jh's singleuser.cloudMetadata.blockWithIptables
        "initContainers": [{"name": "block-cloud-metadata", "image": "k8s-network-tools"}],
    },
}


def test_a_worker_pod_is_its_servers_with_its_own_gpus_and_no_hub_token():
    settings = {
        "extra_labels": {"gputap.io/user": "alice", "gputap.io/count": "1"},
        "extra_annotations": {"gputap.io/session": "s-9", "gputap.io/offering": "A100-80GB"},
        "extra_resource_limits": {"nvidia.com/gpu": "1"},
        "extra_resource_guarantees": {"nvidia.com/gpu": "1"},
        "node_selector": {"kubernetes.io/hostname": "gpu-a100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "cpu_guarantee": 8.0,
        "mem_guarantee": "64G",
        "mem_limit": "64G",
    }
    pod = worker_pod(
        SERVER_POD, settings, worker="w1", token="t" * 32, offering="A100-80GB", count=1
    )
    assert pod["spec"]["initContainers"] == SERVER_POD["spec"]["initContainers"]
    assert pod["metadata"] == {
        "name": "jupyter-alice-w1",
        "namespace": "gputap",
        "labels": {
            "gputap.io/user": "alice",
            "gputap.io/count": "1",
            "gputap.io/server": "default",
            "gputap.io/group": "jupyter-alice",
            "gputap.io/worker": "w1",
            "gputap.io/role": "worker",
            "app.kubernetes.io/managed-by": "gputap",
        },
        "annotations": {
            "gputap.io/session": "s-9",
            "gputap.io/offering": "A100-80GB",
            "gputap.io/worker": "w1",
        },
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "jupyter-alice", "uid": "0b7c-uid"}
        ],
    }
    [container] = pod["spec"]["containers"]
    assert container["image"] == "acme/torch:2" and container["name"] == "worker"
    assert container["command"] == ["gputap-worker"]
    assert container["args"] == ["--host", "0.0.0.0", "--port", "8790", "--name", "w1"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert "JUPYTERHUB_API_TOKEN" not in env and "JPY_API_TOKEN" not in env
    assert env["HF_HOME"] == "/home/jovyan/.cache/hf" and env["GPUTAP_WORKER_TOKEN"] == "t" * 32
    assert env["GPUTAP_GPU_COUNT"] == "1" and env["GPUTAP_WORKER_NAME"] == "w1"
    assert container["resources"] == {
        "requests": {"nvidia.com/gpu": "1", "cpu": "8.0", "memory": "64G"},
        "limits": {"nvidia.com/gpu": "1", "memory": "64G"},
    }
    assert container["volumeMounts"] == [{"name": "home", "mountPath": "/home/jovyan"}]
    assert container["workingDir"] == "/home/jovyan"
    spec = pod["spec"]
    assert spec["volumes"] == SERVER_POD["spec"]["volumes"]
    assert spec["securityContext"] == {"fsGroup": 100, "fsGroupChangePolicy": "OnRootMismatch"}
    assert spec["priorityClassName"] == "gputap-on-demand"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["restartPolicy"] == "Never" and spec["automountServiceAccountToken"] is False
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "gpu-a100"}


def test_a_worker_pod_needs_the_token():
    with pytest.raises(ValueError):
        worker_pod(SERVER_POD, {}, worker="w1", token="", offering="cpu", count=1)


def test_the_group_policy_opens_the_group_to_itself_and_the_agents_to_the_hub():
    hub = hub_peer("gputap", "jhub")
    assert hub == {
        "podSelector": {"matchLabels": {"component": "hub", "release": "gputap"}},
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "jhub"}},
    }
    policy = group_network_policy(SERVER_POD, hub)
    members = {"podSelector": {"matchLabels": {"gputap.io/user": "alice",
                                               "gputap.io/server": "default"}}}  # fmt: skip
    assert policy["metadata"]["name"] == "jupyter-alice-group-0b7c-uid"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "0b7c-uid"
    assert policy["spec"] == {
        "podSelector": members["podSelector"],
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [
            {"from": [members]},
            {
                "from": [hub],
                "ports": [{"protocol": "TCP", "port": 8790}],
            },
        ],
        "egress": [{"to": [members]}],
    }


def test_a_home_that_attaches_to_one_node_refuses_workers_saying_what_would_do():
    """Kubernetes: workers on other nodes mount the server's home; a ReadWriteOnce claim
    attaches to one node at a time, so the request is refused before anything is placed."""
    backend = KubeWorkers(SimpleNamespace(storage_access_modes=["ReadWriteOnce"]))
    with pytest.raises(web.HTTPError) as refused:
        asyncio.run(backend.views(CardRequest("A100-80GB", 1)))
    assert refused.value.status_code == 409
    assert "ReadWriteOnce" in refused.value.log_message
    assert "home_access_mode: ReadWriteMany" in refused.value.log_message
