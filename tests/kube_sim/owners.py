"""metadata.ownerReferences as the API server treats them: their validation (422), the
OwnerReferencesPermissionEnforcement admission plugin (403), and the delete options that
say what becomes of an owner's dependents (propagationPolicy). The garbage collector that
acts on the references is gc.py.

Followed (Kubernetes v1.31): apimachinery/pkg/api/validation/objectmeta.go
(`ValidateOwnerReferences`: every reference needs apiVersion, kind, name and uid, an Event may
not own anything, at most one reference is the controller; the field path is
`metadata.ownerReferences` without an index), plugin/pkg/admission/gc/gc_admission.go (on
create, a reference that sets blockOwnerDeletion needs `update` of the owner's `finalizers`
subresource; on update, changing the references at all needs `delete` of the object itself,
and a reference newly blocking needs the finalizers permission too; pods/status is exempt;
refusals are 403 Forbidden, whatever the field's documentation says about 422), and
apimachinery/pkg/apis/meta/v1/validation (`ValidateDeleteOptions`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# a module import: api.py imports this module while it is being defined
from . import api as kube
from .store import ApiError, Obj

PROPAGATION_POLICIES = ("Foreground", "Background", "Orphan")
# BannedOwners: (group, version, kind) that may not own anything
BANNED_OWNERS = {("", "v1", "Event")}
# the one subresource the plugin lets through (its whiteList)
EXEMPT_SUBRESOURCES = {("pods", "status")}


# -- validation (pure) ---------------------------------------------------------------------


def parse_group_version(api_version: str) -> tuple[str, str] | None:
    """`schema.ParseGroupVersion`: "v1" -> ("", "v1"), "apps/v1" -> ("apps", "v1"); None
    when it has more than one slash (the whole GroupVersionKind is then empty)."""
    if api_version.count("/") > 1:
        return None
    group, _, version = api_version.rpartition("/")
    return group, version


def _go_value(value: Any) -> str:
    """A value as field.Invalid prints it: strings quoted, structs and lists as JSON."""
    return json.dumps(value, separators=(",", ":"))


def _reference_json(ref: Obj) -> Obj:
    """An OwnerReference as Go marshals it: its fields in declaration order, unset ones out."""
    keys = ("apiVersion", "kind", "name", "uid", "controller", "blockOwnerDeletion")
    return {k: ref[k] for k in keys if ref.get(k) is not None}


@dataclass(frozen=True)
class FieldError:
    """One `field.Error` of type Invalid."""

    field: str
    value: Any
    detail: str

    def __str__(self) -> str:
        return f"{self.field}: Invalid value: {_go_value(self.value)}: {self.detail}"

    def cause(self) -> Obj:
        """The Status cause the API server lists for it."""
        return {
            "reason": "FieldValueInvalid",
            "message": f"Invalid value: {_go_value(self.value)}: {self.detail}",
            "field": self.field,
        }


def owner_reference_errors(refs: list[Obj]) -> list[FieldError]:
    """`ValidateOwnerReferences` on metadata.ownerReferences: [] when they are valid."""
    path = "metadata.ownerReferences"
    errors: list[FieldError] = []
    first_controller = ""
    for ref in refs:
        api_version, kind = ref.get("apiVersion") or "", ref.get("kind") or ""
        gv = parse_group_version(api_version)
        # an apiVersion that does not parse leaves the whole GroupVersionKind empty
        group, version = gv if gv else ("", "")
        name, uid = ref.get("name") or "", ref.get("uid") or ""
        if not version:
            errors.append(
                FieldError(f"{path}.apiVersion", api_version, "version must not be empty")
            )
        if not kind or gv is None:
            errors.append(FieldError(f"{path}.kind", kind, "kind must not be empty"))
        if not name:
            errors.append(FieldError(f"{path}.name", name, "name must not be empty"))
        if not uid:
            errors.append(FieldError(f"{path}.uid", uid, "uid must not be empty"))
        if (group, version, kind) in BANNED_OWNERS:
            errors.append(
                FieldError(
                    path,
                    _reference_json(ref),
                    f"{group}/{version}, Kind={kind} is disallowed from being an owner",
                )
            )
        if ref.get("controller") is True:
            current = f"{kind}/{name}"
            if first_controller:
                errors.append(
                    FieldError(
                        path,
                        [_reference_json(r) for r in refs],
                        'Only one reference can have Controller set to true. Found "true" in '
                        f"references for {first_controller} and {current}",
                    )
                )
            else:
                first_controller = current
    return errors


def check_owner_references(rt: kube.ResourceType, obj: Obj) -> None:
    """422 Invalid, in the API server's words, when the object's ownerReferences are not
    valid; 400 when they are not a list of objects (the request would not decode)."""
    meta = obj["metadata"]
    refs = meta.get("ownerReferences")
    if refs is None:
        return
    if not isinstance(refs, list) or not all(isinstance(r, dict) for r in refs):
        raise ApiError(
            400,
            "BadRequest",
            "the body of the request was invalid: metadata.ownerReferences must be a list of "
            "OwnerReference objects",
        )
    errors = owner_reference_errors(refs)
    if not errors:
        return
    name = meta.get("name") or ""
    detail = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
    raise ApiError(
        422,
        "Invalid",
        f'{qualified_kind(rt)} "{name}" is invalid: {detail}',
        name,
        rt.kind,
        rt.group,
        [e.cause() for e in errors],
    )


def qualified_kind(rt: kube.ResourceType) -> str:
    """`GroupKind.String()`: "Pod", "NetworkPolicy.networking.k8s.io"."""
    return f"{rt.kind}.{rt.group}" if rt.group else rt.kind


def resource_type_of(ref: Obj) -> kube.ResourceType | None:
    """The served resource an ownerReference's apiVersion and kind name (its group and kind;
    the version may be another the group serves), or None (the REST mapper knows none)."""
    gv = parse_group_version(ref.get("apiVersion") or "")
    if gv is None:
        return None
    return next(
        (r for r in kube.RESOURCE_TYPES if (r.group, r.kind) == (gv[0], ref.get("kind"))), None
    )


# -- the OwnerReferencesPermissionEnforcement admission plugin ---------------------------------


def _normalized(refs: list[Obj] | None) -> list[Obj]:
    # JSON null and an absent field are the same nil pointer to the server
    return [{k: v for k, v in r.items() if v is not None} for r in refs or []]


def changes_owner_references(new: Obj, old: Obj | None) -> bool:
    """`isChangingOwnerReference`: any references on create; on update, any difference."""
    new_refs = _normalized(new["metadata"].get("ownerReferences"))
    if old is None:
        return bool(new_refs)
    return new_refs != _normalized(old["metadata"].get("ownerReferences"))


def new_blocking_references(new: Obj, old: Obj | None) -> list[Obj]:
    """`newBlockingOwnerDeletionRefs`: references with blockOwnerDeletion true that were not
    there, or did not block, before."""
    blocking = [
        r for r in new["metadata"].get("ownerReferences") or [] if r.get("blockOwnerDeletion")
    ]
    if old is None:
        return blocking
    before = {r.get("uid"): r for r in old["metadata"].get("ownerReferences") or []}
    return [
        r
        for r in blocking
        if r.get("uid") not in before or not before[r["uid"]].get("blockOwnerDeletion")
    ]


#: (requester, verb, resource type, subresource, namespace, name) -> (allowed, the reason the
#: authorizer gives when not): the cluster's RBAC asked as the request's user
Authorizer = Callable[[Any, str, "kube.ResourceType", str, str, str], tuple[bool, str]]


class OwnerReferencesPermissionEnforcement:
    """The validating admission plugin: who may point an object at an owner."""

    def __init__(self, authorize: Authorizer):
        self.authorize = authorize

    def __call__(self, request: kube.Admission) -> None:
        rt, obj = request.rt, request.obj
        if (rt.plural, request.subresource) in EXEMPT_SUBRESOURCES:
            return
        if not changes_owner_references(obj, request.old):
            return
        namespace = request.namespace if rt.namespaced else ""
        if request.operation != "CREATE":
            allowed, reason = self.authorize(
                request.user, "delete", rt, request.subresource, namespace, request.name
            )
            if not allowed:
                raise forbidden(
                    request,
                    f"cannot set an ownerRef on a resource you can't delete: {reason}, <nil>",
                )
        for ref in new_blocking_references(obj, request.old):
            owner = resource_type_of(ref)
            if owner is None:
                raise forbidden(
                    request,
                    "cannot set blockOwnerDeletion in this case because cannot find "
                    f"RESTMapping for APIVersion {ref.get('apiVersion')} Kind {ref.get('kind')}: "
                    f"{_no_match(ref)}",
                )
            allowed, reason = self.authorize(
                request.user,
                "update",
                owner,
                "finalizers",
                namespace if owner.namespaced else "",
                ref.get("name") or "",
            )
            if not allowed:
                raise forbidden(
                    request,
                    "cannot set blockOwnerDeletion if an ownerReference refers to a resource "
                    f"you can't set finalizers on: {reason}, <nil>",
                )


def _no_match(ref: Obj) -> str:
    """The REST mapper's `NoKindMatchError` for a kind it does not serve."""
    group, version = parse_group_version(ref.get("apiVersion") or "") or ("", "")
    gv = f"{group}/{version}" if group else version
    return f'no matches for kind "{ref.get("kind")}" in version "{gv}"'


def forbidden(request: kube.Admission, why: str) -> ApiError:
    """`admission.NewForbidden`: 403, `<resource>.<group> "<name>" is forbidden: <why>`."""
    rt = request.rt
    qualified = f"{rt.plural}.{rt.group}" if rt.group else rt.plural
    name = request.obj["metadata"].get("name") or request.name
    return ApiError(
        403, "Forbidden", f'{qualified} "{name}" is forbidden: {why}', name, rt.plural, rt.group
    )


# -- deletion --------------------------------------------------------------------------------


def propagation_policy(policy: str | None, orphan_dependents: bool | None) -> str:
    """The DeleteOptions' propagation policy, "Background" by default; 422 as
    `ValidateDeleteOptions` answers for an unknown one or for both fields set."""
    if policy is not None and orphan_dependents is not None:
        raise _invalid_options(
            f"propagationPolicy: Invalid value: {_go_value(policy)}: orphanDependents and "
            "deletionPropagation cannot be both set"
        )
    if policy is not None and policy not in PROPAGATION_POLICIES:
        supported = ", ".join(f'"{p}"' for p in (*PROPAGATION_POLICIES, "nil"))
        raise _invalid_options(
            f"propagationPolicy: Unsupported value: {_go_value(policy)}: supported values: "
            f"{supported}"
        )
    if orphan_dependents is not None:
        return "Orphan" if orphan_dependents else "Background"
    return policy or "Background"


def _invalid_options(detail: str) -> ApiError:
    return ApiError(422, "Invalid", f'DeleteOptions.meta.k8s.io "" is invalid: {detail}')


def orphan_dependents(api: kube.Api, owner: Obj) -> list[Obj]:
    """What the garbage collector does for an owner deleted with propagationPolicy Orphan:
    drop the references to it from its dependents (which then stay); returns them."""
    meta = owner["metadata"]
    uid, namespace = meta["uid"], meta.get("namespace") or None

    def drop(o: Obj) -> None:
        kept = [r for r in o["metadata"].get("ownerReferences") or [] if r.get("uid") != uid]
        if kept:
            o["metadata"]["ownerReferences"] = kept
        else:
            o["metadata"].pop("ownerReferences", None)

    orphaned = []
    for rt in kube.RESOURCE_TYPES:
        for obj in api.list(rt, namespace):
            refs = obj["metadata"].get("ownerReferences") or []
            if not any(r.get("uid") == uid for r in refs):
                continue
            m = obj["metadata"]
            orphaned.append(api.update(rt, m.get("namespace", ""), m["name"], drop))
    return orphaned
