"""Kubernetes' validation of an object before it is stored: its metadata (owner references,
owners.py), then its kind's own fields, refused with a 422 Status in the API server's words
(kubernetes/pkg/apis/*/validation). Pure: raises ApiError or returns.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING

from . import owners
from .store import Obj, invalid

if TYPE_CHECKING:
    from .api import ResourceType

ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")
BINDING_MODES = ("Immediate", "WaitForFirstConsumer")


def validate(rt: ResourceType, obj: Obj) -> None:
    """Refuse ``obj`` (422) where it is not a valid object of its kind."""
    # the object's metadata is validated before its kind's own fields, as ValidateObjectMeta
    # comes first in every kind's validation
    owners.check_owner_references(rt, obj)
    name = obj["metadata"].get("name") or obj["metadata"].get("generateName", "")
    spec = obj.get("spec") or {}
    if rt.kind == "Pod":
        containers = spec.get("containers")
        if not containers:
            raise invalid("Pod", rt.plural, name, "spec.containers: Required value")
        for i, c in enumerate(containers):
            if not c.get("name"):
                raise invalid("Pod", rt.plural, name, f"spec.containers[{i}].name: Required value")
            if not c.get("image"):
                raise invalid("Pod", rt.plural, name, f"spec.containers[{i}].image: Required value")
    elif rt.kind == "PersistentVolumeClaim":
        if not spec.get("accessModes"):
            raise invalid(
                rt.kind,
                rt.plural,
                name,
                "spec.accessModes: Required value: at least 1 access mode is required",
            )
        for i, mode in enumerate(spec["accessModes"]):
            if mode not in ACCESS_MODES:
                supported = ", ".join(f'"{m}"' for m in ACCESS_MODES)
                raise invalid(
                    rt.kind,
                    rt.plural,
                    name,
                    f'spec.accessModes[{i}]: Unsupported value: "{mode}": supported values: '
                    f"{supported}",
                )
        if "ReadWriteOncePod" in spec["accessModes"] and len(spec["accessModes"]) > 1:
            raise invalid(
                rt.kind,
                rt.plural,
                name,
                "spec.accessModes: Forbidden: may not use ReadWriteOncePod with other access modes",
            )
        if not ((spec.get("resources") or {}).get("requests") or {}).get("storage"):
            raise invalid(rt.kind, rt.plural, name, "spec.resources[storage]: Required value")
    elif rt.kind == "StorageClass":
        if not obj.get("provisioner"):
            raise invalid(rt.kind, rt.plural, name, "provisioner: Required value")
        mode = obj.get("volumeBindingMode", "Immediate")
        if mode not in BINDING_MODES:
            raise invalid(
                rt.kind,
                rt.plural,
                name,
                f'volumeBindingMode: Unsupported value: "{mode}": supported values: '
                '"Immediate", "WaitForFirstConsumer"',
            )
    elif rt.kind == "PriorityClass":
        if not isinstance(obj.get("value"), int):
            raise invalid(rt.kind, rt.plural, name, "value: Required value")
    elif rt.kind in ("Role", "ClusterRole"):
        _validate_rules(rt, name, obj)
    elif rt.kind in ("RoleBinding", "ClusterRoleBinding"):
        _validate_binding(rt, name, obj)
    elif rt.kind == "Secret":
        for k, v in (obj.get("data") or {}).items():
            try:
                base64.b64decode(v, validate=True)
            except ValueError as e:
                raise invalid(rt.kind, rt.plural, name, f"data[{k}]: illegal base64 data") from e


def _validate_rules(rt: ResourceType, name: str, obj: Obj) -> None:
    """kubernetes/pkg/apis/rbac/validation: each rule has verbs, and either resources with
    API groups or (in a ClusterRole only) non-resource URLs."""
    kind = f"{rt.kind}.{rt.group}"
    for i, rule in enumerate(obj.get("rules") or []):
        where = f"rules[{i}]"
        if not rule.get("verbs"):
            raise invalid(
                kind,
                rt.plural,
                name,
                f"{where}.verbs: Required value: verbs must contain at least one value",
            )
        if rule.get("nonResourceURLs"):
            if rt.namespaced:
                raise invalid(
                    kind,
                    rt.plural,
                    name,
                    f"{where}.nonResourceURLs: Invalid value: {rule['nonResourceURLs']}: "
                    "namespaced rules cannot apply to non-resource URLs",
                )
            continue
        if not rule.get("apiGroups"):
            raise invalid(
                kind,
                rt.plural,
                name,
                f"{where}.apiGroups: Required value: resource rules must supply at least one "
                "api group",
            )
        if not rule.get("resources"):
            raise invalid(
                kind,
                rt.plural,
                name,
                f"{where}.resources: Required value: resource rules must supply at least one "
                "resource",
            )


def _validate_binding(rt: ResourceType, name: str, obj: Obj) -> None:
    kind = f"{rt.kind}.{rt.group}"
    ref = obj.get("roleRef") or {}
    supported = ["Role", "ClusterRole"] if rt.namespaced else ["ClusterRole"]
    if ref.get("kind") not in supported:
        values = ", ".join(f'"{v}"' for v in supported)
        raise invalid(
            kind,
            rt.plural,
            name,
            f'roleRef.kind: Unsupported value: "{ref.get("kind", "")}": supported values: {values}',
        )
    if ref.get("apiGroup") != "rbac.authorization.k8s.io":
        raise invalid(
            kind,
            rt.plural,
            name,
            f'roleRef.apiGroup: Unsupported value: "{ref.get("apiGroup", "")}": supported '
            'values: "rbac.authorization.k8s.io"',
        )
    if not ref.get("name"):
        raise invalid(kind, rt.plural, name, "roleRef.name: Required value")
    for i, subject in enumerate(obj.get("subjects") or []):
        # a RoleBinding's ServiceAccount defaults to the binding's namespace
        if subject.get("kind") == "ServiceAccount" and not (
            rt.namespaced or subject.get("namespace")
        ):
            raise invalid(kind, rt.plural, name, f"subjects[{i}].namespace: Required value")
