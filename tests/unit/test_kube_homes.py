"""Keeping a user's servers beside their ReadWriteOnce home (spawner.kube.homes) and the view
of what is free on that node only (FreeView.free_only_on)."""

from spawner.core.placement import FreeView
from spawner.kube.homes import (
    SELECTED_NODE,
    HomeHolder,
    attaches_to_one_node,
    claim_zone,
    home_holder,
    home_note,
    zone_note,
)


def pod(name, node="gpu-a", phase="Running", claim="home-ada", namespace="gputap", server="x"):
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": {"gputap.io/server": server}},
        "spec": {
            "nodeName": node,
            "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": claim}}],
        },
        "status": {"phase": phase},
    }


def test_the_holder_is_another_bound_unfinished_pod_with_the_claim():
    pods = [
        pod("jupyter-ada", server="default"),  # the spawning server's own pod
        pod("jupyter-ada-done", phase="Succeeded"),
        pod("jupyter-ada-pending", node=None),
        pod("jupyter-bob", claim="home-bob"),
        pod("jupyter-ada-other-ns", namespace="elsewhere"),
        pod("jupyter-ada-2", node="gpu-b", phase="Pending", server="second"),
    ]
    assert home_holder(pods, "gputap", "home-ada", "jupyter-ada") == HomeHolder("gpu-b", "second")
    assert home_holder(pods[:5], "gputap", "home-ada", "jupyter-ada") is None


def test_only_shared_file_systems_attach_to_many_nodes():
    assert attaches_to_one_node(["ReadWriteOnce"])
    assert attaches_to_one_node(["ReadWriteOncePod"])
    assert not attaches_to_one_node(["ReadWriteMany"])
    assert not attaches_to_one_node(["ReadWriteOnce", "ReadOnlyMany"])


def test_the_refusal_names_the_node_and_the_server():
    note = home_note(HomeHolder("gpu-b", "second"))
    assert 'node gpu-b, where your server "second" runs' in note and "stop it" in note


def test_a_claims_zone_is_its_selected_nodes():
    zones = {"gpu-a": "zone-a", "gpu-b": "zone-b"}
    assert claim_zone({SELECTED_NODE: "gpu-b"}, zones) == "zone-b"
    assert claim_zone({SELECTED_NODE: "gone"}, zones) is None  # a node no longer known
    assert claim_zone({}, zones) is None  # bound at once (Immediate) or not yet bound
    assert "zone zone-b" in zone_note("zone-b")


def test_free_only_on_keeps_capacity_and_frees_one_node():
    view = FreeView()
    view.set("A100-80GB", "gpu-a", 3, 8)
    view.set("A100-80GB", "gpu-b", 8, 8)
    view.set("L40S", "gpu-c", 4, 4)
    only = view.free_only_on({"gpu-a"})
    assert (only.free("A100-80GB"), only.total("A100-80GB")) == (3, 16)
    assert (only.free("L40S"), only.total("L40S")) == (0, 4)  # exists, but not there
    assert dict(only.free_on("A100-80GB")) == {"gpu-a": 3, "gpu-b": 0}
    assert view.free("A100-80GB") == 11  # the original is untouched
