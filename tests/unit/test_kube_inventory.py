from spawner.core.catalog import Catalog
from spawner.kube.inventory import (
    ClusterInventory,
    host_requests,
    node_gpus,
    parse_quantity,
    pod_requests,
    takes_pods,
    tolerates,
)

CATALOG = Catalog.load()


def node(name, product, allocatable, unschedulable=False):
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
        "spec": {"unschedulable": unschedulable},
        "status": {"allocatable": {"cpu": "64", **allocatable}},
    }


def pod(uid, node_name, limits, phase="Running"):
    return {
        "metadata": {"name": uid, "uid": uid},
        "spec": {"nodeName": node_name, "containers": [{"resources": {"limits": limits}}]},
        "status": {"phase": phase},
    }


def cluster():
    inv = ClusterInventory(CATALOG)
    inv.apply_node("ADDED", node("gpu-a100", "NVIDIA-A100-SXM4-80GB", {"nvidia.com/gpu": "8"}))
    inv.apply_node(
        "ADDED", node("gpu-h100", "NVIDIA-H100-80GB-HBM3", {"nvidia.com/mig-1g.10gb": "56"})
    )
    inv.apply_node("ADDED", node("gpu-l40s", "NVIDIA-L40S", {"nvidia.com/gpu": "4"}))
    return inv


def test_nodes_offer_cards_and_slices_from_gfd_labels():
    view = cluster().view
    assert sorted(view.keys()) == ["A100-80GB", "H100-80GB/1g.10gb", "L40S"]
    assert (view.free("A100-80GB"), view.total("H100-80GB/1g.10gb")) == (8, 56)


def test_free_is_allocatable_minus_bound_non_terminal_pods():
    inv = cluster()
    inv.apply_pod("ADDED", pod("p1", "gpu-a100", {"nvidia.com/gpu": "2"}))
    inv.apply_pod("ADDED", pod("p2", None, {"nvidia.com/gpu": "4"}))  # pending: holds nothing
    inv.apply_pod("ADDED", pod("p3", "gpu-h100", {"nvidia.com/mig-1g.10gb": 1}))
    assert inv.view.free("A100-80GB") == 6
    assert inv.view.free("H100-80GB/1g.10gb") == 55
    # the same event twice changes nothing
    inv.apply_pod("MODIFIED", pod("p1", "gpu-a100", {"nvidia.com/gpu": "2"}))
    assert inv.view.free("A100-80GB") == 6
    inv.apply_pod("MODIFIED", pod("p1", "gpu-a100", {"nvidia.com/gpu": "2"}, phase="Succeeded"))
    assert inv.view.free("A100-80GB") == 8
    inv.apply_pod("DELETED", pod("p3", "gpu-h100", {"nvidia.com/mig-1g.10gb": 1}))
    assert inv.view.free("H100-80GB/1g.10gb") == 56


def test_cordoned_and_deleted_nodes_offer_nothing():
    inv = cluster()
    inv.apply_node(
        "MODIFIED", node("gpu-l40s", "NVIDIA-L40S", {"nvidia.com/gpu": "4"}, unschedulable=True)
    )
    assert inv.view.total("L40S") == 0
    inv.apply_node("DELETED", node("gpu-a100", "NVIDIA-A100-SXM4-80GB", {}))
    assert "A100-80GB" not in inv.view.keys()


def test_unknown_cards_and_profiles_are_not_offered():
    inv = ClusterInventory(CATALOG)
    inv.apply_node("ADDED", node("x", "Matrox-G200", {"nvidia.com/gpu": "1"}))
    inv.apply_node("ADDED", node("y", "NVIDIA-A100-SXM4-80GB", {"nvidia.com/mig-9g.99gb": "1"}))
    assert inv.view.keys() == []


def test_pod_requests_take_limits_then_requests():
    p = {
        "spec": {
            "containers": [
                {"resources": {"limits": {"nvidia.com/gpu": "1"}}},
                {"resources": {"requests": {"nvidia.com/mig-1g.10gb": "2", "cpu": "4"}}},
            ]
        }
    }
    assert pod_requests(p) == {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 2}


def test_a_reservation_holds_units_until_its_pod_is_seen_bound():
    inv = cluster()
    inv.reserve("alice/", "A100-80GB", "gpu-a100", 2)
    assert inv.view.free("A100-80GB") == 6
    pending = pod("p1", None, {"nvidia.com/gpu": "2"}, phase="Pending")
    pending["metadata"]["annotations"] = {"gputap.io/reservation": "alice/"}
    inv.apply_pod("ADDED", pending)
    assert inv.view.free("A100-80GB") == 6  # still reserved, not counted twice
    bound = pod("p1", "gpu-a100", {"nvidia.com/gpu": "2"})
    bound["metadata"]["annotations"] = {"gputap.io/reservation": "alice/"}
    inv.apply_pod("MODIFIED", bound)
    assert inv.view.free("A100-80GB") == 6  # now the pod holds them, not the reservation
    inv.apply_pod("DELETED", bound)
    assert inv.view.free("A100-80GB") == 8
    inv.reserve("bob/", "L40S", "gpu-l40s", 1)
    inv.release("bob/")
    assert inv.view.free("L40S") == 4


def test_on_demand_servers_may_take_what_spot_servers_hold():
    inv = cluster()
    spot = pod("s1", "gpu-l40s", {"nvidia.com/gpu": "4"})
    spot["metadata"]["labels"] = {"gputap.io/price-class": "spot"}
    inv.apply_pod("ADDED", spot)
    assert inv.view.free("L40S") == 0
    assert inv.preemptible_view.free("L40S") == 4
    inv.apply_pod("ADDED", pod("o1", "gpu-a100", {"nvidia.com/gpu": "8"}))
    assert inv.preemptible_view.free("A100-80GB") == 0  # on-demand is never preempted
    inv.apply_pod("DELETED", spot)
    assert inv.view.free("L40S") == inv.preemptible_view.free("L40S") == 4


def test_time_sliced_gpus_are_offered_as_shared():
    inv = ClusterInventory(CATALOG)
    inv.apply_node("ADDED", node("ts", "Tesla-T4", {"nvidia.com/gpu.shared": "16"}))
    shared = pod("p", "ts", {"nvidia.com/gpu.shared": "1"})
    inv.apply_pod("ADDED", shared)
    assert (inv.view.free("T4/shared"), inv.view.total("T4/shared")) == (15, 16)


def test_every_device_plugin_shape_is_sold_as_what_it_is():
    """Each shape as tests/kube_sim's gpu_node_spec builds it, the same node objects."""
    from tests.kube_sim.node_shapes import gpu_node_spec

    def offered(**kwargs):
        spec = gpu_node_spec("n", **kwargs)
        obj = {
            "metadata": {"name": "n", "labels": spec["labels"]},
            "spec": {"taints": spec["taints"]},
            "status": {"allocatable": spec["allocatable"], "capacity": spec["capacity"]},
        }
        return node_gpus(obj, CATALOG).resources

    assert offered(mig="all-1g.10gb", mig_strategy="single") == {
        "A100-80GB/1g.10gb": ("nvidia.com/gpu", 56)
    }
    assert offered(mig="all-3g.40gb") == {"A100-80GB/3g.40gb": ("nvidia.com/mig-3g.40gb", 16)}
    t4 = {"product": "Tesla-T4", "gpus": 2, "memory_mib": 15360, "replicas": 4}
    assert offered(**t4) == {"T4/shared": ("nvidia.com/gpu.shared", 8)}
    assert offered(**t4, rename_by_default=False) == {"T4/shared": ("nvidia.com/gpu", 8)}
    assert offered(unhealthy=2) == {"A100-80GB": ("nvidia.com/gpu", 6)}


def test_odd_mig_products_are_not_offered():
    for product in ("NVIDIA-A100-SXM4-80GB-MIG-INVALID", "NVIDIA-A100-SXM4-80GB-MIG-9g.1gb",
                    "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED"):  # fmt: skip
        assert node_gpus(node("n", product, {"nvidia.com/gpu": "7"}), CATALOG).resources == {}


def test_nodes_that_take_no_new_pods_offer_nothing():
    inv = cluster()
    for ready, taints in (
        ("False", [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]),
        ("Unknown", [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]),
        ("Unknown", []),  # before the controller taints it
        ("True", [{"key": "node.kubernetes.io/memory-pressure", "effect": "NoSchedule"}]),
    ):
        down = node("gpu-l40s", "NVIDIA-L40S", {"nvidia.com/gpu": "4"})
        down["spec"]["taints"] = taints
        down["status"]["conditions"] = [{"type": "Ready", "status": ready}]
        inv.apply_node("MODIFIED", down)
        assert (inv.view.free("L40S"), inv.view.total("L40S")) == (0, 0), (ready, taints)
    assert takes_pods(node("gpu-l40s", "NVIDIA-L40S", {}))  # no conditions reported: as before
    inv.apply_node("MODIFIED", node("gpu-l40s", "NVIDIA-L40S", {"nvidia.com/gpu": "4"}))
    assert inv.view.free("L40S") == 4


def test_nodes_tainted_by_other_controllers_offer_nothing_unless_servers_tolerate_it():
    """A NoSchedule or NoExecute taint no server pod tolerates keeps the node out, as
    kube-scheduler's TaintToleration filter would; the GPU taint, the operator's configured
    tolerations (a cloud's spot taint) and PreferNoSchedule do not."""
    spot = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}
    inv = ClusterInventory(CATALOG, tolerations=[{**spot, "operator": "Equal"}])
    for taints in (
        [{"key": "ToBeDeletedByClusterAutoscaler", "value": "1712000000", "effect": "NoSchedule"}],
        [{"key": "DeletionCandidateOfClusterAutoscaler", "effect": "NoExecute"}],
        [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}],
        [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoExecute"}],
        [{**spot, "value": "false"}],  # a value the toleration does not name
    ):
        leaving = node("gpu-l40s", "NVIDIA-L40S", {"nvidia.com/gpu": "4"})
        leaving["spec"]["taints"] = taints
        inv.apply_node("MODIFIED", leaving)
        assert (inv.view.free("L40S"), inv.view.total("L40S")) == (0, 0), taints
    for taints in (
        [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        [spot],
        [{"key": "ToBeDeletedByClusterAutoscaler", "effect": "PreferNoSchedule"}],
    ):
        tolerated = node("gpu-l40s", "NVIDIA-L40S", {"nvidia.com/gpu": "4"})
        tolerated["spec"]["taints"] = taints
        inv.apply_node("MODIFIED", tolerated)
        assert inv.view.free("L40S") == 4, taints
    # without the operator's toleration the spot node is out
    alone = ClusterInventory(CATALOG)
    alone.apply_node("ADDED", tolerated | {"spec": {"taints": [spot]}})
    assert alone.view.total("L40S") == 0
    # KubeSpawner's tolerations may be a dict of them
    named = ClusterInventory(CATALOG, tolerations={"spot": {**spot, "operator": "Equal"}})
    named.apply_node("ADDED", tolerated | {"spec": {"taints": [spot]}})
    assert named.view.free("L40S") == 4
    # a relist forgets the cluster, not the tolerations
    inv.reset()
    inv.apply_node("ADDED", tolerated | {"spec": {"taints": [spot]}})
    assert inv.view.free("L40S") == 4


def test_tolerations_match_taints_as_kubernetes_does():
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    assert tolerates([{"operator": "Exists"}], taint)  # no key, Exists: every taint
    assert tolerates([{"key": "k", "operator": "Exists"}], taint)
    assert tolerates([{"key": "k", "value": "v"}], taint)  # Equal by default
    assert tolerates([{"key": "k", "value": "v", "effect": "NoSchedule"}], taint)
    assert not tolerates([{"key": "k", "value": "v", "effect": "NoExecute"}], taint)
    assert not tolerates([{"key": "k", "value": "w"}], taint)
    assert not tolerates([{"key": "other", "operator": "Exists"}], taint)
    assert not tolerates([], taint)


def test_room_is_allocatable_cpu_and_memory_less_every_bound_pods_requests():
    inv = ClusterInventory(CATALOG)
    small = node("l4", "NVIDIA-L4", {"nvidia.com/gpu": "1"})
    small["status"]["allocatable"].update(cpu="3920m", memory="13621Mi")
    inv.apply_node("ADDED", small)
    assert inv.room("l4") == (3920, 13621 * 2**20)
    daemon = pod("ds", "l4", {})
    daemon["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m", "memory": "50Mi"}}
    inv.apply_pod("ADDED", daemon)
    limits_only = pod("lim", "l4", {"cpu": "1", "memory": "1Gi"})
    inv.apply_pod("ADDED", limits_only)
    assert inv.room("l4") == (3920 - 100 - 1000, (13621 - 50 - 1024) * 2**20)
    inv.apply_pod("DELETED", limits_only)
    assert inv.room("l4") == (3820, (13621 - 50) * 2**20)
    assert inv.view.free("L4") == 1  # CPU pods take no GPU
    assert inv.room("nowhere") is None


def test_quantities_parse_as_kubernetes_writes_them():
    assert [parse_quantity(q) for q in ("3920m", "2", 2.5, "1e3", "4G", "16Gi", "junk")] == [
        parse_quantity("3.92"), 2, parse_quantity("2.5"), 1000, 4 * 10**9, 16 * 2**30, 0
    ]  # fmt: skip
    assert host_requests(pod("x", "n", {"nvidia.com/gpu": "1"})) == {}
