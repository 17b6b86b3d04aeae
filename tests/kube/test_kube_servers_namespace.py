"""Servers in a namespace of their own (`spawner.kubernetes.namespace`), as operators keep
users' pods apart from the hub's: the chart's RBAC grants the hub and billing what they do
there, the hub's ServiceAccount staying in the release's namespace. (z2jh's Role `hub`, which
the chart once relied on for KubeSpawner's requests, lives in the release's namespace only:
the hub was refused the user's home.)"""

import pytest

from tests.kube.conftest import (
    NAMESPACE,
    gputap_cluster,
    kube_api,
    kube_platform,
    rendered_rbac,
)
from tests.kube.test_kube_spawn import reach

SERVERS = "gpu-servers"
SLICE = {"kind": "slice", "card": "H100-80GB", "profile": "1g.10gb"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    values = {
        "jupyterhub": {"custom": {"gputap": {"spawner": {"kubernetes": {"namespace": SERVERS}}}}}
    }
    rbac = rendered_rbac(tmp_path_factory.mktemp("chart"), values)
    with gputap_cluster(rbac, namespaces=(SERVERS,), seed=11) as c:
        c.gpu_node("gpu-h100", product="NVIDIA-H100-80GB-HBM3", gpus=1, mig="all-1g.10gb")
        yield c


@pytest.fixture(scope="module")
def platform(cluster, tmp_path_factory):
    p = kube_platform(cluster, tmp_path_factory.mktemp("kube-servers-namespace"), namespace=SERVERS)
    p.start()
    yield p
    p.shutdown()


def test_a_server_runs_and_is_billed_in_the_servers_namespace(platform, cluster):
    platform.create_user("tove")
    r = platform.spawn("tove", SLICE)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("tove")
    reach(platform, "tove")
    (pod,) = [
        p
        for p in cluster.pods(SERVERS)
        if p["metadata"]["labels"].get("hub.jupyter.org/username") == "tove"
    ]
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == "1"
    home = kube_api(cluster).read_namespaced_persistent_volume_claim("home-tove", SERVERS)
    assert home.status.phase == "Bound"
    platform.stop_server("tove")
    (session,) = platform.sessions("tove")
    assert session["state"] == "ended" and session["sku"] == "H100-80GB/1g.10gb"
    assert not cluster.pods(NAMESPACE)
