import pytest
from kubespawner.slugs import is_valid_label

from spawner.core.catalog import Catalog
from spawner.core.placement import Placement
from spawner.kube.objects import gpu_pod_settings, label

CATALOG = Catalog.load()


def test_two_whole_gpus_become_limits_selector_tolerations_and_guarantees():
    placement = Placement(CATALOG.offering("A100-80GB"), 2, "gpu-a100", 8_000_000)
    assert gpu_pod_settings(
        placement,
        CATALOG,
        username="alice",
        session_id="5f0c1e9a-session",
        product="NVIDIA-A100-SXM4-80GB",
        hostname="gpu-a100",
    ) == {
        "extra_labels": {
            "gputap.io/user": "alice",
            "gputap.io/server": "default",
            "gputap.io/count": "2",
            "gputap.io/price-class": "on-demand",
            "gputap.io/card": "A100-80GB",
        },
        "extra_annotations": {
            "gputap.io/user": "alice",
            "gputap.io/server": "",
            "gputap.io/offering": "A100-80GB",
            "gputap.io/price-per-hour-micro": "8000000",
            "gputap.io/session": "5f0c1e9a-session",
        },
        "extra_resource_limits": {"nvidia.com/gpu": "2"},
        "extra_resource_guarantees": {"nvidia.com/gpu": "2"},
        "node_selector": {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "kubernetes.io/hostname": "gpu-a100",
        },
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "cpu_guarantee": 16.0,
        "mem_guarantee": "240G",
        "mem_limit": "240G",
    }


def test_a_slice_asks_for_its_mig_resource_and_a_share_of_cpu():
    placement = Placement(CATALOG.offering("H100-80GB/1g.10gb"), 1, "gpu-h100", 1_714_286)
    s = gpu_pod_settings(
        placement,
        CATALOG,
        username="bob@uni.edu",
        session_id="s-2",
        server_name="exp 1",
        product="NVIDIA-H100-80GB-HBM3",
        price_class="spot",
        course="Intro to DL",
    )
    assert s["extra_resource_limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    assert s["extra_labels"]["gputap.io/slice"] == "1g.10gb"
    assert s["extra_labels"]["gputap.io/price-class"] == "spot"
    assert s["extra_annotations"]["gputap.io/user"] == "bob@uni.edu"
    assert s["extra_annotations"]["gputap.io/course"] == "Intro to DL"
    assert s["cpu_guarantee"] == round(12 / 7, 2)
    assert all(is_valid_label(v) for v in s["extra_labels"].values())


def test_a_small_node_cuts_the_guarantees_to_what_it_has_left():
    placement = Placement(CATALOG.offering("L4"), 1, "l4-small", 1_000_000)

    def settings(room):
        return gpu_pod_settings(placement, CATALOG, username="u", session_id="s",
                                product="NVIDIA-L4", room=room)  # fmt: skip

    # a g2-standard-4's allocatable: 3920m, 13621Mi; the catalog's L4 wants 4 cores, 32 GB
    small = settings((3920, 13621 * 2**20))
    assert (small["cpu_guarantee"], small["mem_guarantee"]) == (3.92, "13621Mi")
    assert small["mem_limit"] == "13621Mi"  # the limit is what the node gives, not more
    roomy = settings((64_000, 512 * 2**30))
    assert (roomy["cpu_guarantee"], roomy["mem_guarantee"]) == (4, "32G")
    full = settings((-100, 0))  # overcommitted by pods gputap does not place
    assert (full["cpu_guarantee"], full["mem_guarantee"]) == (0, "0Mi")


def test_a_slice_on_a_single_strategy_node_asks_for_what_the_node_advertises():
    placement = Placement(CATALOG.offering("H100-80GB/1g.10gb"), 1, "h100", 1_000_000)
    s = gpu_pod_settings(placement, CATALOG, username="u", session_id="s",
                         product="NVIDIA-H100-80GB-HBM3-MIG-1g.10gb",
                         resource="nvidia.com/gpu")  # fmt: skip
    assert s["extra_resource_limits"] == {"nvidia.com/gpu": "1"}
    assert s["node_selector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"}
    assert s["extra_labels"]["gputap.io/slice"] == "1g.10gb"


def test_cpu_only_asks_for_cpu_and_memory_and_sees_no_gpu():
    s = gpu_pod_settings(
        Placement(CATALOG.cpu, 1, "", 100_000), CATALOG, username="carol", session_id="s-3"
    )
    assert set(s) == {
        "extra_labels", "extra_annotations", "cpu_guarantee", "mem_guarantee", "mem_limit",
        "environment",
    }  # fmt: skip
    # the catalog's cpu entry: 2 cores, 4 GB; no GPU resource, selector or toleration
    assert (s["cpu_guarantee"], s["mem_guarantee"], s["mem_limit"]) == (2, "4G", "4G")
    assert s["environment"] == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert s["extra_annotations"]["gputap.io/offering"] == "cpu"
    assert s["extra_annotations"]["gputap.io/session"] == "s-3"


def test_label_values_are_valid_and_distinct():
    values = {label(n) for n in ["a@b", "a-b", "A_B", "x" * 100, "ünï"]}
    assert len(values) == 5
    assert all(len(v) <= 63 and is_valid_label(v) for v in values)


def test_bad_input_is_refused():
    placement = Placement(CATALOG.offering("A100-80GB"), 1, "n", 1)
    with pytest.raises(ValueError, match="product"):
        gpu_pod_settings(placement, CATALOG, username="a", session_id="s")
    with pytest.raises(ValueError, match="price_class"):
        gpu_pod_settings(
            placement, CATALOG, username="a", session_id="s", product="p", price_class="cheap"
        )
    with pytest.raises(ValueError, match="session_id"):
        gpu_pod_settings(placement, CATALOG, username="a", session_id="", product="p")


def kubespawner_pod(**configured):
    """The pod KubeSpawner's make_pod builds from configured traits (as get_pod_manifest)."""
    from kubespawner.objects import make_pod

    return make_pod(
        name="jupyter-alice",
        cmd=["jupyterhub-singleuser"],
        port=8888,
        image="gputap/singleuser:latest",
        labels={"component": "singleuser-server", "team": "ml"},
        annotations={"hub.jupyter.org/username": "alice"},
        volumes=[{"name": "home", "persistentVolumeClaim": {"claimName": "home-alice"}}],
        volume_mounts=[{"name": "home", "mountPath": "/home/jovyan"}],
        **configured,
    )


def pod_json(pod) -> dict:
    from kubernetes_asyncio.client import ApiClient

    return ApiClient().sanitize_for_serialization(pod)  # needs a running loop: async tests


async def test_the_placement_goes_onto_the_pod_kubespawner_built_keeping_what_is_configured():
    from spawner.kube.disks import disk_pod_settings
    from spawner.kube.objects import apply_pod_settings

    placement = Placement(CATALOG.offering("A100-80GB"), 2, "gpu-a100", 8_000_000)
    node = {"product": "NVIDIA-A100-SXM4-80GB", "hostname": "gpu-a100"}
    settings = gpu_pod_settings(placement, CATALOG, username="alice", session_id="s-1", **node)
    settings.update(disk_pod_settings("alice", ["data"]))
    settings["priority_class_name"] = "gputap-on-demand"
    configured = kubespawner_pod(
        node_selector={"pool": "gpu"},
        tolerations=[{"key": "dedicated", "operator": "Exists"}],
        mem_limit="300G",
        lifecycle_hooks={"preStop": {"exec": {"command": ["sync"]}}},
    )
    pod = pod_json(apply_pod_settings(configured, settings))
    spec = pod["spec"]
    [notebook] = spec["containers"]
    assert pod["metadata"]["labels"] == {
        "component": "singleuser-server",
        "team": "ml",
        "gputap.io/user": "alice",
        "gputap.io/server": "default",
        "gputap.io/count": "2",
        "gputap.io/price-class": "on-demand",
        "gputap.io/card": "A100-80GB",
    }
    assert pod["metadata"]["annotations"] == {
        "hub.jupyter.org/username": "alice",
        "gputap.io/user": "alice",
        "gputap.io/server": "",
        "gputap.io/offering": "A100-80GB",
        "gputap.io/price-per-hour-micro": "8000000",
        "gputap.io/session": "s-1",
    }
    # the offering's memory is the limit too, over a configured one (a limit below the request
    # would make the pod invalid)
    assert notebook["resources"] == {
        "limits": {"memory": "240G", "nvidia.com/gpu": "2"},
        "requests": {"nvidia.com/gpu": "2", "cpu": 16.0, "memory": "240G"},
    }
    assert spec["nodeSelector"] == {
        "pool": "gpu",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "kubernetes.io/hostname": "gpu-a100",
    }
    assert spec["tolerations"] == [
        {"key": "dedicated", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]
    # the home KubeSpawner mounts, then the disk
    assert [v["name"] for v in spec["volumes"]] == ["home", "disk-data"]
    assert [m["mountPath"] for m in notebook["volumeMounts"]] == ["/home/jovyan", "/mnt/disks/data"]
    assert notebook["lifecycle"]["preStop"] == {"exec": {"command": ["sync"]}}
    assert notebook["lifecycle"]["postStart"]["exec"]["command"][:2] == ["sh", "-c"]
    assert spec["priorityClassName"] == "gputap-on-demand"


async def test_a_cpu_server_gets_its_labels_requests_and_no_gpus():
    from spawner.kube.objects import apply_pod_settings

    settings = gpu_pod_settings(
        Placement(CATALOG.cpu, 1, "", 100_000), CATALOG, username="carol", session_id="s-3"
    )
    before = pod_json(kubespawner_pod())
    after = pod_json(apply_pod_settings(kubespawner_pod(), settings))
    [container], [was] = after["spec"].pop("containers"), before["spec"].pop("containers")
    assert after["spec"] == before["spec"]
    assert container["resources"] == {
        "limits": {"memory": "4G"},
        "requests": {"cpu": 2.0, "memory": "4G"},
    }
    assert container["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    assert {k: v for k, v in container.items() if k not in ("resources", "env")} == {
        k: v for k, v in was.items() if k not in ("resources", "env")
    }
    assert after["metadata"]["annotations"]["gputap.io/session"] == "s-3"


async def test_an_environments_image_replaces_the_configured_one_and_nothing_else():
    from spawner.kube.objects import apply_pod_settings

    before = pod_json(kubespawner_pod())
    after = pod_json(apply_pod_settings(kubespawner_pod(), {"image": "quay.io/acme/torch:2"}))
    [container], [was] = after["spec"].pop("containers"), before["spec"].pop("containers")
    assert container == {**was, "image": "quay.io/acme/torch:2"}
    assert after == before
