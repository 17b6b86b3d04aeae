"""A home in one zone (docs/kubernetes.md, "Storage"): the default class binds a volume where
the first server lands, and a zonal volume only reaches nodes of its zone, so later servers
are placed in the home's zone."""

import pytest

from tests.kube.conftest import gputap_cluster
from tests.kube.test_kube_spawn import pod_of
from tests.kube_sim.node_shapes import gpu_node_spec
from tests.kube_sim.storage import ZONE_LABEL


@pytest.fixture(scope="module")
def cluster(chart_rbac):
    with gputap_cluster(chart_rbac, seed=7) as c:
        a100 = gpu_node_spec("gpu-a100", gpus=8, cpu="128", memory="2Ti")
        l40s = gpu_node_spec("gpu-l40s", product="NVIDIA-L40S", gpus=4, memory_mib=46068)
        for spec, zone in ((a100, "zone-a"), (l40s, "zone-b")):
            spec["labels"][ZONE_LABEL] = zone
            c.add_node(**spec)
        yield c


def test_servers_are_placed_in_the_zone_of_their_home(platform, cluster):
    platform.create_user("zed")
    r = platform.spawn("zed", {"kind": "card", "card": "L40S", "count": 1})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("zed")
    assert pod_of(cluster, "zed")["spec"]["nodeName"] == "gpu-l40s"
    platform.stop_server("zed")
    # the home was made in zone-b, where the first server ran; A100s are only in zone-a
    r = platform.spawn("zed", {"kind": "card", "card": "A100-80GB", "count": 1})
    assert r.status_code == 409, r.text + platform.log_tail(60)
    message = r.json()["message"]
    assert "No A100-80GB" in message and "zone zone-b" in message, message
    # what the home's zone has still starts there
    r = platform.spawn("zed", {"kind": "card", "card": "L40S", "count": 2})
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("zed")
    assert pod_of(cluster, "zed")["spec"]["nodeName"] == "gpu-l40s"
    platform.stop_server("zed")
