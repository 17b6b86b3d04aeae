"""Data disks on Kubernetes: one PersistentVolumeClaim per disk, the record in its annotations.

| key | where | value |
|---|---|---|
| name | | ``disk-{user slug}--{disk name}`` (the slug as KubeSpawner's ``{username}``) |
| ``app.kubernetes.io/managed-by`` | label | ``gputap`` |
| ``gputap.io/disk`` | label | ``true`` |
| ``hub.jupyter.org/username`` | label | the user as a label value (as KubeSpawner labels pods) |
| ``hub.jupyter.org/username`` | annotation | the username as is |
| ``gputap.io/disk-name`` | annotation | the disk's name |
| ``gputap.io/created-at`` | annotation | ISO 8601, UTC |
| ``gputap.io/attached-to`` | annotation | the server ("" the default one); absent: detached |
| ``gputap.io/billing-session`` | annotation | the billing session metering the disk |

``--`` joins user and disk as KubeSpawner joins user and server: disk names hold single
hyphens only and a user slug holds ``--`` only in its hashed form, so no two disks share a
claim name. A server mounts its attached disks at ``/mnt/disks/{name}``
(:func:`disk_pod_settings`) and a postStart hook links each into ``~/disks/{name}``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kubernetes_asyncio.client import ApiException
from kubespawner.slugs import is_valid_label, safe_slug

from gputap_common import clock
from gputap_common import labels as keys

from ..core.disks import (
    HOME_FOLDER,
    Disk,
    DiskConflict,
    DiskUnavailable,
    attached_conflict,
    check_name,
    check_new_disk,
    not_found,
)

MOUNT_ROOT = "/mnt/disks"

# one lock per (namespace, user) and event loop: a count and the creation relying on it are
# one step within the hub
_locks: dict[tuple[asyncio.AbstractEventLoop, str, str], asyncio.Lock] = {}


def claim_name(user: str, name: str) -> str:
    """The PersistentVolumeClaim of ``user``'s disk ``name``."""
    return f"disk-{safe_slug(user, max_length=48)}--{check_name(name)}"


def user_label(user: str) -> str:
    return safe_slug(user, is_valid=is_valid_label)


def claim_body(user: str, disk: Disk, storage_class: str = "") -> dict[str, Any]:
    """The PersistentVolumeClaim of ``user``'s new ``disk`` (what :func:`disk_from_claim`
    reads back). Pure."""
    annotations = {
        keys.HUB_USERNAME: user,
        keys.DISK_NAME: disk.name,
        keys.CREATED_AT: disk.created_at.isoformat(),
    }
    if disk.billing_session_id:
        annotations[keys.BILLING_SESSION] = disk.billing_session_id
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": f"{disk.size_gb}Gi"}},
    }
    if storage_class:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": claim_name(user, disk.name),
            "labels": {
                keys.MANAGED_BY: "gputap",
                keys.DISK: "true",
                keys.HUB_USERNAME: user_label(user),
            },
            "annotations": annotations,
        },
        "spec": spec,
    }


def _size_gb(storage: str) -> int:
    """ "10Gi" -> 10 (the claims gputap writes); other quantities to whole GiB, rounded up."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "G": 10**9, "M": 10**6}
    for suffix, factor in units.items():
        if storage.endswith(suffix):
            return -(-int(float(storage[: -len(suffix)]) * factor) // 2**30)
    return -(-int(storage) // 2**30)


def disk_from_claim(claim: dict[str, Any]) -> Disk:
    """The record a claim carries. Pure."""
    meta = claim["metadata"]
    notes = meta.get("annotations") or {}
    return Disk(
        name=notes[keys.DISK_NAME],
        size_gb=_size_gb(claim["spec"]["resources"]["requests"]["storage"]),
        created_at=datetime.fromisoformat(notes[keys.CREATED_AT]),
        attached_to=notes.get(keys.ATTACHED_TO),
        billing_session_id=notes.get(keys.BILLING_SESSION),
    )


def disk_pod_settings(
    user: str, names: list[str], elsewhere: Iterable[str] = (), mount_root: str = MOUNT_ROOT
) -> dict[str, Any]:
    """KubeSpawner settings for a server of ``user`` with the disks ``names`` attached: a
    volume per disk mounted at ``{mount_root}/{name}``, and the postStart hook linking them
    into ``~/disks`` (it removes the links of disks detached since, but not those of the
    disks ``elsewhere``, attached to the user's other servers: the home is shared). Pure."""
    names = sorted(names)
    volumes, mounts = [], []
    for name in names:
        claim = {"claimName": claim_name(user, name)}
        volumes.append({"name": f"disk-{name}", "persistentVolumeClaim": claim})
        mounts.append({"name": f"disk-{name}", "mountPath": f"{mount_root}/{name}"})
    hook = {"exec": {"command": ["sh", "-c", link_script(names, elsewhere, mount_root)]}}
    return {"volumes": volumes, "volume_mounts": mounts, "lifecycle_hooks": {"postStart": hook}}


def link_script(
    names: list[str], elsewhere: Iterable[str] = (), mount_root: str = MOUNT_ROOT
) -> str:
    """Shell that links each mounted disk into ``$HOME/disks`` and removes the links there
    that point into ``mount_root`` but are neither mounted here nor attached to the user's
    other servers (``elsewhere``); nothing else is touched.

    It never fails (a failing postStart hook kills the container). Disk names are
    ``[a-z0-9-]`` (check_name), so they need no quoting."""
    names = sorted(names)
    protected = sorted(set(names) | set(elsewhere))
    for name in protected:
        check_name(name)
    keep = " ".join(protected)
    make = 'mkdir -p "$d" || exit 0' if names else '[ -d "$d" ] || exit 0'
    return (
        f'd="$HOME/{HOME_FOLDER}"; {make}; '
        f'for l in "$d"/*; do [ -L "$l" ] || continue; t=$(readlink "$l"); '
        f'case "$t" in {mount_root}/*) n=${{t#{mount_root}/}}; '
        f'case " {keep} " in *" $n "*) [ "$(basename "$l")" = "$n" ] && continue;; esac; '
        f'rm -f "$l";; esac; done; '
        f'for n in {" ".join(names)}; do [ -e "$d/$n" ] || [ -L "$d/$n" ] || '
        f'ln -s "{mount_root}/$n" "$d/$n"; done; exit 0'
    )


@dataclass
class KubeDiskStore:
    """Disks as PersistentVolumeClaims in ``namespace``, through kubernetes_asyncio's CoreV1Api
    (KubeSpawner's shared client in the hub), of at most ``max_size_gb`` each and
    ``max_disks`` per user, in ``storage_class`` ("" the cluster's default)."""

    api: Any
    namespace: str
    storage_class: str = ""
    max_size_gb: int = 100
    max_disks: int = 5

    def _lock(self, user: str) -> asyncio.Lock:
        key = (asyncio.get_running_loop(), self.namespace, user)
        return _locks.setdefault(key, asyncio.Lock())

    async def _call(self, method: str, *args: Any, expect: int = 0, **kwargs: Any) -> Any:
        """Call the API; an ApiException of status ``expect`` is the caller's to handle,
        anything else means the cluster's storage cannot be used now."""
        try:
            return await getattr(self.api, method)(*args, **kwargs)
        except ApiException as e:
            if e.status == expect:
                raise
            raise unavailable(e) from None
        except OSError as e:
            raise unavailable(e) from None

    async def _claims(self, user: str) -> list[dict[str, Any]]:
        selector = f"{keys.DISK}=true,{keys.HUB_USERNAME}={user_label(user)}"
        listing = await self._call(
            "list_namespaced_persistent_volume_claim", self.namespace, label_selector=selector
        )
        claims = [self.api.api_client.sanitize_for_serialization(c) for c in listing.items]
        # the label is a slug: the annotation says whose claim it is exactly
        return [c for c in claims if _owner(c) == user]

    async def _claim(self, user: str, name: str) -> dict[str, Any]:
        try:
            claim = await self._call(
                "read_namespaced_persistent_volume_claim",
                claim_name(user, name),
                self.namespace,
                expect=404,
            )
        except (ApiException, ValueError):
            raise not_found(user, name) from None
        claim = self.api.api_client.sanitize_for_serialization(claim)
        if _owner(claim) != user:
            raise not_found(user, name)
        return claim

    async def list(self, user: str, usage: bool = True) -> list[Disk]:
        """The user's disks by name (``used_bytes`` unknown: a claim does not say)."""
        return sorted((disk_from_claim(c) for c in await self._claims(user)), key=lambda d: d.name)

    async def get(self, user: str, name: str) -> Disk:
        return disk_from_claim(await self._claim(user, name))

    async def create(
        self, user: str, name: str, size_gb: int, billing_session_id: str | None = None
    ) -> Disk:
        async with self._lock(user):
            size = check_new_disk(
                await self.list(user), name, size_gb, self.max_size_gb, self.max_disks
            )
            new = Disk(name, size, clock.utcnow(), billing_session_id=billing_session_id)
            body = claim_body(user, new, self.storage_class)
            try:
                created = await self._call(
                    "create_namespaced_persistent_volume_claim", self.namespace, body, expect=409
                )
            except ApiException:  # 409: a claim of that name exists (not listed as a disk)
                raise DiskConflict(
                    f"A volume named {body['metadata']['name']} is in the way in the cluster; "
                    "pick another name, or ask an operator to look at it."
                ) from None
            return disk_from_claim(self.api.api_client.sanitize_for_serialization(created))

    async def delete(self, user: str, name: str) -> Disk:
        """Delete a detached disk's claim (DiskConflict while attached); its volume goes with
        it as the storage class's reclaim policy says."""
        async with self._lock(user):
            disk = await self.get(user, name)
            if disk.attached_to is not None:
                raise attached_conflict(disk)
            try:
                await self._call(
                    "delete_namespaced_persistent_volume_claim",
                    claim_name(user, name),
                    self.namespace,
                    expect=404,
                )
            except ApiException:
                raise not_found(user, name) from None
            return disk

    async def _set_attached(self, user: str, name: str, server: str | None) -> Disk:
        async with self._lock(user):
            await self._claim(user, name)
            patch = {"metadata": {"annotations": {keys.ATTACHED_TO: server}}}
            try:
                patched = await self._call(
                    "patch_namespaced_persistent_volume_claim",
                    claim_name(user, name),
                    self.namespace,
                    patch,
                    _content_type="application/merge-patch+json",
                    expect=404,
                )
            except ApiException:
                raise not_found(user, name) from None
            return disk_from_claim(self.api.api_client.sanitize_for_serialization(patched))

    async def attach(self, user: str, name: str, server: str) -> Disk:
        return await self._set_attached(user, name, server)

    async def detach(self, user: str, name: str) -> Disk:
        return await self._set_attached(user, name, None)

    async def attached(self, user: str, server: str) -> list[Disk]:
        return [d for d in await self.list(user) if d.attached_to == server]


def _owner(claim: dict[str, Any]) -> str | None:
    return (claim["metadata"].get("annotations") or {}).get(keys.HUB_USERNAME)


def unavailable(e: Exception) -> DiskUnavailable:
    reason = getattr(e, "reason", None) or e
    return DiskUnavailable(
        f"Disks cannot be read or changed in the cluster now (the Kubernetes API: {reason}); "
        "your disks are unchanged. Try again in a minute, and tell an operator if it persists."
    )
