"""The rules of ``shared_data:`` that a schema cannot say: where a mount path may not be, no two
mount paths inside one another, at most one models cache, and the source each backend needs.
The loader applies them, so every reader of the settings (the hub, the chart's hub) refuses
the same entries, naming the key (``shared_data[1].mount_path``). Whether a one-machine folder
exists and who may write it is the hub's start-up check (``spawner/local/shared_data.py``):
only the machine that runs the servers can tell."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

from .validate import SettingsError

#: folders of the image or the machine a server needs as they are: a shared mount at, inside
#: or above one would hide or shadow them. /home and /root hold homes (Kubernetes servers'
#: /home/jovyan); /mnt/disks is where Kubernetes mounts data disks (spawner/kube/disks.py)
#: and /disks would be ~/disks on one machine, where data disks are linked (core/disks.py).
RESERVED = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/home",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/opt",
    "/proc",
    "/root",
    "/run",
    "/sbin",
    "/sys",
    "/tmp",
    "/usr",
    "/var",
    "/mnt/disks",
    "/disks",
)
MODELS = "models"


def _inside(path: PurePosixPath, other: PurePosixPath) -> bool:
    """Whether one of the two paths is the other or inside it."""
    return path.is_relative_to(other) or other.is_relative_to(path)


def check_shared_data(entries: Sequence[Mapping[str, Any]], backend: str) -> None:
    """Refuse (``SettingsError``, naming the key and what to do) the first entry of
    ``shared_data`` (schema-checked, defaults filled) that no server could mount as asked."""
    seen: dict[str, int] = {}
    paths: list[tuple[int, PurePosixPath]] = []
    models: int | None = None
    for i, entry in enumerate(entries):
        where = f"shared_data[{i}]"
        name = entry["name"]
        if name in seen:
            raise SettingsError(
                f"{where}.name {name!r} is also shared_data[{seen[name]}]'s: give each a name "
                "of its own"
            )
        seen[name] = i
        path = PurePosixPath(entry["mount_path"])  # the schema refuses / and relative paths
        for reserved in RESERVED:
            if _inside(path, PurePosixPath(reserved)):
                raise SettingsError(
                    f"{where}.mount_path {path} would cover or sit in {reserved}, which servers "
                    "need as it is; choose a folder of its own such as /models or /datasets"
                )
        for j, other in paths:
            if _inside(path, other):
                raise SettingsError(
                    f"{where}.mount_path {path} and shared_data[{j}].mount_path {other} are "
                    "inside one another; give each a folder of its own"
                )
        paths.append((i, path))
        if entry["kind"] == MODELS:
            if models is not None:
                raise SettingsError(
                    f"{where}.kind: shared_data[{models}] is already the models cache "
                    "(HF_HUB_CACHE names one folder); make this one kind: datasets"
                )
            models = i
        _check_source(entry, where, backend)


def _check_source(entry: Mapping[str, Any], where: str, backend: str) -> None:
    if backend == "local":
        folder = entry["folder"]
        if not folder or not PurePosixPath(folder).is_absolute():
            raise SettingsError(
                f"{where}.folder must name the folder (an absolute path) holding "
                f"{entry['name']}'s files on this machine, not {folder!r}"
            )
        return
    server, export = entry["nfs_server"], entry["nfs_path"]
    if bool(server) != bool(export):
        raise SettingsError(
            f"{where} needs both nfs_server and nfs_path (an export such as /exports/models)"
        )
    if bool(entry["claim"]) == bool(server):
        raise SettingsError(
            f"{where} needs one of claim (a PersistentVolumeClaim in the servers' namespace) "
            "or nfs_server and nfs_path on Kubernetes, not "
            + ("both" if entry["claim"] else "neither")
        )
