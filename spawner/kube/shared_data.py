"""Shared data on Kubernetes: each ``shared_data`` entry as a volume of the pod, its claim or
NFS export mounted read-only at the entry's mount path. Pure: settings in, KubeSpawner trait
values out (as spawner/kube/objects.py).

Read-only is said in every place Kubernetes reads it: on the mount (``readOnly``, which the
kubelet mounts ``ro``), on a claim's volume source (``persistentVolumeClaim.readOnly``, so the
volume is attached read-only where the driver supports it) and on an NFS source (mounted
``ro`` on the node). A write from the server fails with EROFS ("Read-only file system").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..core.shared_data import shared_data_env

VOLUME_PREFIX = "shared-"


def _literal(text: str) -> str:
    """``text`` as a KubeSpawner template that expands to itself: KubeSpawner formats its
    volumes and environment with the user's fields (``{username}``), so braces are doubled."""
    return text.replace("{", "{{").replace("}", "}}")


def shared_data_volume(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The pod volume of one entry (its claim, else its NFS export), read-only."""
    name = f"{VOLUME_PREFIX}{entry['name']}"
    if entry["claim"]:
        return {
            "name": name,
            "persistentVolumeClaim": {"claimName": entry["claim"], "readOnly": True},
        }
    server, path = entry["nfs_server"], entry["nfs_path"]
    if not (server and path):
        raise ValueError(f"shared data {entry['name']!r} names neither a claim nor an NFS export")
    return {
        "name": name,
        "nfs": {"server": _literal(server), "path": _literal(path), "readOnly": True},
    }


def shared_data_pod_settings(entries: Sequence[Mapping[str, Any]], home: str) -> dict[str, Any]:
    """KubeSpawner ``volumes``, ``volume_mounts`` and ``environment`` for ``entries``, the
    servers' home being mounted at ``home`` (HF_HOME stays in it); as templates of
    KubeSpawner's, which expand to these values."""
    env = shared_data_env(entries, home=home, seen_at=lambda e: e["mount_path"])
    return {
        "volumes": [shared_data_volume(e) for e in entries],
        "volume_mounts": [
            {"name": f"{VOLUME_PREFIX}{e['name']}", "mountPath": e["mount_path"], "readOnly": True}
            for e in entries
        ],
        "environment": {key: _literal(value) for key, value in env.items()},
    }
