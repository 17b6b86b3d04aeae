"""Authentication by bearer token, RBAC authorization and the request audit of the simulated
API server, as kube-apiserver does them (no HTTP here: server.py calls `Rbac.check`).

Followed from the Kubernetes source:
- request attributes: apiserver/pkg/endpoints/request/requestinfo.go (`NewRequestInfo`: a GET
  without a name is list, or watch with ?watch=true; a DELETE without one deletecollection; a
  metadata.name field selector names the object; /namespaces/NS is namespaced in NS);
- rule matching: kubernetes/pkg/apis/rbac/v1/evaluation_helpers.go and
  plugin/pkg/auth/authorizer/rbac/rbac.go (`RuleAllows`: verbs, apiGroups, resources with
  "pods/log" and "*/status", resourceNames; ClusterRoleBindings first, then the RoleBindings of
  the request's namespace; a binding to a missing role adds "RBAC: ... not found" to the reason);
- refusal texts: apiserver/pkg/endpoints/handlers/responsewriters/errors.go (`forbiddenMessage`)
  and apimachinery/pkg/api/errors (`NewForbidden`, `NewUnauthorized`);
- the bootstrap roles (cluster-admin for system:masters, system:discovery and
  system:public-info-viewer for discovery): plugin/pkg/auth/authorizer/rbac/bootstrappolicy.

Anonymous requests are refused with 401 as with `--anonymous-auth=false`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .api import (
    CLUSTER_ROLE,
    CLUSTER_ROLE_BINDING,
    ROLE,
    ROLE_BINDING,
    SERVICE_ACCOUNT,
    Api,
    ResourceType,
)
from .store import Obj

RBAC_GROUP = "rbac.authorization.k8s.io"
ADMIN_USER = "kube-sim-admin"
SPECIAL_VERBS = ("proxy", "watch")
NAMESPACE_SUBRESOURCES = ("status", "finalize")
TRUE_WORDS = ("1", "t", "T", "TRUE", "true", "True")  # Go's strconv.ParseBool


@dataclass(frozen=True)
class Identity:
    """Who made a request: the user name and groups the authenticator gave it."""

    user: str
    groups: tuple[str, ...]


@dataclass(frozen=True)
class Attributes:
    """What a request asks to do, as the authorizer sees it."""

    verb: str
    path: str
    resource_request: bool = False
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def scope(self) -> str:
        """The namespace, or "cluster" for a cluster-scoped request."""
        return self.namespace or "cluster"


@dataclass(frozen=True)
class Grant:
    """The rule that allowed a request: its binding, its role and the rule's index there."""

    binding_kind: str
    binding_namespace: str
    binding_name: str
    role_kind: str
    role_namespace: str
    role_name: str
    rule: int


@dataclass(frozen=True)
class AuditRecord:
    """One request as the audit log keeps it, or an admission plugin's check of what its
    requester may do (verb, resource and name are then those the plugin asked about)."""

    user: str
    verb: str
    api_group: str
    resource: str  # "pods/log" for a subresource; the path for a non-resource request
    scope: str  # namespace, or "cluster"
    name: str
    code: int  # 401, 403, else 0: authorized (the handler may still answer 404 or 409)
    grant: Grant | None = None

    @property
    def allowed(self) -> bool:
        return self.code == 0


def request_attributes(method: str, path: str, query: dict[str, str]) -> Attributes:
    """The authorizer's attributes of an HTTP request (`NewRequestInfo`)."""
    parts = [p for p in path.strip("/").split("/") if p]
    non_resource = Attributes(verb=method.lower(), path=path)
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return non_resource
    group = ""
    rest = parts[1:]
    if parts[0] == "apis":
        if len(rest) < 3:
            return non_resource
        group, rest = rest[0], rest[1:]
    version, rest = rest[0], rest[1:]
    if rest[0] in SPECIAL_VERBS and len(rest) >= 2:
        verb, rest = rest[0], rest[1:]
    else:
        verb = {
            "POST": "create",
            "GET": "get",
            "HEAD": "get",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete",
        }.get(method.upper(), "")
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) >= 2 else ""
    subresource = rest[2] if len(rest) >= 3 and verb != "proxy" else ""
    if not name and verb == "get":
        verb = "watch" if query.get("watch", "") in TRUE_WORDS else "list"
        name = _name_from_field_selector(query.get("fieldSelector", ""))
    if not name and verb == "delete":
        verb = "deletecollection"
    return Attributes(
        verb=verb,
        path=path,
        resource_request=True,
        api_group=group,
        api_version=version,
        resource=resource,
        subresource=subresource,
        namespace=namespace,
        name=name,
    )


def _name_from_field_selector(selector: str) -> str:
    """The object a `metadata.name=NAME` (or `==`) field selector names, else ""."""
    for term in selector.split(","):
        key, sep, value = term.partition("=")
        if sep and key.strip() == "metadata.name":
            return value.removeprefix("=").strip()
    return ""


# -- rule evaluation (pure) ----------------------------------------------------------------------


def rule_allows(rule: Obj, attrs: Attributes) -> bool:
    """`RuleAllows`: whether one PolicyRule grants the request."""
    verbs = rule.get("verbs") or []
    if "*" not in verbs and attrs.verb not in verbs:
        return False
    if not attrs.resource_request:
        return any(
            url == "*"
            or url == attrs.path
            or (url.endswith("*") and attrs.path.startswith(url.rstrip("*")))
            for url in rule.get("nonResourceURLs") or []
        )
    groups = rule.get("apiGroups") or []
    if "*" not in groups and attrs.api_group not in groups:
        return False
    combined = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    resources = rule.get("resources") or []
    if not any(
        r == "*" or r == combined or (attrs.subresource and r == "*/" + attrs.subresource)
        for r in resources
    ):
        return False
    names = rule.get("resourceNames") or []
    return not names or attrs.name in names


def subject_matches(subject: Obj, identity: Identity, binding_namespace: str) -> bool:
    """`appliesToUser`: a User by name, a Group by membership, a ServiceAccount by its user."""
    kind, name = subject.get("kind"), subject.get("name", "")
    if kind == "User":
        return identity.user == name
    if kind == "Group":
        return name in identity.groups
    if kind == "ServiceAccount":
        namespace = subject.get("namespace") or binding_namespace
        return bool(namespace) and identity.user == service_account_user(namespace, name)
    return False


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def forbidden_status(identity: Identity, attrs: Attributes, reason: str = "") -> Obj:
    """The 403 Status body kube-apiserver sends for a request no rule allows."""
    if not attrs.resource_request:
        message = f'User "{identity.user}" cannot {attrs.verb} path "{attrs.path}"'
    else:
        resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
        where = (
            f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
        )
        message = (
            f'User "{identity.user}" cannot {attrs.verb} resource "{resource}" in API group '
            f'"{attrs.api_group}" {where}'
        )
    if reason:
        message = f"{message}: {reason}"
    details: dict[str, Any] = {}
    if not attrs.resource_request:
        message = f"forbidden: {message}"
    else:
        qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
        if attrs.name:
            message = f'{qualified} "{attrs.name}" is forbidden: {message}'
            details["name"] = attrs.name
        else:
            message = f"{qualified} is forbidden: {message}"
        if attrs.api_group:
            details["group"] = attrs.api_group
        details["kind"] = attrs.resource
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Forbidden",
        "details": details,
        "code": 403,
    }


UNAUTHORIZED_STATUS: Obj = {
    "kind": "Status",
    "apiVersion": "v1",
    "metadata": {},
    "status": "Failure",
    "message": "Unauthorized",
    "reason": "Unauthorized",
    "code": 401,
}

# The bootstrap policy a new cluster starts with (bootstrappolicy/policy.go), the part that
# matters here: the administrator, and discovery for every authenticated user.
_DISCOVERY_URLS = ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                   "/openapi/*", "/readyz", "/version", "/version/"]  # fmt: skip
_PUBLIC_INFO_URLS = ["/healthz", "/livez", "/readyz", "/version", "/version/"]
BOOTSTRAP_CLUSTER_ROLES: list[Obj] = [
    {
        "metadata": {"name": "cluster-admin"},
        "rules": [
            {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
            {"nonResourceURLs": ["*"], "verbs": ["*"]},
        ],
    },
    {
        "metadata": {"name": "system:discovery"},
        "rules": [{"nonResourceURLs": _DISCOVERY_URLS, "verbs": ["get"]}],
    },
    {
        "metadata": {"name": "system:public-info-viewer"},
        "rules": [{"nonResourceURLs": _PUBLIC_INFO_URLS, "verbs": ["get"]}],
    },
]
BOOTSTRAP_CLUSTER_ROLE_BINDINGS: list[Obj] = [
    {
        "metadata": {"name": role},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": RBAC_GROUP, "kind": "Group", "name": group}],
    }
    for role, group in (
        ("cluster-admin", "system:masters"),
        ("system:discovery", "system:authenticated"),
        ("system:public-info-viewer", "system:authenticated"),
    )
]


@dataclass
class Decision:
    """Allowed (and by which rule), or not (and the errors RBAC met on the way)."""

    allowed: bool
    grant: Grant | None = None
    reason: str = ""


def authorize(
    identity: Identity,
    attrs: Attributes,
    cluster_role_bindings: list[Obj],
    role_bindings: list[Obj],
    find_role: Callable[[str, str, str], Obj | None],
) -> Decision:
    """RBAC's decision: the first rule of a role bound to the identity that allows the request.

    role_bindings: those of the request's namespace; find_role(kind, namespace, name) -> the
    Role or ClusterRole, or None when it does not exist.
    """
    errors: list[str] = []
    candidates = [("ClusterRoleBinding", b) for b in cluster_role_bindings]
    if attrs.namespace:
        candidates += [("RoleBinding", b) for b in role_bindings]
    for binding_kind, binding in candidates:
        meta = binding["metadata"]
        binding_ns = meta.get("namespace", "")
        if not any(subject_matches(s, identity, binding_ns) for s in binding.get("subjects") or []):
            continue
        ref = binding.get("roleRef") or {}
        role_ns = binding_ns if ref.get("kind") == "Role" else ""
        role = find_role(ref.get("kind", ""), role_ns, ref.get("name", ""))
        if role is None:
            errors.append(
                f'{ref.get("kind", "").lower()}.{RBAC_GROUP} "{ref.get("name")}" not found'
            )
            continue
        for index, rule in enumerate(role.get("rules") or []):
            if rule_allows(rule, attrs):
                grant = Grant(
                    binding_kind,
                    binding_ns,
                    meta["name"],
                    ref["kind"],
                    role_ns,
                    ref["name"],
                    index,
                )
                return Decision(True, grant)
    # an aggregate of errors prints alone when it is one, else as a bracketed list
    aggregate = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    reason = f"RBAC: {aggregate}" if errors else ""
    return Decision(False, reason=reason)


# -- identities ------------------------------------------------------------------------------


@dataclass
class Tokens:
    """The bearer tokens the authenticator knows: the administrator's and ServiceAccounts'.

    A ServiceAccount token is bound to the account's uid, as a projected token is: once the
    account is deleted (or replaced by one of the same name), the token no longer
    authenticates.
    """

    admin_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    _accounts: dict[str, tuple[str, str, str]] = field(default_factory=dict)

    def issue(self, namespace: str, name: str, uid: str) -> str:
        """A new token for the ServiceAccount namespace/name whose uid is uid."""
        token = secrets.token_urlsafe(24)
        self._accounts[token] = (namespace, name, uid)
        return token

    def identify(
        self, authorization: str | None, account_uid: Callable[[str, str], str | None]
    ) -> Identity | None:
        """The identity of an Authorization header, or None (401).

        account_uid(namespace, name) -> the uid of that ServiceAccount now, or None.
        """
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        if secrets.compare_digest(token, self.admin_token):
            return Identity(ADMIN_USER, ("system:masters", "system:authenticated"))
        account = self._accounts.get(token)
        if account is None:
            return None
        namespace, name, uid = account
        if account_uid(namespace, name) != uid:
            return None
        return Identity(
            service_account_user(namespace, name),
            (
                "system:serviceaccounts",
                f"system:serviceaccounts:{namespace}",
                "system:authenticated",
            ),
        )


class Rbac:
    """Authentication, authorization and the audit over the objects of one Api."""

    def __init__(self, api: Api):
        self.api = api
        self.tokens = Tokens()
        self.audit: list[AuditRecord] = []
        for role in BOOTSTRAP_CLUSTER_ROLES:
            api.create(CLUSTER_ROLE, "", role)
        for binding in BOOTSTRAP_CLUSTER_ROLE_BINDINGS:
            api.create(CLUSTER_ROLE_BINDING, "", binding)

    def service_account_token(self, namespace: str, name: str) -> str:
        """A token of an existing ServiceAccount (404 NotFound if there is none)."""
        account = self.api.get(SERVICE_ACCOUNT, namespace, name)
        return self.tokens.issue(namespace, name, account["metadata"]["uid"])

    def _account_uid(self, namespace: str, name: str) -> str | None:
        account = self.api.find(SERVICE_ACCOUNT, namespace, name)
        return account["metadata"]["uid"] if account else None

    def _find_role(self, kind: str, namespace: str, name: str) -> Obj | None:
        if kind == "Role":
            return self.api.find(ROLE, namespace, name)
        if kind == "ClusterRole":
            return self.api.find(CLUSTER_ROLE, "", name)
        return None

    def identity_of(self, authorization: str | None) -> Identity | None:
        """Whom the request's credentials authenticate, or None."""
        return self.tokens.identify(authorization, self._account_uid)

    def user_of(self, authorization: str | None) -> str:
        """The user name the request's credentials authenticate ("" for none)."""
        identity = self.identity_of(authorization)
        return identity.user if identity else ""

    def _decide(self, identity: Identity, attrs: Attributes) -> Decision:
        return authorize(
            identity,
            attrs,
            self.api.list(CLUSTER_ROLE_BINDING),
            self.api.list(ROLE_BINDING, attrs.namespace) if attrs.namespace else [],
            self._find_role,
        )

    def admission_check(
        self,
        identity: Identity,
        verb: str,
        rt: ResourceType,
        subresource: str,
        namespace: str,
        name: str,
    ) -> tuple[bool, str]:
        """What an admission plugin asks the authorizer (owners.Authorizer): may the
        request's user do this too? Audited as a request would be, so a refusal names the
        rule that is missing. Returns (allowed, the reason RBAC gives when not)."""
        attrs = Attributes(
            verb=verb,
            path="",
            resource_request=True,
            api_group=rt.group,
            api_version=rt.version,
            resource=rt.plural,
            subresource=subresource,
            namespace=namespace,
            name=name,
        )
        decision = self._decide(identity, attrs)
        self._record(identity.user, attrs, 0 if decision.allowed else 403, decision.grant)
        return decision.allowed, decision.reason

    def check(
        self, method: str, path: str, query: dict[str, str], authorization: str | None
    ) -> tuple[int, Obj] | None:
        """None when the request may go on, else (code, Status body); audited either way."""
        attrs = request_attributes(method, path, query)
        identity = self.identity_of(authorization)
        if identity is None:
            self._record("", attrs, 401)
            return 401, UNAUTHORIZED_STATUS
        decision = self._decide(identity, attrs)
        if not decision.allowed:
            self._record(identity.user, attrs, 403)
            return 403, forbidden_status(identity, attrs, decision.reason)
        self._record(identity.user, attrs, 0, decision.grant)
        return None

    def _record(self, user: str, attrs: Attributes, code: int, grant: Grant | None = None) -> None:
        resource = attrs.path
        if attrs.resource_request:
            resource = attrs.resource + (f"/{attrs.subresource}" if attrs.subresource else "")
        self.audit.append(
            AuditRecord(
                user, attrs.verb, attrs.api_group, resource, attrs.scope, attrs.name, code, grant
            )
        )
