"""Kubernetes semantics over the store: resource types, admission, deletion, binding (the
validation of each kind is validation.py).

The HTTP server is a thin edge over `Api`; the simulated scheduler and kubelet call the same
methods in-process, so a pod bound by the scheduler goes through the same code as a client's
POST to pods/binding.
"""

from __future__ import annotations

import base64
import copy
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_CEILING, Decimal
from typing import Any

from . import owners, storage
from .pod_security import restricted_violations
from .store import ApiError, Obj, Store, invalid, not_found, rfc3339, utcnow
from .validation import validate


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def list_kind(self) -> str:
        return self.kind + "List"


RESOURCE_TYPES = [
    ResourceType("", "v1", "Pod", "pods", True),
    ResourceType("", "v1", "Event", "events", True),
    ResourceType("", "v1", "Node", "nodes", False),
    ResourceType("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", True),
    ResourceType("", "v1", "PersistentVolume", "persistentvolumes", False),
    ResourceType("storage.k8s.io", "v1", "StorageClass", "storageclasses", False),
    ResourceType("", "v1", "Service", "services", True),
    ResourceType("", "v1", "Secret", "secrets", True),
    ResourceType("", "v1", "ConfigMap", "configmaps", True),
    ResourceType("", "v1", "ServiceAccount", "serviceaccounts", True),
    ResourceType("", "v1", "Namespace", "namespaces", False),
    ResourceType("scheduling.k8s.io", "v1", "PriorityClass", "priorityclasses", False),
    ResourceType("node.k8s.io", "v1", "RuntimeClass", "runtimeclasses", False),
    ResourceType("networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", True),
    ResourceType("rbac.authorization.k8s.io", "v1", "Role", "roles", True),
    ResourceType("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
    ResourceType("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True),
    ResourceType(
        "rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False
    ),
]
BY_PATH = {(r.api_version, r.plural): r for r in RESOURCE_TYPES}
BY_KIND = {(r.api_version, r.kind): r for r in RESOURCE_TYPES}
POD = BY_PATH[("v1", "pods")]
EVENT = BY_PATH[("v1", "events")]
NODE = BY_PATH[("v1", "nodes")]
NAMESPACE = BY_PATH[("v1", "namespaces")]
#: the namespace label Pod Security admission enforces a level by
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"
SECRET = BY_PATH[("v1", "secrets")]
CONFIGMAP = BY_PATH[("v1", "configmaps")]
PRIORITY_CLASS = BY_PATH[("scheduling.k8s.io/v1", "priorityclasses")]
RUNTIME_CLASS = BY_PATH[("node.k8s.io/v1", "runtimeclasses")]
SERVICE_ACCOUNT = BY_PATH[("v1", "serviceaccounts")]
ROLE = BY_PATH[("rbac.authorization.k8s.io/v1", "roles")]
CLUSTER_ROLE = BY_PATH[("rbac.authorization.k8s.io/v1", "clusterroles")]
ROLE_BINDING = BY_PATH[("rbac.authorization.k8s.io/v1", "rolebindings")]
CLUSTER_ROLE_BINDING = BY_PATH[("rbac.authorization.k8s.io/v1", "clusterrolebindings")]
PERSISTENT_VOLUME_CLAIM = BY_PATH[("v1", "persistentvolumeclaims")]
PERSISTENT_VOLUME = BY_PATH[("v1", "persistentvolumes")]
STORAGE_CLASS = BY_PATH[("storage.k8s.io/v1", "storageclasses")]

TERMINAL_PHASES = ("Succeeded", "Failed")
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")

# Pod spec fields Kubernetes lets an update change; everything else is immutable.
_MUTABLE_POD_SPEC = ("activeDeadlineSeconds", "tolerations", "containers", "initContainers")


@dataclass(frozen=True)
class Admission:
    """A client's write as validating admission plugins see it (admission.Attributes)."""

    operation: str  # CREATE or UPDATE
    rt: ResourceType
    namespace: str
    name: str
    subresource: str
    obj: Obj  # the object as it would be stored
    old: Obj | None  # on UPDATE, the object as it is
    user: Any  # whoever the authenticator said made the request


def _default_toleration_seconds(spec: Obj) -> None:
    """The DefaultTolerationSeconds admission plugin: every pod tolerates a NotReady or
    unreachable node for 300 s before it is evicted (NoExecute), unless it says otherwise."""
    tolerations = spec.setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") == key and t.get("effect") in (None, "", "NoExecute")
                   for t in tolerations):  # fmt: skip
            tolerations.append(
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            )


class Api:
    """The simulated API server's behaviour, independent of HTTP."""

    def __init__(self, store: Store | None = None):
        self.store = store or Store()
        #: plugins that may refuse a client's create or update (ApiError) once it is valid;
        #: writes from in-process controllers (scheduler, kubelet, collector) skip them
        self.validating_admission: list[Callable[[Admission], None]] = []
        for ns in DEFAULT_NAMESPACES:
            self.create(NAMESPACE, "", {"metadata": {"name": ns}})

    # -- generic verbs -------------------------------------------------------------------------

    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        obj = self.store.get(rt.api_version, rt.kind, namespace if rt.namespaced else "", name)
        if obj is None:
            raise not_found(rt.plural, name)
        return obj

    def find(self, rt: ResourceType, namespace: str, name: str) -> Obj | None:
        return self.store.get(rt.api_version, rt.kind, namespace if rt.namespaced else "", name)

    def list(
        self,
        rt: ResourceType,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        try:
            return self.store.list(
                rt.api_version, rt.kind, namespace, label_selector, field_selector
            )
        except ValueError as e:
            raise ApiError(400, "BadRequest", str(e)) from e

    def view(self, rt: ResourceType, namespace: str | None = None) -> list[Obj]:
        """The stored objects themselves, read-only (Store.view): for simulated controllers."""
        return self.store.view(rt.api_version, rt.kind, namespace)

    def create(self, rt: ResourceType, namespace: str, obj: Obj, requester: Any = None) -> Obj:
        """POST; ``requester`` (a client's identity) puts it through validating admission."""
        obj = copy.deepcopy(obj)
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta = obj.setdefault("metadata", {})
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise ApiError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request",
                )
            meta["namespace"] = namespace
            if self.find(NAMESPACE, "", namespace) is None:
                raise not_found("namespaces", namespace)
        else:
            meta.pop("namespace", None)
        validate(rt, obj)
        self._admit(rt, obj)
        if requester is not None:
            self._admission("CREATE", rt, namespace, "", obj, None, requester)
        created = self.store.create(obj, rt.plural)
        if rt.kind == "PersistentVolumeClaim":
            storage.reconcile_claim(self, created)
            return self.get(rt, namespace, created["metadata"]["name"])
        return created

    def _pod_security(self, pod: Obj) -> None:
        """Pod Security admission: a namespace labelled ``pod-security.kubernetes.io/enforce:
        restricted`` refuses a pod the restricted profile does not admit (pod_security.py)."""
        namespace = self.find(NAMESPACE, "", pod["metadata"]["namespace"]) or {}
        level = (namespace["metadata"].get("labels") or {}).get(PSA_ENFORCE) if namespace else None
        if level != "restricted":
            return
        violations = restricted_violations(pod["spec"])
        if violations:
            raise ApiError(
                403,
                "Forbidden",
                f'pods "{pod["metadata"].get("name", "")}" is forbidden: violates PodSecurity '
                f'"restricted:latest": {", ".join(violations)}',
            )

    def _admit(self, rt: ResourceType, obj: Obj) -> None:
        """Defaults the real API server and its admission plugins would fill in."""
        if rt.kind == "Pod":
            spec = obj["spec"]
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("dnsPolicy", "ClusterFirst")
            for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
                for amounts in (container.get("resources") or {}).values():
                    for key, amount in amounts.items():
                        if isinstance(amount, int | float) and not isinstance(amount, bool):
                            amounts[key] = canonical_quantity(amount)
            pc_name = spec.get("priorityClassName")
            if pc_name:
                pc = self.find(PRIORITY_CLASS, "", pc_name)
                if pc is None:
                    raise ApiError(
                        403,
                        "Forbidden",
                        f'pods "{obj["metadata"].get("name", "")}" is forbidden: no PriorityClass '
                        f"with name {pc_name} was found",
                    )
                spec["priority"] = pc["value"]
                # the Priority admission plugin copies the class's preemption policy too
                spec["preemptionPolicy"] = pc.get("preemptionPolicy") or "PreemptLowerPriority"
            else:
                default = [p for p in self.list(PRIORITY_CLASS) if p.get("globalDefault")]
                spec.setdefault("priority", default[0]["value"] if default else 0)
                spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
            self._runtime_class(obj)
            _default_toleration_seconds(spec)
            self._pod_security(obj)
            obj["status"] = {"phase": "Pending", "qosClass": _qos_class(spec)}
        elif rt.kind == "Namespace":
            obj["status"] = {"phase": "Active"}
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            labels = obj["metadata"].setdefault("labels", {})
            labels["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
        elif rt.kind == "Secret":
            _fold_string_data(obj)
            obj.setdefault("type", "Opaque")
        elif rt.kind == "Service":
            spec = obj.setdefault("spec", {})
            spec.setdefault("type", "ClusterIP")
            if spec.get("clusterIP") != "None":
                spec["clusterIP"] = f"10.96.{secrets.randbelow(256)}.{1 + secrets.randbelow(254)}"
                spec["clusterIPs"] = [spec["clusterIP"]]
            for port in spec.get("ports") or []:
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))
            obj.setdefault("status", {"loadBalancer": {}})
        elif rt.kind == "PersistentVolumeClaim":
            storage.admit_claim(self, obj)
        elif rt.kind == "StorageClass":
            obj.setdefault("volumeBindingMode", "Immediate")
            obj.setdefault("reclaimPolicy", "Delete")

    def _runtime_class(self, pod: Obj) -> None:
        """The RuntimeClass admission plugin: a pod naming a RuntimeClass that does not exist
        is refused (403); the class's scheduling node selector and tolerations join the
        pod's (a selector naming another value for the same label is refused)."""
        spec, name = pod["spec"], pod["metadata"].get("name", "")
        class_name = spec.get("runtimeClassName")
        if not class_name:
            return
        rc = self.find(RUNTIME_CLASS, "", class_name)
        if rc is None:
            raise ApiError(
                403,
                "Forbidden",
                f'pods "{name}" is forbidden: pod rejected: RuntimeClass "{class_name}" not found',
            )
        scheduling = rc.get("scheduling") or {}
        selector = spec.get("nodeSelector") or {}
        for key, value in (scheduling.get("nodeSelector") or {}).items():
            if selector.get(key, value) != value:
                raise ApiError(
                    403,
                    "Forbidden",
                    f'pods "{name}" is forbidden: pod rejected: conflict: '
                    f"RuntimeClass.scheduling.nodeSelector[{key}] = {value}; "
                    f"pod.spec.nodeSelector[{key}] = {selector[key]}",
                )
            spec.setdefault("nodeSelector", {})[key] = value
        for toleration in scheduling.get("tolerations") or []:
            if toleration not in (spec.get("tolerations") or []):
                spec.setdefault("tolerations", []).append(dict(toleration))

    def _admission(
        self,
        operation: str,
        rt: ResourceType,
        namespace: str,
        subresource: str,
        obj: Obj,
        old: Obj | None,
        requester: Any,
    ) -> None:
        name = obj["metadata"].get("name") or ""
        request = Admission(operation, rt, namespace, name, subresource, obj, old, requester)
        for plugin in self.validating_admission:
            plugin(request)

    def replace(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        obj: Obj,
        subresource: str = "",
        requester: Any = None,
    ) -> Obj:
        """PUT: the status subresource changes only status; the main resource never does.
        ``requester`` (a client's identity) puts it through validating admission."""
        current = self.get(rt, namespace, name)
        obj = copy.deepcopy(obj)
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        meta = obj.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise ApiError(
                400, "BadRequest", "the name of the object does not match the name on the URL"
            )
        meta["name"] = name
        if rt.namespaced:
            meta["namespace"] = namespace
        if subresource == "status":
            new = copy.deepcopy(current)
            new["status"] = obj.get("status") or {}
            new["metadata"]["resourceVersion"] = meta.get("resourceVersion")
            obj = new
        else:
            validate(rt, obj)
            if "status" in current:
                obj["status"] = current["status"]
            if rt.kind == "Pod":
                self._check_pod_update(current, obj)
            if rt.kind == "Secret":
                _fold_string_data(obj)
            if rt.kind.endswith("RoleBinding") and obj.get("roleRef") != current.get("roleRef"):
                ref = obj.get("roleRef") or {}
                raise invalid(
                    f"{rt.kind}.{rt.group}",
                    rt.plural,
                    name,
                    f'roleRef: Invalid value: rbac.RoleRef{{APIGroup:"{ref.get("apiGroup", "")}", '
                    f'Kind:"{ref.get("kind", "")}", Name:"{ref.get("name", "")}"}}: cannot change '
                    "roleRef",
                )
        if requester is not None:
            self._admission("UPDATE", rt, namespace, subresource, obj, current, requester)
        return self.store.replace(obj, rt.plural)

    @staticmethod
    def _check_pod_update(current: Obj, new: Obj) -> None:
        old_spec = {k: v for k, v in current["spec"].items() if k not in _MUTABLE_POD_SPEC}
        new_spec = {k: v for k, v in new["spec"].items() if k not in _MUTABLE_POD_SPEC}
        # the server fills these defaults, so a client omitting them changes nothing
        for k in (
            "nodeName",
            "priority",
            "restartPolicy",
            "terminationGracePeriodSeconds",
            "schedulerName",
            "dnsPolicy",
        ):
            if k in old_spec:
                new_spec.setdefault(k, old_spec[k])
        old_names = [c.get("name") for c in current["spec"]["containers"]]
        new_names = [c.get("name") for c in new["spec"]["containers"]]
        if old_spec != new_spec or old_names != new_names:
            name = current["metadata"]["name"]
            raise invalid(
                "Pod",
                "pods",
                name,
                "spec: Forbidden: pod updates may not change fields other than "
                "`spec.containers[*].image`, `spec.activeDeadlineSeconds` or "
                "`spec.tolerations` (only additions to existing tolerations)",
            )

    def delete(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        grace_seconds: int | None = None,
        propagation: str = "Background",
    ) -> Obj:
        """Delete; a pod on a node becomes Terminating until its kubelet removes it. Its
        dependents go after it (gc.py), or with ``propagation`` "Orphan" lose their
        references to it and stay ("Foreground" is carried out as "Background")."""
        current = self.get(rt, namespace, name)
        ns = namespace if rt.namespaced else ""
        if propagation == "Orphan":
            owners.orphan_dependents(self, current)
        if rt.kind == "Pod":
            if grace_seconds is None:
                grace_seconds = current["spec"].get("terminationGracePeriodSeconds", 30)
            phase = (current.get("status") or {}).get("phase")
            bound = bool(current["spec"].get("nodeName"))
            if grace_seconds > 0 and bound and phase not in TERMINAL_PHASES:
                return self.store.mark_deleting(
                    rt.api_version, rt.kind, ns, name, rt.plural, grace_seconds
                )
        if rt.kind == "Namespace":
            for other in RESOURCE_TYPES:
                if not other.namespaced:
                    continue
                for obj in self.list(other, name):
                    try:
                        self.delete(other, name, obj["metadata"]["name"])
                    except ApiError:
                        pass
        removed = self.store.remove(rt.api_version, rt.kind, ns, name, rt.plural)
        if rt.kind == "PersistentVolumeClaim":
            storage.release(self, removed)
        return removed

    # -- pods ----------------------------------------------------------------------------------

    def bind(self, namespace: str, name: str, node: str) -> Obj:
        """The pods/binding subresource: assign a Pending pod to a node."""
        pod = self.get(POD, namespace, name)
        if pod["spec"].get("nodeName"):
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods/binding "{name}": pod {name} is already '
                f'assigned to node "{pod["spec"]["nodeName"]}"',
                name,
                "pods/binding",
            )
        if pod["metadata"].get("deletionTimestamp"):
            raise ApiError(
                409,
                "Conflict",
                f"pod {name} is being deleted, cannot be assigned to a host",
                name,
                "pods/binding",
            )
        self.get(NODE, "", node)

        def assign(p: Obj) -> None:
            p["spec"]["nodeName"] = node
            p["status"].pop("nominatedNodeName", None)
            set_condition(p, "PodScheduled", "True")

        return self.store.update(POD.api_version, POD.kind, namespace, name, POD.plural, assign)

    def update(self, rt: ResourceType, namespace: str, name: str, mutate) -> Obj:
        """Mutate any object in place, as a controller writing it."""
        ns = namespace if rt.namespaced else ""
        return self.store.update(rt.api_version, rt.kind, ns, name, rt.plural, mutate)

    def update_status(self, namespace: str, name: str, mutate) -> Obj | None:
        """Mutate a pod's status in place; None if the pod is gone."""
        if self.find(POD, namespace, name) is None:
            return None
        return self.store.update(POD.api_version, POD.kind, namespace, name, POD.plural, mutate)

    def record_event(
        self,
        involved: Obj,
        reason: str,
        message: str,
        type_: str = "Normal",
        component: str = "default-scheduler",
        host: str = "",
        at: datetime | None = None,
    ) -> Obj:
        """Create a core/v1 Event about an object, as a controller would; its times are
        ``at`` on the reporter's clock (a kubelet's is its node's), else the server's."""
        meta = involved["metadata"]
        namespace = meta.get("namespace") or "default"
        now = rfc3339(at or self.store.clock())
        event = {
            "metadata": {
                "name": f"{meta['name']}.{secrets.token_hex(8)}",
                "namespace": namespace,
            },
            "involvedObject": {
                "apiVersion": involved.get("apiVersion", "v1"),
                "kind": involved.get("kind", "Pod"),
                "name": meta["name"],
                "namespace": meta.get("namespace", ""),
                "uid": meta.get("uid", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": component, **({"host": host} if host else {})},
            "reportingComponent": component,
            "reportingInstance": host,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        if self.find(NAMESPACE, "", namespace) is None:
            return event
        return self.create(EVENT, namespace, event)


def set_condition(pod: Obj, type_: str, status: str, reason: str = "", message: str = "") -> None:
    """Set one status condition, keeping lastTransitionTime when the status is unchanged."""
    conditions = pod.setdefault("status", {}).setdefault("conditions", [])
    now = rfc3339(utcnow())
    for c in conditions:
        if c["type"] == type_:
            if c["status"] != status:
                c["lastTransitionTime"] = now
            c["status"] = status
            _set_optional(c, reason, message)
            return
    c = {"type": type_, "status": status, "lastProbeTime": None, "lastTransitionTime": now}
    _set_optional(c, reason, message)
    conditions.append(c)


def _set_optional(c: dict[str, Any], reason: str, message: str) -> None:
    for k, v in (("reason", reason), ("message", message)):
        if v:
            c[k] = v
        else:
            c.pop(k, None)


def _fold_string_data(obj: Obj) -> None:
    string_data = obj.pop("stringData", None) or {}
    if string_data:
        data = obj.setdefault("data", {})
        for k, v in string_data.items():
            data[k] = base64.b64encode(v.encode()).decode()


#: decimal SI suffixes, largest first, by power of ten
_DECIMAL_SI = [("E", 18), ("P", 15), ("T", 12), ("G", 9), ("M", 6), ("k", 3), ("", 0), ("m", -3)]


def canonical_quantity(number: int | float) -> str:
    """A quantity sent as a JSON number, as the API server stores and answers it: apimachinery's
    Quantity parses unquoted numbers, rounds them up to three decimals (0.0001 -> "1m") and
    serializes the canonical form, the largest suffix that leaves an integer (1.71 -> "1710m",
    2000 -> "2k"); see k8s.io/apimachinery/pkg/api/resource/quantity.go."""
    milli = int((Decimal(str(number)) * 1000).to_integral_value(rounding=ROUND_CEILING))
    if milli == 0:
        return "0"
    # "m" (10**0 milli) divides every integer, so one always fits
    suffix, factor = next(
        (suffix, 10 ** (power + 3))
        for suffix, power in _DECIMAL_SI
        if milli % 10 ** (power + 3) == 0
    )
    return f"{milli // factor}{suffix}"


def _qos_class(spec: Obj) -> str:
    resources = [c.get("resources") or {} for c in spec.get("containers", [])]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    guaranteed = all(
        (r.get("limits") or {}).get(k)
        and (r.get("requests") or r.get("limits"))[k] == r["limits"][k]
        for r in resources
        for k in ("cpu", "memory")
    )
    return "Guaranteed" if guaranteed else "Burstable"
