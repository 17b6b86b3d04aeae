"""In-memory object store of the simulated Kubernetes API server.

Pure and synchronous: no I/O, no event loop. Objects are plain dicts shaped like the JSON the
real API server returns. One global resourceVersion counter is bumped on every write, and a
bounded history of watch events lets watchers resume from a resourceVersion, or learn with a 410
that it has been compacted away.
"""

from __future__ import annotations

import copy
import re
import secrets
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str, str, str]  # (apiVersion, kind, namespace or "", name)

_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


def utcnow() -> datetime:
    """Now, timezone-aware UTC. Tests may monkeypatch this."""
    return datetime.now(UTC)


def rfc3339(when: datetime) -> str:
    """A timestamp as Kubernetes writes it: UTC, second precision, trailing Z."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    """A refusal the API server renders as a Kubernetes Status body."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        name: str = "",
        kind: str = "",
        group: str = "",
        causes: list[Obj] | None = None,
    ):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.name = name
        self.kind = kind
        self.group = group  # the details' API group, for a resource of a named group
        self.causes = causes or []  # the details' causes: one per field error of a 422

    def status(self) -> Obj:
        """The Status object Kubernetes sends for this error."""
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "details": {},
            "code": self.code,
        }
        if self.name:
            body["details"]["name"] = self.name
        if self.group:
            body["details"]["group"] = self.group
        if self.kind:
            body["details"]["kind"] = self.kind
        if self.causes:
            body["details"]["causes"] = self.causes
        return body


def not_found(plural: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{plural} "{name}" not found', name, plural)


def invalid(kind: str, plural: str, name: str, detail: str) -> ApiError:
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {detail}', name, plural)


# ---------------------------------------------------------------------------------------------
# selectors


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "=":
            return present and value == self.values[0]
        if self.op == "!=":
            return not present or value != self.values[0]
        if self.op == "in":
            return present and value in self.values
        if self.op == "notin":
            return not present or value not in self.values
        if self.op == "exists":
            return present
        return not present


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts, depth, current = [], 0, []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


_SET_EXPR = re.compile(r"^([^\s!=(),]+)\s+(in|notin)\s+\((.*)\)$")


def parse_label_selector(text: str | None) -> list[Requirement]:
    """Parse `a=b,c!=d,e in (x,y),f notin (z),g,!h` into requirements; ValueError if malformed."""
    if not text:
        return []
    reqs = []
    for part in _split_top_level(text):
        m = _SET_EXPR.match(part)
        if m:
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            reqs.append(Requirement(m.group(1), m.group(2), values))
        elif "!=" in part:
            k, v = part.split("!=", 1)
            reqs.append(Requirement(k.strip(), "!=", (v.strip(),)))
        elif "==" in part:
            k, v = part.split("==", 1)
            reqs.append(Requirement(k.strip(), "=", (v.strip(),)))
        elif "=" in part:
            k, v = part.split("=", 1)
            reqs.append(Requirement(k.strip(), "=", (v.strip(),)))
        elif part.startswith("!"):
            reqs.append(Requirement(part[1:].strip(), "!exists"))
        elif re.fullmatch(r"[A-Za-z0-9._/-]+", part):
            reqs.append(Requirement(part, "exists"))
        else:
            raise ValueError(f"unable to parse requirement: {part!r}")
    return reqs


def labels_match(selector: str | None, labels: dict[str, str] | None) -> bool:
    """Whether labels satisfy every requirement of a label selector string."""
    return all(r.matches(labels or {}) for r in parse_label_selector(selector))


SUPPORTED_FIELDS = {
    "metadata.name",
    "metadata.namespace",
    "spec.nodeName",
    "status.phase",
    "involvedObject.name",
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.uid",
    "reason",
    "type",
}


def parse_field_selector(text: str | None) -> list[tuple[str, str, str]]:
    """Parse `metadata.name=x,status.phase!=Running` into (path, op, value); ValueError if bad."""
    if not text:
        return []
    reqs = []
    for part in _split_top_level(text):
        if "!=" in part:
            path, value = part.split("!=", 1)
            op = "!="
        elif "==" in part:
            path, value = part.split("==", 1)
            op = "="
        elif "=" in part:
            path, value = part.split("=", 1)
            op = "="
        else:
            raise ValueError(f"invalid field selector: {part!r}")
        path = path.strip()
        if path not in SUPPORTED_FIELDS:
            raise ValueError(f'field label not supported: "{path}"')
        reqs.append((path, op, value.strip()))
    return reqs


def field_value(obj: Obj, path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return "" if node is None else str(node)


def fields_match(selector: str | None, obj: Obj) -> bool:
    """Whether an object satisfies a field selector string."""
    for path, op, value in parse_field_selector(selector):
        actual = field_value(obj, path)
        if (actual == value) != (op == "="):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# the store


@dataclass
class WatchEvent:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    key: Key
    obj: Obj


@dataclass
class Store:
    """Objects by (apiVersion, kind, namespace, name) with a global resourceVersion."""

    history_size: int = 1000
    clock: Callable[[], datetime] = utcnow
    _objects: dict[Key, Obj] = field(default_factory=dict)
    _rv: int = 0
    _history: deque[WatchEvent] = field(default_factory=deque)
    _compacted_rv: int = 0  # every event with rv <= this has been dropped from history
    _listeners: list[Callable[[WatchEvent], None]] = field(default_factory=list)

    @property
    def resource_version(self) -> str:
        return str(self._rv)

    @staticmethod
    def key(obj: Obj) -> Key:
        meta = obj.get("metadata") or {}
        return (obj["apiVersion"], obj["kind"], meta.get("namespace") or "", meta.get("name", ""))

    def subscribe(self, listener: Callable[[WatchEvent], None]) -> Callable[[], None]:
        """Call listener(event) after every write; returns a function that unsubscribes."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def _record(self, type_: str, key: Key, obj: Obj) -> None:
        event = WatchEvent(self._rv, type_, key, copy.deepcopy(obj))
        self._history.append(event)
        while len(self._history) > self.history_size:
            self._compacted_rv = self._history.popleft().rv
        for listener in list(self._listeners):
            listener(event)

    def _bump(self, obj: Obj) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)

    # -- reads ---------------------------------------------------------------------------------

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        """A deep copy of the object, or None."""
        obj = self._objects.get((api_version, kind, namespace or "", name))
        return copy.deepcopy(obj) if obj is not None else None

    def list(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        """Deep copies of matching objects, ordered by namespace then name."""
        labels_req = parse_label_selector(label_selector)
        parse_field_selector(field_selector)  # validate even when nothing matches
        out = []
        for obj in self.view(api_version, kind, namespace):
            labels = obj["metadata"].get("labels") or {}
            if all(r.matches(labels) for r in labels_req) and fields_match(field_selector, obj):
                out.append(copy.deepcopy(obj))
        return out

    def view(self, api_version: str, kind: str, namespace: str | None = None) -> list[Obj]:
        """The stored objects of a kind themselves, ordered by namespace then name, for the
        simulated controllers that only read them (the scheduler, the kubelet's volume
        checks): every write stores a new object, so each is a snapshot; never mutate one.
        Deep copies of every pod for each pending pod made a burst's scheduling quadratic."""
        found = [
            (key, obj)
            for key, obj in self._objects.items()
            if key[0] == api_version and key[1] == kind and (not namespace or key[2] == namespace)
        ]
        return [obj for _, obj in sorted(found, key=lambda item: item[0])]

    def events_since(self, rv: int) -> list[WatchEvent]:
        """History events after rv; ApiError 410 if some of them were compacted away."""
        if rv < self._compacted_rv:
            raise ApiError(
                410,
                "Expired",
                f"too old resource version: {rv} ({self._compacted_rv + 1})",
            )
        return [e for e in self._history if e.rv > rv]

    # -- writes --------------------------------------------------------------------------------

    def create(self, obj: Obj, plural: str) -> Obj:
        """Store a new object, filling uid, resourceVersion, creationTimestamp, generateName."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)[:5]
        name = meta.get("name") or ""
        if not name:
            raise invalid(
                obj["kind"],
                plural,
                "",
                "metadata.name: Required value: name or generateName is required",
            )
        if obj["apiVersion"].startswith("rbac.authorization.k8s.io/"):
            # RBAC names are path segments (ValidateRBACName), so "system:discovery" is one
            if name in (".", "..") or "/" in name or "%" in name:
                raise invalid(
                    obj["kind"],
                    plural,
                    name,
                    f"metadata.name: Invalid value: \"{name}\": may not contain '/' or '%'",
                )
        elif len(name) > 253 or not _DNS1123_SUBDOMAIN.match(name):
            raise invalid(
                obj["kind"],
                plural,
                name,
                f'metadata.name: Invalid value: "{name}": a lowercase RFC 1123 subdomain must '
                "consist of lower case alphanumeric characters, '-' or '.', and must start and "
                "end with an alphanumeric character",
            )
        key = self.key(obj)
        if key in self._objects:
            raise ApiError(409, "AlreadyExists", f'{plural} "{name}" already exists', name, plural)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339(self.clock())
        meta.pop("deletionTimestamp", None)
        self._bump(obj)
        self._objects[key] = obj
        self._record("ADDED", key, obj)
        return copy.deepcopy(obj)

    def replace(self, obj: Obj, plural: str, check_rv: bool = True) -> Obj:
        """Overwrite an existing object; 409 Conflict if a given resourceVersion is stale."""
        obj = copy.deepcopy(obj)
        key = self.key(obj)
        current = self._objects.get(key)
        name = key[3]
        if current is None:
            raise not_found(plural, name)
        meta = obj.setdefault("metadata", {})
        given = meta.get("resourceVersion")
        if check_rv and given and given != current["metadata"]["resourceVersion"]:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {plural} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                name,
                plural,
            )
        # identity fields are the server's, not the writer's
        for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
            if k in current["metadata"]:
                meta[k] = current["metadata"][k]
            else:
                meta.pop(k, None)
        if obj == current:
            return copy.deepcopy(current)
        self._bump(obj)
        self._objects[key] = obj
        self._record("MODIFIED", key, obj)
        return copy.deepcopy(obj)

    def update(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        plural: str,
        mutate: Callable[[Obj], None],
    ) -> Obj:
        """Read-modify-write one object in place (no conflict check); 404 if absent."""
        current = self.get(api_version, kind, namespace, name)
        if current is None:
            raise not_found(plural, name)
        mutate(current)
        current["metadata"]["resourceVersion"] = self._objects[
            (api_version, kind, namespace or "", name)
        ]["metadata"]["resourceVersion"]
        return self.replace(current, plural, check_rv=False)

    def mark_deleting(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        plural: str,
        grace_seconds: int,
    ) -> Obj:
        """Graceful deletion: the object stays until remove().

        As the real API server does, ``deletionTimestamp`` is the request time plus the grace
        period (the latest the object should be gone), so the request time is
        ``deletionTimestamp - deletionGracePeriodSeconds``.
        """
        key = (api_version, kind, namespace or "", name)
        current = self._objects.get(key)
        if current is None:
            raise not_found(plural, name)
        if current["metadata"].get("deletionTimestamp"):
            return copy.deepcopy(current)
        obj = copy.deepcopy(current)
        deadline = self.clock() + timedelta(seconds=grace_seconds)
        obj["metadata"]["deletionTimestamp"] = rfc3339(deadline)
        obj["metadata"]["deletionGracePeriodSeconds"] = grace_seconds
        self._bump(obj)
        self._objects[key] = obj
        self._record("MODIFIED", key, obj)
        return copy.deepcopy(obj)

    def remove(self, api_version: str, kind: str, namespace: str, name: str, plural: str) -> Obj:
        """Delete at once; the DELETED event carries the final object with a new rv."""
        key = (api_version, kind, namespace or "", name)
        obj = self._objects.pop(key, None)
        if obj is None:
            raise not_found(plural, name)
        self._bump(obj)
        self._record("DELETED", key, obj)
        return copy.deepcopy(obj)

    def all_keys(self) -> Iterable[Key]:
        return list(self._objects)
