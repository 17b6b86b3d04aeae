"""Storage as the PV controller, the volume scheduler plugins and the attach/detach controller
see it: StorageClasses, dynamically provisioned PersistentVolumes, binding modes, zones and
access modes.

Followed (Kubernetes v1.31): pkg/controller/volume/persistentvolume/pv_controller.go (the
WaitForFirstConsumer event, "waiting for first consumer to be created before binding"; a claim
of no class with no default waits for a PV), pkg/scheduler/framework/plugins/volumebinding
("node(s) had volume node affinity conflict", "node(s) didn't find available persistent
volumes to bind", "pod has unbound immediate PersistentVolumeClaims"),
plugins/volumerestrictions (ReadWriteOncePod), and
pkg/controller/volume/attachdetach/reconciler ("Multi-Attach error for volume ... Volume is
already used by pod(s) ..."). Every provisioned volume is a block device that attaches to one
node unless the claim asks for ReadWriteMany or ReadOnlyMany (a shared file system).
"""

from __future__ import annotations

import secrets

# a module import: api.py imports this module while it is being defined
from . import api as kube
from .store import Obj

ZONE_LABEL = "topology.kubernetes.io/zone"
DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
SELECTED_NODE_ANNOTATION = "volume.kubernetes.io/selected-node"
SHARED_MODES = ("ReadWriteMany", "ReadOnlyMany")
# CSI drivers of shared file systems, the only ones that serve ReadWriteMany / ReadOnlyMany;
# every other provisioner makes block volumes that attach to one node
FILE_PROVISIONERS = (
    "nfs.csi.k8s.io",
    "filestore.csi.storage.gke.io",
    "efs.csi.aws.com",
    "file.csi.azure.com",
    "cephfs.csi.ceph.com",
)

NODE_CONFLICT = "node(s) had volume node affinity conflict"
BIND_CONFLICT = "node(s) didn't find available persistent volumes to bind"
UNBOUND_IMMEDIATE = "pod has unbound immediate PersistentVolumeClaims"
RWOP_CONFLICT = (
    "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode"
)

# What a typical cloud cluster offers: a default zonal block-storage class that binds where the
# first pod lands (as GKE's standard-rwo, EKS's gp3, AKS's managed-csi), ReadWriteOnce only
STANDARD_CLASSES = [
    {
        "metadata": {
            "name": "standard-rwo",
            "annotations": {DEFAULT_CLASS_ANNOTATION: "true"},
        },
        "provisioner": "pd.csi.storage.gke.io",
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
        "allowVolumeExpansion": True,
    }
]


def pod_claims(pod: Obj) -> list[str]:
    """The names of the claims a pod's volumes use, in volume order."""
    return [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"].get("volumes") or []
        if v.get("persistentVolumeClaim")
    ]


def default_class(api: kube.Api) -> Obj | None:
    """The StorageClass annotated as default (the newest when several are, as Kubernetes
    since 1.26 picks)."""
    defaults = [
        c
        for c in api.list(kube.STORAGE_CLASS)
        if (c["metadata"].get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION) == "true"
    ]
    return max(defaults, key=lambda c: c["metadata"]["creationTimestamp"], default=None)


def class_of(api: kube.Api, claim: Obj) -> Obj | None:
    name = claim["spec"].get("storageClassName")
    return api.find(kube.STORAGE_CLASS, "", name) if name else None


def _topology_zones(storage_class: Obj) -> list[str] | None:
    """The zones a class's allowedTopologies allow; None when it does not restrict them."""
    zones = [
        value
        for term in storage_class.get("allowedTopologies") or []
        for expr in term.get("matchLabelExpressions") or []
        if expr.get("key") == ZONE_LABEL
        for value in expr.get("values") or []
    ]
    return zones or None


def admit_claim(api: kube.Api, claim: Obj) -> None:
    """Admission (the DefaultStorageClass plugin): a claim naming no class gets the default."""
    spec = claim["spec"]
    spec.setdefault("volumeMode", "Filesystem")
    if "storageClassName" not in spec:
        default = default_class(api)
        if default is not None:
            spec["storageClassName"] = default["metadata"]["name"]
    claim["status"] = {"phase": "Pending"}


def reconcile_claim(api: kube.Api, claim: Obj) -> None:
    """What the PV controller does with a new claim: provision now (Immediate), wait for a
    pod (WaitForFirstConsumer), or say why it cannot."""
    storage_class = class_of(api, claim)
    name = claim["spec"].get("storageClassName")
    if storage_class is None:
        if name:
            message = f'storageclass.storage.k8s.io "{name}" not found'
            api.record_event(
                claim, "ProvisioningFailed", message, "Warning", "persistentvolume-controller"
            )
        else:
            message = "no persistent volumes available for this claim and no storage class is set"
            api.record_event(
                claim, "FailedBinding", message, "Normal", "persistentvolume-controller"
            )
        return
    if storage_class.get("volumeBindingMode") == "WaitForFirstConsumer":
        api.record_event(
            claim,
            "WaitForFirstConsumer",
            "waiting for first consumer to be created before binding",
            "Normal",
            "persistentvolume-controller",
        )
        return
    zones = _topology_zones(storage_class)
    provision(api, claim, storage_class, zones[0] if zones else "")


def provisioning_error(claim: Obj, storage_class: Obj) -> str | None:
    """Why the class's driver cannot make the claim's volume (a block driver asked for a
    volume many nodes write), or None."""
    shared = [m for m in claim["spec"]["accessModes"] if m in SHARED_MODES]
    if shared and storage_class["provisioner"] not in FILE_PROVISIONERS:
        return (
            f'failed to provision volume with StorageClass "{storage_class["metadata"]["name"]}": '
            f"rpc error: code = InvalidArgument desc = access mode {shared[0]} is not supported "
            f"by {storage_class['provisioner']} (block volumes attach to one node)"
        )
    return None


def provision(api: kube.Api, claim: Obj, storage_class: Obj, zone: str) -> Obj | None:
    """Create the claim's PersistentVolume (in `zone`, "" for none) and bind the two; None
    (and a ProvisioningFailed event) when the driver cannot."""
    error = provisioning_error(claim, storage_class)
    if error:
        api.record_event(
            claim, "ProvisioningFailed", error, "Warning", storage_class["provisioner"]
        )
        return None
    meta = claim["metadata"]
    pv_name = f"pvc-{meta['uid']}" if meta.get("uid") else f"pvc-{secrets.token_hex(8)}"
    spec = {
        "capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
        "accessModes": list(claim["spec"]["accessModes"]),
        "volumeMode": claim["spec"].get("volumeMode", "Filesystem"),
        "storageClassName": storage_class["metadata"]["name"],
        "persistentVolumeReclaimPolicy": storage_class.get("reclaimPolicy", "Delete"),
        "claimRef": {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta.get("uid", ""),
        },
        "csi": {"driver": storage_class["provisioner"], "volumeHandle": pv_name},
    }
    if zone:
        spec["nodeAffinity"] = {
            "required": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": ZONE_LABEL, "operator": "In", "values": [zone]}]}
                ]
            }
        }
    labels = {ZONE_LABEL: zone} if zone else {}
    pv = api.create(
        kube.PERSISTENT_VOLUME,
        "",
        {
            "metadata": {"name": pv_name, "labels": labels},
            "spec": spec,
            "status": {"phase": "Bound"},
        },
    )

    def bind(c: Obj) -> None:
        c["spec"]["volumeName"] = pv_name
        c["status"] = {
            "phase": "Bound",
            "accessModes": spec["accessModes"],
            "capacity": dict(spec["capacity"]),
        }
        annotations = c["metadata"].setdefault("annotations", {})
        annotations["pv.kubernetes.io/bind-completed"] = "yes"
        annotations["pv.kubernetes.io/bound-by-controller"] = "yes"

    bound = api.update(kube.PERSISTENT_VOLUME_CLAIM, meta["namespace"], meta["name"], bind)
    api.record_event(
        bound,
        "ProvisioningSucceeded",
        f"Successfully provisioned volume {pv_name}",
        "Normal",
        storage_class["provisioner"],
    )
    return pv


def release(api: kube.Api, claim: Obj) -> None:
    """A deleted claim's volume goes as its reclaim policy says: deleted, or kept Released."""
    volume = claim["spec"].get("volumeName")
    pv = api.find(kube.PERSISTENT_VOLUME, "", volume) if volume else None
    if pv is None:
        return
    if pv["spec"].get("persistentVolumeReclaimPolicy") == "Delete":
        api.delete(kube.PERSISTENT_VOLUME, "", volume)
    else:
        api.update(
            kube.PERSISTENT_VOLUME, "", volume, lambda p: p.update(status={"phase": "Released"})
        )


def _node_affinity_matches(pv: Obj, labels: dict[str, str]) -> bool:
    # imported here: the scheduler imports this module for its volume filters
    from .scheduler import _expression_matches

    terms = (((pv["spec"].get("nodeAffinity") or {}).get("required")) or {}).get(
        "nodeSelectorTerms"
    )
    if not terms:
        return True
    return any(
        all(_expression_matches(e, labels) for e in t.get("matchExpressions") or []) for t in terms
    )


def _uses(pod: Obj, claim: str) -> bool:
    return claim in pod_claims(pod)


def _holds(pod: Obj) -> bool:
    """Whether a pod still holds its volumes: bound and not finished (Terminating counts)."""
    return (
        bool(pod["spec"].get("nodeName"))
        and (pod.get("status") or {}).get("phase") not in kube.TERMINAL_PHASES
    )


def prefilter(api: kube.Api, pod: Obj, pods: list[Obj]) -> str | None:
    """Why no node can take the pod for its claims (kube-scheduler's PreFilter), or None."""
    ns = pod["metadata"]["namespace"]
    for name in pod_claims(pod):
        claim = api.find(kube.PERSISTENT_VOLUME_CLAIM, ns, name)
        if claim is None:
            return f'persistentvolumeclaim "{name}" not found'
        if claim["metadata"].get("deletionTimestamp"):
            return f'persistentvolumeclaim "{name}" is being deleted'
        if "ReadWriteOncePod" in claim["spec"]["accessModes"] and any(
            p["metadata"]["uid"] != pod["metadata"]["uid"]
            and p["metadata"]["namespace"] == ns
            and _holds(p)
            and _uses(p, name)
            for p in pods
        ):
            return RWOP_CONFLICT
        if claim["status"].get("phase") != "Bound":
            storage_class = class_of(api, claim)
            if storage_class is None or storage_class.get("volumeBindingMode") != (
                "WaitForFirstConsumer"
            ):
                return UNBOUND_IMMEDIATE
            error = provisioning_error(claim, storage_class)
            if error:
                return error
    return None


def node_reason(api: kube.Api, pod: Obj, node: Obj) -> str | None:
    """Why the pod's volumes rule a node out (the VolumeBinding filter), or None."""
    labels = node["metadata"].get("labels") or {}
    ns = pod["metadata"]["namespace"]
    for name in pod_claims(pod):
        claim = api.find(kube.PERSISTENT_VOLUME_CLAIM, ns, name)
        if claim is None:
            continue
        volume = claim["spec"].get("volumeName")
        if volume:
            pv = api.find(kube.PERSISTENT_VOLUME, "", volume)
            if pv is not None and not _node_affinity_matches(pv, labels):
                return NODE_CONFLICT
            continue
        storage_class = class_of(api, claim)
        zones = _topology_zones(storage_class) if storage_class else None
        if zones is not None and labels.get(ZONE_LABEL) not in zones:
            return BIND_CONFLICT
    return None


def bind_for(api: kube.Api, pod: Obj, node: Obj) -> None:
    """Before binding the pod: provision its waiting claims in the node's zone (the scheduler
    sets the selected-node annotation; the provisioner creates the volume there)."""
    ns = pod["metadata"]["namespace"]
    zone = (node["metadata"].get("labels") or {}).get(ZONE_LABEL, "")
    for name in pod_claims(pod):
        claim = api.find(kube.PERSISTENT_VOLUME_CLAIM, ns, name)
        if claim is None or claim["spec"].get("volumeName"):
            continue
        storage_class = class_of(api, claim)
        if storage_class is None:
            continue

        def select(c: Obj) -> None:
            c["metadata"].setdefault("annotations", {})[SELECTED_NODE_ANNOTATION] = node[
                "metadata"
            ]["name"]

        claim = api.update(kube.PERSISTENT_VOLUME_CLAIM, ns, name, select)
        provision(api, claim, storage_class, zone)


def attach_conflict(api: kube.Api, pod: Obj, pods: list[Obj]) -> tuple[str, list[str]] | None:
    """A volume of the pod attached to another node for other pods: (PV name, those pods'
    names); None when every volume can attach to the pod's node."""
    ns, node = pod["metadata"]["namespace"], pod["spec"].get("nodeName")
    for name in pod_claims(pod):
        claim = api.find(kube.PERSISTENT_VOLUME_CLAIM, ns, name)
        if claim is None or not claim["spec"].get("volumeName"):
            continue
        if any(m in SHARED_MODES for m in claim["spec"]["accessModes"]):
            continue
        users = [
            p["metadata"]["name"]
            for p in pods
            if p["metadata"]["uid"] != pod["metadata"]["uid"]
            and p["metadata"]["namespace"] == ns
            and p["spec"].get("nodeName") not in (None, node)
            and _holds(p)
            and _uses(p, name)
        ]
        if users:
            return claim["spec"]["volumeName"], sorted(users)
    return None


def multi_attach_message(volume: str, users: list[str]) -> str:
    return f'Multi-Attach error for volume "{volume}" Volume is already used by pod(s) ' + (
        ", ".join(users)
    )
