"""Storage in the simulated cluster: classes, binding modes, zones, access modes, Multi-Attach,
and what a pod's process may do with a fresh volume (owned by root) as its image's user."""

import json
import os

import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException

from tests.kube_sim import SimulatedCluster
from tests.kube_sim.conftest import PY, pod_body
from tests.kube_sim.storage import STANDARD_CLASSES, ZONE_LABEL
from tests.kube_sim.volumes import ImageUser, ProcessUser, apply_fs_group, process_user
from tests.waiting import wait_for

USER_IMAGE = "example.org/notebook:1.0"  # an image whose USER is 1000:100, HOME /home/jovyan

CLASSES = [
    *STANDARD_CLASSES,
    {
        "metadata": {"name": "zone-b-now"},
        "provisioner": "pd.csi.storage.gke.io",
        "volumeBindingMode": "Immediate",
        "allowedTopologies": [
            {"matchLabelExpressions": [{"key": ZONE_LABEL, "values": ["zone-b"]}]}
        ],
    },
    {
        "metadata": {"name": "shared-nfs"},
        "provisioner": "nfs.csi.k8s.io",
        "volumeBindingMode": "Immediate",
    },
]


@pytest.fixture(scope="module")
def kube():
    images = {"example.org/notebook": ImageUser(1000, 100, "/home/jovyan")}
    with SimulatedCluster.run_in_thread(
        crash_backoff=0.2,
        max_grace_seconds=1,
        event_interval=0.2,
        images=images,
        storage_classes=CLASSES,
    ) as cluster:
        for name, zone in (("node-a1", "zone-a"), ("node-a2", "zone-a"), ("node-b1", "zone-b")):
            cluster.add_node(name, labels={ZONE_LABEL: zone})
        yield cluster


@pytest.fixture(scope="module")
def storage_api(core):
    return kubernetes.client.StorageV1Api(core.api_client)


def claim(core, ns, name, modes=("ReadWriteOnce",), storage_class=None):
    spec = {"accessModes": list(modes), "resources": {"requests": {"storage": "1Gi"}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    return core.create_namespaced_persistent_volume_claim(
        ns, {"metadata": {"name": name}, "spec": spec}
    )


def with_volume(body, claim_name, mount_path, node=None, **mount):
    body["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]
    body["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "data", "mountPath": mount_path, **mount}
    ]
    if node:
        body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return body


def events(core, ns, name, reason):
    return [
        e.message
        for e in core.list_namespaced_event(ns).items
        if e.involved_object.name == name and e.reason == reason
    ]


def phase(core, ns, name):
    return core.read_namespaced_pod(name, ns).status.phase


def waiting_reason(core, ns, name):
    statuses = core.read_namespaced_pod(name, ns).status.container_statuses or []
    return statuses and statuses[0].state.waiting and statuses[0].state.waiting.reason


def test_storage_classes_are_validated_and_the_default_is_filled_in(core, ns, storage_api):
    names = {c.metadata.name: c for c in storage_api.list_storage_class().items}
    assert names["standard-rwo"].volume_binding_mode == "WaitForFirstConsumer"
    with pytest.raises(ApiException) as e:
        storage_api.create_storage_class(
            {"metadata": {"name": "bad"}, "provisioner": "x", "volumeBindingMode": "Later"}
        )
    assert e.value.status == 422 and "volumeBindingMode" in json.loads(e.value.body)["message"]
    with pytest.raises(ApiException) as e:
        claim(core, ns, "odd", modes=("ReadWriteSometimes",))
    assert e.value.status == 422
    made = claim(core, ns, "home")
    assert made.spec.storage_class_name == "standard-rwo" and made.status.phase == "Pending"
    assert events(core, ns, "home", "WaitForFirstConsumer") == [
        "waiting for first consumer to be created before binding"
    ]


def test_wait_for_first_consumer_provisions_in_the_zone_of_the_pods_node(core, ns):
    claim(core, ns, "home")
    body = with_volume(
        pod_body("first", command=[PY, "-c", "import time; time.sleep(30)"]),
        "home",
        f"/tmp/kube-sim-mnt/{ns}",
        node="node-b1",
    )
    core.create_namespaced_pod(ns, body)
    wait_for(lambda: phase(core, ns, "first") == "Running")
    bound = core.read_namespaced_persistent_volume_claim("home", ns)
    assert bound.status.phase == "Bound"
    assert bound.metadata.annotations["volume.kubernetes.io/selected-node"] == "node-b1"
    pv = core.read_persistent_volume(bound.spec.volume_name)
    term = pv.spec.node_affinity.required.node_selector_terms[0].match_expressions[0]
    assert (term.key, term.values) == (ZONE_LABEL, ["zone-b"])
    assert pv.spec.claim_ref.name == "home" and pv.status.phase == "Bound"
    core.delete_namespaced_pod("first", ns, grace_period_seconds=0)
    # the volume now lives in zone-b: a pod asking for zone-a cannot have it
    body = with_volume(pod_body("second"), "home", f"/tmp/kube-sim-mnt/{ns}", node="node-a1")
    body["spec"]["nodeSelector"] = {ZONE_LABEL: "zone-a"}
    core.create_namespaced_pod(ns, body)
    message = wait_for(lambda: events(core, ns, "second", "FailedScheduling"))[0]
    assert message == (
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "2 node(s) had volume node affinity conflict."
    )
    core.delete_namespaced_persistent_volume_claim("home", ns)
    wait_for(lambda: not _pv_exists(core, bound.spec.volume_name))  # reclaimPolicy Delete


def _pv_exists(core, name):
    try:
        core.read_persistent_volume(name)
    except ApiException as e:
        assert e.status == 404
        return False
    return True


def test_an_immediate_class_binds_at_once_in_its_allowed_zone(core, ns):
    made = claim(core, ns, "data", storage_class="zone-b-now")
    assert made.status.phase == "Bound"
    pv = core.read_persistent_volume(made.spec.volume_name)
    assert pv.metadata.labels[ZONE_LABEL] == "zone-b"
    core.create_namespaced_pod(ns, with_volume(pod_body("p"), "data", f"/tmp/kube-sim-mnt/{ns}"))
    wait_for(lambda: core.read_namespaced_pod("p", ns).spec.node_name == "node-b1")


def test_a_missing_claim_or_a_block_class_for_many_nodes_leaves_the_pod_pending(core, ns):
    core.create_namespaced_pod(ns, with_volume(pod_body("lost"), "nope", "/tmp/kube-sim-x"))
    message = wait_for(lambda: events(core, ns, "lost", "FailedScheduling"))[0]
    assert message == '0/3 nodes are available: persistentvolumeclaim "nope" not found.'
    claim(core, ns, "wide", modes=("ReadWriteMany",))  # the default class is block storage
    core.create_namespaced_pod(ns, with_volume(pod_body("wide"), "wide", "/tmp/kube-sim-x"))
    message = wait_for(lambda: events(core, ns, "wide", "FailedScheduling"))[0]
    assert "access mode ReadWriteMany is not supported by pd.csi.storage.gke.io" in message
    assert phase(core, ns, "wide") == "Pending"


def test_a_read_write_once_volume_refuses_a_second_node_until_the_first_pod_goes(core, ns):
    claim(core, ns, "home")
    sleep = [PY, "-c", "import time; time.sleep(60)"]
    mount = f"/tmp/kube-sim-mnt/{ns}"
    core.create_namespaced_pod(ns, with_volume(pod_body("a", sleep), "home", mount, "node-a1"))
    wait_for(lambda: phase(core, ns, "a") == "Running")
    # same node: fine (ReadWriteOnce is per node)
    core.create_namespaced_pod(ns, with_volume(pod_body("a2", sleep), "home", mount, "node-a1"))
    wait_for(lambda: phase(core, ns, "a2") == "Running")
    core.create_namespaced_pod(ns, with_volume(pod_body("b", sleep), "home", mount, "node-a2"))
    message = wait_for(lambda: events(core, ns, "b", "FailedAttachVolume"))[0]
    volume = core.read_namespaced_persistent_volume_claim("home", ns).spec.volume_name
    assert (
        message
        == f'Multi-Attach error for volume "{volume}" Volume is already used by pod(s) a, a2'
    )
    assert (
        phase(core, ns, "b") == "Pending" and waiting_reason(core, ns, "b") == "ContainerCreating"
    )
    for name in ("a", "a2"):
        core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    wait_for(lambda: phase(core, ns, "b") == "Running")


def test_read_write_many_volumes_attach_to_many_nodes(core, ns):
    claim(core, ns, "shared", modes=("ReadWriteMany",), storage_class="shared-nfs")
    sleep = [PY, "-c", "import time; time.sleep(60)"]
    mount = f"/tmp/kube-sim-mnt/{ns}"
    for name, node in (("x", "node-a1"), ("y", "node-b1")):
        core.create_namespaced_pod(ns, with_volume(pod_body(name, sleep), "shared", mount, node))
    wait_for(lambda: phase(core, ns, "x") == "Running" and phase(core, ns, "y") == "Running")


def test_read_write_once_pod_admits_one_pod_only(core, ns):
    claim(core, ns, "solo", modes=("ReadWriteOncePod",))
    sleep = [PY, "-c", "import time; time.sleep(60)"]
    mount = f"/tmp/kube-sim-mnt/{ns}"
    core.create_namespaced_pod(ns, with_volume(pod_body("one", sleep), "solo", mount, "node-a1"))
    wait_for(lambda: phase(core, ns, "one") == "Running")
    core.create_namespaced_pod(ns, with_volume(pod_body("two", sleep), "solo", mount, "node-a1"))
    message = wait_for(lambda: events(core, ns, "two", "FailedScheduling"))[0]
    assert message == (
        "0/3 nodes are available: node has pod using PersistentVolumeClaim with the same name "
        "and ReadWriteOncePod access mode."
    )


WRITE_HOME = """
import os, sys
home = os.environ["HOME"]
info = os.stat(home)
print(os.getuid(), os.getgid(), sorted(os.getgroups()), home, os.getcwd(),
      info.st_uid, info.st_gid, oct(info.st_mode & 0o7777), flush=True)
try:
    open(os.path.join(home, "notes.txt"), "w").write("kept")
except PermissionError as e:
    print("cannot write:", e.strerror, flush=True)
    sys.exit(1)
print("wrote", os.stat(os.path.join(home, "notes.txt")).st_gid, flush=True)
"""


def user_pod(name, claim_name, **security):
    body = pod_body(name, command=[PY, "-c", WRITE_HOME], restartPolicy="Never")
    body["spec"]["containers"][0]["image"] = USER_IMAGE
    if security:
        body["spec"]["securityContext"] = security
    return with_volume(body, claim_name, "/home/jovyan")


def finished_log(core, ns, name):
    wait_for(lambda: phase(core, ns, name) in ("Succeeded", "Failed"))
    return phase(core, ns, name), core.read_namespaced_pod_log(name, ns).split("\n")


def test_a_fresh_volume_is_owned_by_root_so_the_images_user_cannot_write_it(core, ns):
    claim(core, ns, "home")
    core.create_namespaced_pod(ns, user_pod("plain", "home"))
    result, lines = finished_log(core, ns, "plain")
    assert result == "Failed"
    assert lines[0] == "1000 100 [] /home/jovyan /home/jovyan 0 0 0o755"
    assert lines[1] == "cannot write: Permission denied"


def test_fs_group_makes_the_volume_the_pods_group_and_writable(core, ns):
    claim(core, ns, "home")
    core.create_namespaced_pod(ns, user_pod("grouped", "home", fsGroup=100))
    result, lines = finished_log(core, ns, "grouped")
    assert result == "Succeeded"
    assert lines[0] == "1000 100 [100] /home/jovyan /home/jovyan 0 100 0o2775"
    assert lines[1] == "wrote 100"  # setgid: new files get the volume's group
    # the same volume, another pod as another user of the group: the file is still there
    reader = pod_body(
        "reader",
        command=[PY, "-c", "print(open('/home/jovyan/notes.txt').read())"],
        restartPolicy="Never",
    )
    reader["spec"]["securityContext"] = {"runAsUser": 2000, "runAsGroup": 100}
    core.create_namespaced_pod(ns, with_volume(reader, "home", "/home/jovyan"))
    assert finished_log(core, ns, "reader") == ("Succeeded", ["kept", ""])


def test_run_as_user_sub_path_and_read_only_mounts(core, ns):
    claim(core, ns, "home")
    script = (
        "import os; print(os.getuid(), os.getgid(), os.path.isdir('/tmp/kube-sim-sub/' + "
        "os.environ['NS']), flush=True);"
        "open('/tmp/kube-sim-sub/' + os.environ['NS'] + '/f', 'w')"
    )
    body = pod_body(
        "ro", command=[PY, "-c", script], restartPolicy="Never", env=[{"name": "NS", "value": ns}]
    )
    body["spec"]["securityContext"] = {"runAsUser": 0}
    with_volume(body, "home", f"/tmp/kube-sim-sub/{ns}", subPath="inner", readOnly=True)
    core.create_namespaced_pod(ns, body)
    result, lines = finished_log(core, ns, "ro")
    assert result == "Failed"
    assert lines[0] == "0 0 True"
    assert any("Read-only file system" in line for line in lines)


def test_fs_group_change_policy_on_root_mismatch_skips_a_matching_volume(tmp_path):
    volume = tmp_path / "pv"
    (volume / "sub").mkdir(parents=True)
    (volume / "sub" / "f").write_text("x")
    os.chmod(volume / "sub" / "f", 0o600)
    apply_fs_group(str(volume), 100)
    info = os.stat(volume / "sub" / "f")
    assert (info.st_gid, oct(info.st_mode & 0o777)) == (100, "0o660")
    assert os.stat(volume / "sub").st_mode & 0o2070 == 0o2070  # setgid, group rwx
    os.chown(volume / "sub" / "f", -1, 0)  # a later change under a matching root ...
    apply_fs_group(str(volume), 100, policy="OnRootMismatch")
    assert os.stat(volume / "sub" / "f").st_gid == 0  # ... is left alone
    apply_fs_group(str(volume), 100)
    assert os.stat(volume / "sub" / "f").st_gid == 100


def test_the_process_user_comes_from_the_container_the_pod_then_the_image():
    images = {"example.org/notebook": ImageUser(1000, 100, "/home/jovyan")}
    pod = {"spec": {"securityContext": {"runAsUser": 2000, "fsGroup": 100}}}
    container = {"image": "example.org/notebook:1.0"}
    assert process_user(pod, container, images) == ProcessUser(2000, 0, (100,), "")
    container["securityContext"] = {"runAsUser": 1000}
    assert process_user(pod, container, images) == ProcessUser(1000, 100, (100,), "/home/jovyan")
    bare = {"spec": {}}
    assert process_user(bare, {"image": "other:1"}, images) == ProcessUser(0, 0, (), "")


def test_an_nfs_export_mounts_read_only_and_an_unknown_one_never_mounts(kube, core, ns, tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "train.csv").write_text("a,b\n")
    kube.cluster.volumes.nfs_exports[f"nfs.example.internal:/exports/{ns}"] = str(export)
    script = (
        "import os; d = '/tmp/kube-sim-nfs/' + os.environ['NS']; "
        "print(open(d + '/train.csv').read().strip(), flush=True); open(d + '/mine', 'w')"
    )

    def nfs_pod(name, path):
        body = pod_body(
            name,
            command=[PY, "-c", script],
            restartPolicy="Never",
            env=[{"name": "NS", "value": ns}],
        )
        body["spec"]["volumes"] = [
            {
                "name": "data",
                "nfs": {"server": "nfs.example.internal", "path": path, "readOnly": True},
            }
        ]
        body["spec"]["containers"][0]["volumeMounts"] = [
            {"name": "data", "mountPath": f"/tmp/kube-sim-nfs/{ns}", "readOnly": True}
        ]
        return body

    core.create_namespaced_pod(ns, nfs_pod("reader", f"/exports/{ns}"))
    result, lines = finished_log(core, ns, "reader")
    assert result == "Failed" and lines[0] == "a,b"
    assert any("Read-only file system" in line for line in lines)
    assert not (export / "mine").exists()

    core.create_namespaced_pod(ns, nfs_pod("lost", "/exports/none"))
    message = wait_for(lambda: events(core, ns, "lost", "FailedMount"))[0]
    assert message.startswith('MountVolume.SetUp failed for volume "data" : mount failed')
    assert "nfs.example.internal:/exports/none" in message
    assert phase(core, ns, "lost") == "Pending"
    assert waiting_reason(core, ns, "lost") == "ContainerCreating"
