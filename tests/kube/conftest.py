"""The whole platform on the Kubernetes backend, against the simulated cluster.

GPU nodes: 8x A100-80GB, an H100-80GB node partitioned all-1g.10gb (56 slices), 4x L40S, and
two time-sliced T4s. Pods run as local processes, each in its own network namespace, so the hub
listens at the pod network's gateway (tests/kube_sim).

The cluster holds the RBAC the Helm chart renders for release `gputap` in namespace `gputap`
(z2jh's hub ServiceAccount and gputap's templates/rbac/), the hub runs
with the token of ServiceAccount `hub` and billing's pod meter with that of `gputap-billing`:
a request the rendered rules do not grant is refused as a real cluster would refuse it, and
the module fails at teardown if the hub or billing met such a refusal. The tests themselves
act as the cluster's administrator."""

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import kubernetes.utils
import pytest
import yaml

from tests.helm.chart import copy_chart, render
from tests.helm.dockerfile import parse_dockerfile
from tests.kube_sim.cluster import SimulatedCluster, admin_key
from tests.kube_sim.cluster_thread import ClusterThread
from tests.kube_sim.volumes import ImageUser
from tests.platform import POLL_SECONDS, Platform

SINGLEUSER = str(Path(sys.executable).parent / "jupyterhub-singleuser")
ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "gputap"
#: the ServiceAccounts the chart gives the hub (z2jh's) and billing (gputap's)
HUB_ACCOUNT = "hub"
BILLING_ACCOUNT = "gputap-billing"
RBAC_KINDS = ("ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")


@pytest.fixture(scope="session")
def chart_rbac(tmp_path_factory) -> list[dict]:
    """The hub's and billing's ServiceAccounts, roles and bindings as the chart renders them
    with default values: z2jh's hub ServiceAccount and gputap's own."""
    return rendered_rbac(tmp_path_factory.mktemp("chart"), {})


def rendered_rbac(parent: Path, values: dict) -> list[dict]:
    """The hub's and billing's RBAC as the chart renders it with values (a chart copy under
    parent)."""
    manifests = render(copy_chart(parent), values)
    return [m for m in manifests if m["kind"] in RBAC_KINDS and _hub_or_gputap(m)]


def _hub_or_gputap(manifest: dict) -> bool:
    labels = manifest["metadata"].get("labels") or {}
    return labels.get("component") == "hub" or labels.get("app.kubernetes.io/name") == "gputap"


def rendered_rules(chart_rbac: list[dict], account: str) -> list[tuple[str, str, str, dict]]:
    """(role as "Kind/name", the namespace the binding grants it in or "" for every one, rule)
    of each rule bound to ServiceAccount account."""
    roles = {
        (m["kind"], m["metadata"]["name"]): m
        for m in chart_rbac
        if m["kind"] in ("Role", "ClusterRole")
    }
    subject = {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    rules = []
    for binding in [m for m in chart_rbac if m["kind"].endswith("RoleBinding")]:
        if subject not in binding["subjects"]:
            continue
        ref = binding["roleRef"]
        scope = "" if binding["kind"] == "ClusterRoleBinding" else NAMESPACE
        role = roles[(ref["kind"], ref["name"])]
        rules += [(f"{ref['kind']}/{ref['name']}", scope, r) for r in role["rules"]]
    return rules


def refused(cluster, *accounts: str) -> list:
    """The audit records of the accounts' requests that were refused (401 or 403)."""
    users = {f"system:serviceaccount:{NAMESPACE}:{a}" for a in accounts}
    return [r for r in cluster.audit if r.user in users and not r.allowed]


def singleuser_image_user() -> ImageUser:
    """Whom images/singleuser runs servers as: its final USER (uid:gid) and WORKDIR, read
    from the Dockerfile, so the simulated pods run as the image would."""
    final = parse_dockerfile((ROOT / "images" / "singleuser" / "Dockerfile").read_text()).final
    uid, _, gid = final.user.partition(":")
    workdirs = [args for instr, args in final.instructions if instr == "WORKDIR"]
    return ImageUser(int(uid), int(gid or 0), workdirs[-1])


@pytest.fixture(scope="module")
def cluster(chart_rbac):
    with gputap_cluster(chart_rbac, seed=7) as c:
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
        yield c


@contextlib.contextmanager
def gputap_cluster(
    chart_rbac: list[dict],
    namespaces: tuple[str, ...] = (),
    images: tuple[str, ...] = (),
    **kwargs: Any,
) -> Iterator[ClusterThread]:
    """A simulated cluster (``kwargs`` for SimulatedCluster) as `helm install` leaves it for
    gputap, in the release's namespace and ``namespaces`` (made by the operator first), its
    pods run as the single-user image's user (and as that of ``images``, built on it, by
    repository); at the end, nothing the hub or billing asked may have been refused."""
    images = {name: singleuser_image_user() for name in ("gputap/singleuser", *images)}
    with SimulatedCluster.run_in_thread(event_interval=1.0, images=images, **kwargs) as c:
        install_gputap(c, chart_rbac, namespaces)
        yield c
        assert refused(c, HUB_ACCOUNT, BILLING_ACCOUNT) == [], "the chart's RBAC refused these"


def install_gputap(cluster, chart_rbac: list[dict], namespaces: tuple[str, ...] = ()) -> None:
    """What `helm install` leaves for gputap in a cluster: its namespace (and ``namespaces``,
    the operator's; Pod Security restricted), the PriorityClasses and the chart's RBAC (the
    hub and billing then act by their ServiceAccounts' tokens)."""
    core = kube_api(cluster)
    for namespace in (NAMESPACE, *namespaces):
        # as docs/install-kubernetes.md has the operator label them: Pod Security admission
        # refuses any pod of gputap's the restricted profile does not admit
        labels = {"pod-security.kubernetes.io/enforce": "restricted"}
        core.create_namespace({"metadata": {"name": namespace, "labels": labels}})
    create_priority_classes(cluster)
    for manifest in chart_rbac:
        kubernetes.utils.create_from_dict(core.api_client, manifest, namespace=NAMESPACE)


def create_priority_classes(cluster) -> None:
    """What the Helm chart creates (templates/priorityclasses.yaml), with the values and
    preemption policies of its values.yaml: gputap never does."""
    scheduling = kubernetes.client.SchedulingV1Api(kube_api(cluster).api_client)
    chart = yaml.safe_load((ROOT / "helm" / "gputap" / "values.yaml").read_text())
    classes = chart["priorityClasses"]
    for name, key in (("gputap-on-demand", "onDemand"), ("gputap-spot", "spot")):
        body = {"metadata": {"name": name}, **classes[key]}
        scheduling.create_priority_class(body)


def user_of(account: str) -> str:
    """The RBAC user name of gputap's ServiceAccount ``account``."""
    return f"system:serviceaccount:{NAMESPACE}:{account}"


def kube_api(cluster) -> kubernetes.client.CoreV1Api:
    config = kubernetes.client.Configuration(host=cluster.url, api_key=admin_key(cluster))
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(config))


def shared_homes(cluster) -> dict[str, Any]:
    """spawner.kubernetes settings for homes on a shared file system (ReadWriteMany, on a
    StorageClass of the NFS CSI driver made here), which a server's workers mount too; the
    image's PATH holds gputap-worker beside jupyterhub-singleuser, as images/singleuser's."""
    storage = kubernetes.client.StorageV1Api(kube_api(cluster).api_client)
    storage.create_storage_class(
        {
            "metadata": {"name": "shared-nfs"},
            "provisioner": "nfs.csi.k8s.io",
            "volumeBindingMode": "Immediate",
        }
    )
    return {
        "home_access_mode": "ReadWriteMany",
        "storage_class": "shared-nfs",
        "environment": {
            "JUPYTER_CONFIG_PATH": str(ROOT / "hub_config" / "singleuser"),
            "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        },
    }


@pytest.fixture(scope="module")
def platform(cluster, tmp_path_factory):
    p = kube_platform(cluster, tmp_path_factory.mktemp("kube-platform"))
    p.start()
    yield p
    p.shutdown()


def kube_platform(
    cluster,
    root: Path,
    kubernetes: dict | None = None,
    namespace: str = NAMESPACE,
    poll_seconds: int = POLL_SECONDS,
    **settings: Any,
) -> Platform:
    """The platform on ``cluster``'s Kubernetes backend, its servers in ``namespace``, with the
    hub's and billing's ServiceAccounts (the release's; their clients' default namespace the
    servers'), the hub polling servers every ``poll_seconds``, and ``kubernetes``
    (spawner.kubernetes keys) and ``settings`` (sections) beside the tests' own; not yet
    started."""
    kubeconfig = cluster.write_kubeconfig(
        str(root / "kubeconfig"),
        namespace=namespace,
        token=cluster.service_account_token(NAMESPACE, HUB_ACCOUNT),
    )
    billing_kubeconfig = cluster.write_kubeconfig(
        str(root / "billing-kubeconfig"),
        namespace=namespace,
        token=cluster.service_account_token(NAMESPACE, BILLING_ACCOUNT),
    )
    return Platform(
        root,
        extra={
            "spawner": {
                "backend": "kubernetes",
                "start_timeout": 60,
                "poll_interval_seconds": poll_seconds,
                "kubernetes": {
                    "namespace": namespace,
                    # pods reach the host at the pod network's gateway, not its loopback
                    "hub_ip": cluster.host_ip,
                    "cmd": [SINGLEUSER],
                    "args": ["--allow-root"],
                    "environment": {
                        "JUPYTER_CONFIG_PATH": str(ROOT / "hub_config" / "singleuser"),
                    },
                    **(kubernetes or {}),
                },
            },
            "billing": {"kubeconfig": billing_kubeconfig},
            **settings,
        },
        env={"KUBECONFIG": kubeconfig},
    )
