"""GPUKubeSpawner on the NVIDIA node shapes real clusters have (tests/kube_sim/cluster.py):
MIG single strategy, time-slicing without renameByDefault, NotReady and unreachable nodes,
a node tainted by another controller, a GPU marked unhealthy, a small cloud GPU node, and an
untainted GPU node where CPU-only servers land."""

import pytest

from tests.integration.test_form import row
from tests.kube.conftest import gputap_cluster
from tests.kube.test_kube_spawn import pod_of
from tests.kube_sim.node_shapes import gpu_node_spec
from tests.kube_sim.scheduler import parse_quantity


@pytest.fixture(scope="module")
def cluster(chart_rbac):
    with gputap_cluster(chart_rbac, seed=3) as c:
        # 8 H100s split all-1g.10gb under the single strategy: 56 slices as nvidia.com/gpu
        c.gpu_node("h100-single", product="NVIDIA-H100-80GB-HBM3", mig="all-1g.10gb",
                   mig_strategy="single", cpu="128", memory="2Ti")  # fmt: skip
        # a T4 time-sliced 4 ways without renameByDefault: nvidia.com/gpu 4, "-SHARED" product
        c.cloud_node("t4-shared", "g4dn.xlarge", replicas=4, rename_by_default=False)
        # 4 A10Gs, one of them unhealthy (XID 79): 3 allocatable
        c.cloud_node("a10g", "g5.12xlarge", unhealthy=1)
        c.gpu_node("l40s-down", product="NVIDIA-L40S", gpus=4, memory_mib=46068, ready="False")
        c.cloud_node("a100-gone", "Standard_NC24ads_A100_v4", ready="Unknown")
        # one L4 with 4 vCPUs and 16 GiB, less after GKE's reservations
        c.cloud_node("l4-small", "g2-standard-4")
        # a GPU node without the nvidia.com/gpu taint (EKS's GPU AMIs, for one, set none):
        # CPU-only servers land here
        labels = gpu_node_spec("x", product="NVIDIA-A10", gpus=2, memory_mib=23028)["labels"]
        c.add_node("a10-untainted", labels=labels,
                   allocatable={"nvidia.com/gpu": "2", "cpu": "32", "memory": "128Gi"})  # fmt: skip
        # two A40s on a node the cluster autoscaler is about to take away (tainted in the test)
        c.gpu_node("a40-leaving", product="NVIDIA-A40", gpus=2, memory_mib=46068, cpu="32",
                   memory="256Gi")  # fmt: skip
        yield c


def form(platform, user):
    platform.create_user(user)
    return platform.login(user).get(f"{platform.url}/hub/spawn", timeout=30).content.decode()


def test_mig_single_strategy_slices_are_sold_as_slices(platform, cluster):
    page = form(platform, "ada")
    assert "56 of 56 free" in row(page, "H100-80GB/1g.10gb")
    assert 'data-key="H100-80GB"' not in page  # no whole H100 is free: all are split
    r = platform.spawn("ada", {"kind": "slice", "card": "H100-80GB", "profile": "1g.10gb"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("ada")
    pod = pod_of(cluster, "ada")
    spec = pod["spec"]
    assert spec["nodeName"] == "h100-single"
    resources = spec["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == "1"
    assert resources["requests"]["nvidia.com/gpu"] == "1"
    assert spec["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
    assert pod["metadata"]["labels"]["gputap.io/slice"] == "1g.10gb"
    assert pod["metadata"]["annotations"]["gputap.io/offering"] == "H100-80GB/1g.10gb"
    r = platform.spawn("ada", {"kind": "card", "card": "H100-80GB"}, server_name="whole")
    assert r.status_code == 400, r.text
    platform.stop_server("ada")


def test_time_slicing_without_rename_is_the_shared_offering(platform, cluster):
    page = form(platform, "bea")
    shared = row(page, "T4/shared")
    assert "T4 shared (time-sliced)" in shared and "4 of 4 free" in shared
    r = platform.spawn("bea", {"kind": "shared", "card": "T4"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("bea")
    pod = pod_of(cluster, "bea")
    assert pod["spec"]["nodeName"] == "t4-shared"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    assert pod["metadata"]["labels"]["gputap.io/slice"] == "shared"
    r = platform.spawn("bea", {"kind": "card", "card": "T4"}, server_name="whole")
    assert r.status_code == 400, r.text  # a share is not a whole T4
    platform.stop_server("bea")


def test_not_ready_and_unreachable_nodes_offer_nothing(platform, cluster):
    page = form(platform, "cy")
    assert 'data-key="L40S"' not in page and 'data-key="A100-80GB"' not in page
    for card in ("L40S", "A100-80GB"):
        r = platform.spawn("cy", {"kind": "card", "card": card})
        assert r.status_code == 400, r.text
        assert card in r.json()["message"]
    assert not [p for p in cluster.pods("gputap") if p["spec"].get("nodeName") is None]
    # the node comes back: its GPUs are offered again
    cluster.set_ready("l40s-down", "True")
    r = platform.spawn("cy", {"kind": "card", "card": "L40S"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("cy")
    assert pod_of(cluster, "cy")["spec"]["nodeName"] == "l40s-down"
    platform.stop_server("cy")


def test_a_node_tainted_by_another_controller_offers_nothing(platform, cluster):
    """The cluster autoscaler taints a node it is about to remove; kube-scheduler keeps new
    pods off it (no gputap pod tolerates the taint), so its GPUs are neither offered nor
    chosen: a refusal now, not a pod Pending until the start timeout."""
    session = platform.login("gus")

    def a40() -> str | None:
        page = session.get(f"{platform.url}/hub/spawn", timeout=30).content.decode()
        return row(page, "A40") if 'data-key="A40"' in page else None

    assert "2 of 2 free" in a40()
    cluster.taint("a40-leaving", "ToBeDeletedByClusterAutoscaler", "NoSchedule", "1765000000")
    platform.wait_for(lambda: a40() is None, "the tainted node's A40s withdrawn", timeout=20)
    r = platform.spawn("gus", {"kind": "card", "card": "A40"})
    assert r.status_code == 400, r.text
    assert "A40" in r.json()["message"]
    assert not [p for p in cluster.pods("gputap") if p["spec"].get("nodeName") is None]
    # the autoscaler changes its mind: the node is offered again
    cluster.untaint("a40-leaving", "ToBeDeletedByClusterAutoscaler")
    platform.wait_for(lambda: a40() is not None, "the A40s offered again", timeout=20)
    r = platform.spawn("gus", {"kind": "card", "card": "A40"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("gus")
    assert pod_of(cluster, "gus")["spec"]["nodeName"] == "a40-leaving"
    platform.stop_server("gus")


def test_an_unhealthy_gpu_is_not_counted(platform, cluster):
    assert "3 of 3 free" in row(form(platform, "dee"), "A10G")
    r = platform.spawn("dee", {"kind": "card", "card": "A10G", "count": 4})
    assert r.status_code == 400, r.text


def test_a_cpu_server_asks_for_cpu_and_memory_and_sees_no_gpu(platform, cluster):
    platform.create_user("eve")
    r = platform.spawn("eve", {"kind": "cpu"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("eve")
    pod = pod_of(cluster, "eve")
    assert pod["spec"]["nodeName"] == "a10-untainted"
    container = pod["spec"]["containers"][0]
    # requests, so the scheduler counts them (the catalog's cpu: 2 cores, 4 GB)
    requests = container["resources"]["requests"]
    assert parse_quantity(requests["cpu"]) == 2 and requests["memory"] == "4G"
    assert pod["status"]["qosClass"] != "BestEffort"
    # the single-user image (FROM nvidia/cuda) sets NVIDIA_VISIBLE_DEVICES=all
    assert cluster.visible_gpus("gputap", pod["metadata"]["name"]) == []
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    platform.stop_server("eve")


def test_a_gpu_on_a_small_cloud_node_gets_what_the_node_has(platform, cluster):
    platform.create_user("fay")
    r = platform.spawn("fay", {"kind": "card", "card": "L4"})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("fay")
    pod = pod_of(cluster, "fay")
    assert pod["spec"]["nodeName"] == "l4-small"
    # the catalog's L4 guarantees (4 cores, 32 GB) cut to the node's 3920m and 13621Mi
    requests = pod["spec"]["containers"][0]["resources"]["requests"]
    assert parse_quantity(requests["cpu"]) <= parse_quantity("3920m")
    assert parse_quantity(requests["memory"]) <= parse_quantity("13621Mi")
    assert parse_quantity(requests["cpu"]) >= 3 and parse_quantity(requests["memory"]) > 13 * 10**9
    platform.stop_server("fay")
