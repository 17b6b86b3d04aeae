"""The whole platform on the Kubernetes backend, against the simulated cluster.

GPU nodes: 8x A100-80GB, an H100-80GB node partitioned all-1g.10gb (56 slices), 4x L40S, and
two time-sliced T4s. Pods run as local processes (tests/kube_sim)."""

import sys
from pathlib import Path

import kubernetes
import pytest

from tests.helm.dockerfile import parse_dockerfile
from tests.kube_sim.cluster import SimulatedCluster
from tests.kube_sim.volumes import ImageUser
from tests.platform import Platform

SINGLEUSER = str(Path(sys.executable).parent / "jupyterhub-singleuser")
ROOT = Path(__file__).resolve().parents[2]


def singleuser_image_user() -> ImageUser:
    """Whom images/singleuser runs servers as: its final USER (uid:gid) and WORKDIR, read
    from the Dockerfile, so the simulated pods run as the image would."""
    final = parse_dockerfile((ROOT / "images" / "singleuser" / "Dockerfile").read_text()).final
    uid, _, gid = final.user.partition(":")
    workdirs = [args for instr, args in final.instructions if instr == "WORKDIR"]
    return ImageUser(int(uid), int(gid or 0), workdirs[-1])


@pytest.fixture(scope="module")
def cluster():
    images = {"gputap/singleuser": singleuser_image_user()}
    with SimulatedCluster.run_in_thread(seed=7, event_interval=1.0, images=images) as c:
        # a DGX-like A100 node: 8 GPUs, 128 cores, 2 TiB (the catalog sizes CPU and memory
        # per GPU, so a node built for its GPUs fits them)
        c.gpu_node("gpu-a100", product="NVIDIA-A100-SXM4-80GB", gpus=8, cpu="128", memory="2Ti")
        c.gpu_node("gpu-h100", product="NVIDIA-H100-80GB-HBM3", gpus=8, mig="all-1g.10gb")
        c.gpu_node("gpu-l40s", product="NVIDIA-L40S", gpus=4, memory_mib=46068)
        # two T4s time-sliced 8 ways each by the device plugin (renameByDefault)
        c.add_node(
            "gpu-t4-shared",
            labels={
                "nvidia.com/gpu.product": "Tesla-T4",
                "nvidia.com/gpu.count": "2",
                "nvidia.com/gpu.replicas": "8",
                "nvidia.com/gpu.present": "true",
            },
            allocatable={"nvidia.com/gpu.shared": "16", "cpu": "32", "memory": "128Gi"},
            taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        )
        core = kube_api(c)
        core.create_namespace({"metadata": {"name": "gputap"}})
        create_priority_classes(c)
        yield c


def create_priority_classes(cluster) -> None:
    """What the Helm chart creates (templates/priorityclasses.yaml): gputap never does."""
    scheduling = kubernetes.client.SchedulingV1Api(kube_api(cluster).api_client)
    for name, value in (("gputap-on-demand", 1000), ("gputap-spot", -100)):
        scheduling.create_priority_class({"metadata": {"name": name}, "value": value})


def kube_api(cluster) -> kubernetes.client.CoreV1Api:
    config = kubernetes.client.Configuration(host=cluster.url)
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(config))


@pytest.fixture(scope="module")
def platform(cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("kube-platform")
    kubeconfig = cluster.write_kubeconfig(str(root / "kubeconfig"), namespace="gputap")
    p = Platform(
        root,
        extra={
            "spawner": {
                "backend": "kubernetes",
                "start_timeout": 60,
                "kubernetes": {
                    "namespace": "gputap",
                    "cmd": [SINGLEUSER],
                    "args": ["--allow-root"],
                    "environment": {
                        "JUPYTER_CONFIG_PATH": str(ROOT / "hub_config" / "singleuser"),
                    },
                },
            }
        },
        env={"KUBECONFIG": kubeconfig},
    )
    p.start()
    yield p
    p.shutdown()
