"""Environments on the Kubernetes backend, the real hub and proxy on the simulated cluster: the
pod's image is the environment's (the configured one for gputap's own), a free-text image
only where the operator's pattern allows it, and billing records what ran."""

import pytest

from tests.kube.conftest import gputap_cluster, kube_platform
from tests.kube.test_kube_spawn import pod_of, started_pod

TORCH_IMAGE = "quay.io/acme/torch:2.13-cuda12.8"
ENVIRONMENTS = {
    "torch": {
        "name": "PyTorch 2.13",
        "image": TORCH_IMAGE,
        "python": "/opt/envs/torch",  # one machine's, not looked for here
        "needs": {"gpu": True, "min_gpu_memory_gb": 40},
    }
}
PATTERN = r"^ghcr\.io/acme/[a-z0-9._/-]+:[A-Za-z0-9._-]+$"


@pytest.fixture(scope="module")
def cluster(chart_rbac):
    images = ("quay.io/acme/torch", "ghcr.io/acme/lab")
    with gputap_cluster(chart_rbac, seed=16, images=images) as c:
        c.gpu_node("gpu-a100", product="NVIDIA-A100-SXM4-80GB", gpus=2, cpu="32", memory="256Gi")
        c.add_node("cpu-1")  # untainted: where CPU servers go
        yield c


@pytest.fixture(scope="module")
def platform(cluster, tmp_path_factory):
    p = kube_platform(
        cluster,
        tmp_path_factory.mktemp("kube-environments"),
        kubernetes={"image_pattern": PATTERN},
        environments=ENVIRONMENTS,
    )
    p.start()
    yield p
    p.shutdown()


def server_container(pod: dict) -> dict:
    [container] = [c for c in pod["spec"]["containers"] if c["name"] == "notebook"]
    return container


def test_the_pod_runs_the_environments_image(platform, cluster):
    options = {"kind": "card", "card": "A100-80GB", "environment": "torch"}
    pod = started_pod(platform, cluster, "ada", options)
    container = server_container(pod)
    assert container["image"] == TORCH_IMAGE
    # billing's pod meter reads it there, should it open the session itself
    assert pod["metadata"]["annotations"]["gputap.io/environment"] == "torch"
    assert {"name": "GPUTAP_ENVIRONMENT", "value": "torch"} in container["env"]
    [session] = platform.account("ada")["running"]
    assert session["environment"] == "torch"
    platform.stop_server("ada")

    # gputap's own environment: the configured single-user image
    r = platform.spawn("ada", {"kind": "cpu"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("ada")
    container = server_container(pod_of(cluster, "ada"))
    assert container["image"] == "gputap/singleuser:latest"
    assert {"name": "GPUTAP_ENVIRONMENT", "value": "gputap"} in container["env"]
    platform.stop_server("ada")


def test_a_free_text_image_runs_where_the_pattern_allows_it(platform, cluster):
    platform.create_user("bob")
    image = "ghcr.io/acme/lab:1.4"
    r = platform.spawn("bob", {"kind": "cpu", "image": image})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("bob")
    assert server_container(pod_of(cluster, "bob"))["image"] == image
    [session] = platform.account("bob")["running"]
    assert session["environment"] == f"image:{image}"
    platform.stop_server("bob")


@pytest.mark.parametrize(
    "options, message",
    [
        ({"kind": "cpu", "image": "docker.io/evil/miner:1"}, "is not allowed here: it must match"),
        ({"kind": "cpu", "image": "ghcr.io/acme/lab:1.4\n"}, "is not allowed here: it must match"),
        ({"kind": "cpu", "environment": "torch"}, "environment torch needs a GPU"),
        (
            {"kind": "cpu", "environment": "tensorflow"},
            "is not an environment here; you may use: gputap, torch",
        ),
    ],
)
def test_what_may_not_run_is_a_400_and_no_pod(platform, cluster, options, message):
    platform.create_user("eve")
    r = platform.spawn("eve", options)
    assert r.status_code == 400, r.text
    assert message in r.json()["message"]
    assert platform.server("eve") is None
    assert [
        p
        for p in cluster.pods("gputap")
        if p["metadata"].get("labels", {}).get("hub.jupyter.org/username") == "eve"
    ] == []
