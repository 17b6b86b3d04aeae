"""Shared data on the Kubernetes backend: a models claim and a datasets NFS export mounted
read-only in every server's pod, the Hugging Face variables set, and a write from inside the
pod refused by the file system (the simulated kubelet mounts readOnly volumes ``ro``)."""

import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest
import yaml

from tests.kube.conftest import NAMESPACE, kube_api, kube_platform
from tests.kube.test_kube_spawn import pod_of

SLICE = {"kind": "slice", "card": "H100-80GB", "profile": "1g.10gb"}
SHARED_DATA = [
    {"name": "hf-models", "mount_path": "/models", "kind": "models", "claim": "hf-models"},
    {
        "name": "imagenet",
        "mount_path": "/datasets/imagenet",
        "nfs_server": "nfs.example.internal",
        "nfs_path": "/exports/imagenet",
    },
]
#: a file of a model as `huggingface-cli download` leaves it in the hub cache
MODEL_FILE = "models--acme--tiny/snapshots/abc123/config.json"


@pytest.fixture(scope="module")
def models_volume(cluster) -> Path:
    """The claim the operator made for the models (on a shared file system, so every node
    mounts it), bound, with a model in it."""
    storage = kubernetes.client.StorageV1Api(kube_api(cluster).api_client)
    storage.create_storage_class(
        {
            "metadata": {"name": "shared-nfs"},
            "provisioner": "nfs.csi.k8s.io",
            "volumeBindingMode": "Immediate",
        }
    )
    core = kube_api(cluster)
    core.create_namespaced_persistent_volume_claim(
        "gputap",
        {
            "metadata": {"name": "hf-models"},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "shared-nfs",
                "resources": {"requests": {"storage": "10Gi"}},
            },
        },
    )
    claim = core.read_namespaced_persistent_volume_claim("hf-models", "gputap")
    assert claim.spec.volume_name, "the claim was not bound"
    folder = Path(cluster.cluster.volumes.volume_dir(claim.spec.volume_name))
    (folder / MODEL_FILE).parent.mkdir(parents=True)
    (folder / MODEL_FILE).write_text('{"model_type": "tiny"}')
    return folder


@pytest.fixture(scope="module")
def imagenet_export(cluster) -> Iterator[Path]:
    """The NFS export of the datasets, served to the simulated nodes, with a file in it that
    everyone may read (as on a file server)."""
    with tempfile.TemporaryDirectory(prefix="kube-sim-nfs-") as name:
        folder = Path(name)
        folder.chmod(0o755)
        (folder / "train.csv").write_text("image,label\n")
        cluster.cluster.volumes.nfs_exports["nfs.example.internal:/exports/imagenet"] = name
        yield folder


@pytest.fixture(scope="module")
def host_mount_points():
    """The simulated kubelet makes missing mount points on this machine (tests/kube_sim):
    those this module made go at its end."""
    paths = (Path("/models"), Path("/datasets/imagenet"), Path("/datasets"))
    made = [p for p in paths if not p.exists()]
    yield
    for path in made:
        if path.is_dir() and not any(path.iterdir()):
            path.rmdir()


@pytest.fixture(scope="module")
def baseline_namespace(cluster):
    """An NFS export is an inline volume, which Pod Security restricted refuses: a namespace
    whose servers mount one runs at baseline (docs/kubernetes.md, "Pod Security")."""
    labels = {"pod-security.kubernetes.io/enforce": "baseline"}
    kube_api(cluster).patch_namespace(NAMESPACE, {"metadata": {"labels": labels}})


@pytest.fixture(scope="module")
def platform(
    cluster, baseline_namespace, models_volume, imagenet_export, host_mount_points, tmp_path_factory
):
    p = kube_platform(cluster, tmp_path_factory.mktemp("kube-shared-data"))
    settings = yaml.safe_load(p.settings_path.read_text())
    p.settings_path.write_text(yaml.safe_dump({**settings, "shared_data": SHARED_DATA}))
    p.start()
    yield p
    p.shutdown()


def in_pod(cluster, pod: dict, script: str) -> subprocess.CompletedProcess:
    """Run ``script`` (sh) in the mount namespace of the pod's server process, as the user the
    server runs as."""
    run = cluster.cluster.kubelet.runs[pod["metadata"]["uid"]]
    context = pod["spec"].get("securityContext") or {}
    uid, gid = context.get("runAsUser", 1000), context.get("fsGroup", 100)
    command = ["nsenter", "-t", str(run.proc.pid), "-m", "--"]
    command += ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]
    return subprocess.run(
        [*command, "sh", "-c", script], capture_output=True, text=True, timeout=30
    )


def test_shared_data_is_mounted_read_only_with_the_hugging_face_variables(platform, cluster):
    platform.create_user("sam")
    r = platform.spawn("sam", SLICE)
    assert r.status_code in (201, 202), r.text
    platform.wait_ready("sam")
    pod = pod_of(cluster, "sam")
    spec, container = pod["spec"], pod["spec"]["containers"][0]

    assert {
        "name": "shared-hf-models",
        "persistentVolumeClaim": {"claimName": "hf-models", "readOnly": True},
    } in spec["volumes"]
    assert {
        "name": "shared-imagenet",
        "nfs": {"server": "nfs.example.internal", "path": "/exports/imagenet", "readOnly": True},
    } in spec["volumes"]
    mounts = container["volumeMounts"]
    assert {"name": "shared-hf-models", "mountPath": "/models", "readOnly": True} in mounts
    assert {
        "name": "shared-imagenet",
        "mountPath": "/datasets/imagenet",
        "readOnly": True,
    } in mounts
    assert {"name": "home", "mountPath": "/home/jovyan"} in mounts  # the home stays writable

    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["HF_HUB_CACHE"] == "/models"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["HF_HOME"] == "/home/jovyan/.cache/huggingface"
    assert json.loads(env["GPUTAP_SHARED_DATA"]) == [
        {"name": "hf-models", "kind": "models", "path": "/models"},
        {"name": "imagenet", "kind": "datasets", "path": "/datasets/imagenet"},
    ]

    # inside the pod: the model reads, a write is refused by the file system, the home writes
    read = in_pod(cluster, pod, f"cat /models/{MODEL_FILE}")
    assert read.returncode == 0 and json.loads(read.stdout) == {"model_type": "tiny"}, read
    write = in_pod(cluster, pod, "echo x > /models/mine.txt")
    assert write.returncode != 0 and "Read-only file system" in write.stderr, write
    read = in_pod(cluster, pod, "cat /datasets/imagenet/train.csv")
    assert read.returncode == 0 and read.stdout == "image,label\n", read
    write = in_pod(cluster, pod, "rm /datasets/imagenet/train.csv")
    assert write.returncode != 0 and "Read-only file system" in write.stderr, write
    home = in_pod(cluster, pod, "mkdir -p /home/jovyan/.cache/huggingface && echo ok")
    assert home.returncode == 0 and home.stdout.strip() == "ok", home
    platform.stop_server("sam")
