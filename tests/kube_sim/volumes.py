"""What a pod's process sees of its volumes, and as whom it runs.

Each PersistentVolume is a directory on the host, created as a fresh ext4 volume arrives: owned
by root, mode 0755; an NFS export is a host directory the test names (`nfs_exports`), and a pod
naming another stays ContainerCreating with FailedMount, as no server would answer. A pod's
process starts in a private mount namespace of its own where every volume is bind-mounted at
its container's mountPath (subPath and readOnly too), then drops to the pod's user with
`setpriv`: the container's or pod's securityContext runAsUser/runAsGroup,
else the image's user (`images`, a table the tests set, as an image's USER would), with fsGroup
and supplementalGroups as extra groups. fsGroup is applied to each volume before it is mounted
as the kubelet does (pkg/volume/volume_linux.go: group set to fsGroup, files g+rw, directories
g+rwx and setgid; fsGroupChangePolicy OnRootMismatch skips a volume whose root already
matches). So a non-root server can write a fresh home only if the pod says fsGroup.

The simulated "image" is this machine: the Python the pods run, and the checkout whose gputap
they run, may live where their user cannot reach them (the root user's home is mode 0700 on a
fresh machine, and a checkout may lie inside it). The paths `machine_image_paths()` names are made
readable in the pod's namespace, as an image's own files are: an unreachable ancestor is
covered by an empty tmpfs and each path bound back into it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from . import storage
from .api import PERSISTENT_VOLUME_CLAIM, POD, Api
from .store import Obj


@dataclass(frozen=True)
class ImageUser:
    """The user an image runs as (its USER) and that user's home (HOME, the WORKDIR)."""

    uid: int
    gid: int
    home: str


ROOT_USER = ImageUser(0, 0, "")


@dataclass(frozen=True)
class ProcessUser:
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


def image_name(image: str) -> str:
    """An image reference without its tag or digest ("gputap/singleuser:0.1": the name
    "gputap/singleuser")."""
    name = image.split("@", 1)[0]
    slash = name.rfind("/")
    colon = name.rfind(":")
    return name[:colon] if colon > slash else name


def process_user(pod: Obj, container: Obj, images: dict[str, ImageUser]) -> ProcessUser:
    """Whom the container's process runs as: its securityContext, the pod's, then the image."""
    image = images.get(image_name(container.get("image", "")), ROOT_USER)
    pod_ctx = pod["spec"].get("securityContext") or {}
    ctx = {**pod_ctx, **(container.get("securityContext") or {})}
    uid = ctx.get("runAsUser", image.uid)
    # the runtime takes the group from the image's passwd entry, which only its user has
    gid = ctx.get("runAsGroup", image.gid if uid == image.uid else 0)
    groups = [g for g in (pod_ctx.get("fsGroup"),) if g is not None]
    groups += [g for g in pod_ctx.get("supplementalGroups") or [] if g not in groups]
    home = image.home if uid == image.uid else ""
    return ProcessUser(int(uid), int(gid), tuple(int(g) for g in groups), home)


def runs_as_root_against_policy(pod: Obj, container: Obj, images: dict[str, ImageUser]) -> str:
    """The kubelet's refusal of a container that asks ``runAsNonRoot`` and would run as root
    (its securityContext's user, the pod's, or the image's), '' when it may start."""
    ctx = {
        **(pod["spec"].get("securityContext") or {}),
        **(container.get("securityContext") or {}),
    }
    if ctx.get("runAsNonRoot") is not True or process_user(pod, container, images).uid != 0:
        return ""
    meta = pod["metadata"]
    return (
        f'container has runAsNonRoot and image will run as root (pod: "{meta["name"]}_'
        f'{meta.get("namespace", "")}({meta.get("uid", "")})", container: {container["name"]})'
    )


def apply_fs_group(path: str, gid: int, read_only: bool = False, policy: str = "Always") -> None:
    """Give a volume to group `gid` as the kubelet does for fsGroup."""
    root = os.stat(path)
    wanted = 0o440 if read_only else 0o660
    dir_wanted = wanted | 0o110 | stat.S_ISGID
    if (
        policy == "OnRootMismatch"
        and root.st_gid == gid
        and (root.st_mode & dir_wanted) == dir_wanted
    ):
        return
    for top, _dirs, files in os.walk(path):
        for name, mask in [(top, dir_wanted)] + [(os.path.join(top, f), wanted) for f in files]:
            info = os.lstat(name)
            if stat.S_ISLNK(info.st_mode):
                continue
            os.chown(name, -1, gid)
            os.chmod(name, stat.S_IMODE(info.st_mode) | mask)


#: this checkout: the gputap code (and the proxy's node_modules) the simulated images hold
CHECKOUT = Path(__file__).resolve().parents[2]


def machine_image_paths() -> list[str]:
    """What the simulated images hold of this machine: the virtualenv the tests run in (its
    programs: python, jupyterhub-singleuser, gputap-worker), the Python it was made from
    (each folder its interpreter's links pass through), and this checkout. Outermost first,
    none inside another."""
    found = [sys.prefix, os.path.realpath(sys.base_prefix), str(CHECKOUT)]
    link = sys.executable
    for _ in range(40):  # a chain of links: python -> python3 -> /root/.pyenv/.../python3.11
        if not os.path.islink(link):
            break
        target = os.path.join(os.path.dirname(link), os.readlink(link))
        found.append(os.path.dirname(os.path.abspath(target)))
        link = target
    paths: list[str] = []
    for path in sorted({os.path.abspath(p) for p in found}, key=len):
        if not any(path == p or path.startswith(p.rstrip("/") + "/") for p in paths):
            paths.append(path)
    return paths


def _hidden_ancestor(path: str) -> str | None:
    """The topmost ancestor of `path` that others may not enter, if any."""
    parts = Path(path).parts
    for i in range(2, len(parts) + 1):
        ancestor = str(Path(*parts[:i]))
        if not os.stat(ancestor).st_mode & stat.S_IXOTH:
            return ancestor
    return None


class Volumes:
    """Volume directories on the host and the launch wrapper of each pod's process."""

    def __init__(
        self,
        api: Api,
        images: dict[str, ImageUser] | None = None,
        image_paths: list[str] | None = None,
        nfs_exports: dict[str, str] | None = None,
    ):
        self.api = api
        self.images = dict(images or {})
        #: the NFS exports the nodes can mount, "server:/path" -> the host directory serving it
        self.nfs_exports = dict(nfs_exports or {})
        self.image_paths = image_paths if image_paths is not None else machine_image_paths()
        self._tmp = tempfile.TemporaryDirectory(prefix="kube-sim-volumes-")
        self.root = self._tmp.name

    def cleanup(self) -> None:
        self._tmp.cleanup()

    def volume_dir(self, pv_name: str) -> str:
        """A PersistentVolume's directory, made as a fresh volume arrives (root, 0755)."""
        path = os.path.join(self.root, "pv", pv_name)
        if not os.path.isdir(path):
            os.makedirs(path)
            os.chown(path, 0, 0)
            os.chmod(path, 0o755)
        return path

    def attach_error(self, pod: Obj) -> str | None:
        """The Multi-Attach error that keeps the pod ContainerCreating, or None."""
        conflict = storage.attach_conflict(self.api, pod, self.api.view(POD))
        return storage.multi_attach_message(*conflict) if conflict else None

    def mount_error(self, pod: Obj) -> str | None:
        """Why the kubelet cannot mount one of the pod's volumes (an NFS export no server
        serves: FailedMount, the pod ContainerCreating), or None."""
        for volume in pod["spec"].get("volumes") or []:
            nfs = volume.get("nfs")
            if nfs is None:
                continue
            export = f"{nfs.get('server', '')}:{nfs.get('path', '')}"
            if export not in self.nfs_exports:
                return (
                    f'MountVolume.SetUp failed for volume "{volume["name"]}" : mount failed: '
                    f"exit status 32\nMounting command: mount\nMounting arguments: -t nfs "
                    f"{export} {volume['name']}\nOutput: mount.nfs: access denied by server "
                    f"while mounting {export}"
                )
        return None

    def _sources(self, pod: Obj) -> dict[str, tuple[str, bool]]:
        """Host directory and read-only flag of every volume a mount can name, by volume."""
        ns = pod["metadata"]["namespace"]
        sources: dict[str, tuple[str, bool]] = {}
        for volume in pod["spec"].get("volumes") or []:
            if volume.get("persistentVolumeClaim"):
                ref = volume["persistentVolumeClaim"]
                claim = self.api.find(PERSISTENT_VOLUME_CLAIM, ns, ref["claimName"])
                pv_name = (claim or {}).get("spec", {}).get("volumeName")
                if pv_name:
                    sources[volume["name"]] = (self.volume_dir(pv_name), bool(ref.get("readOnly")))
            elif volume.get("nfs"):
                nfs = volume["nfs"]
                export = self.nfs_exports.get(f"{nfs.get('server', '')}:{nfs.get('path', '')}")
                if export:
                    sources[volume["name"]] = (export, bool(nfs.get("readOnly")))
            elif "emptyDir" in volume:
                path = os.path.join(self.root, "pods", pod["metadata"]["uid"], volume["name"])
                os.makedirs(path, exist_ok=True)
                os.chmod(path, 0o777)
                sources[volume["name"]] = (path, False)
        return sources

    def wrap(
        self, pod: Obj, container: Obj, argv: list[str], env: dict[str, str], workdir: str
    ) -> tuple[list[str], dict[str, str]]:
        """The command line that runs `argv` in the pod's mount namespace as the pod's user,
        and its environment (HOME the user's home unless the container sets it)."""
        user = process_user(pod, container, self.images)
        mounts = container.get("volumeMounts") or []
        if user.uid == 0 and not mounts:
            return argv, env
        sources = self._sources(pod)
        fs_group = (pod["spec"].get("securityContext") or {}).get("fsGroup")
        policy = (pod["spec"].get("securityContext") or {}).get("fsGroupChangePolicy", "Always")
        lines = ["set -e"]
        if fs_group is not None:
            nfs = {v["name"] for v in pod["spec"].get("volumes") or [] if v.get("nfs")}
            for name, (path, read_only) in sources.items():
                if name not in nfs:  # the kubelet never changes an NFS export's owner
                    apply_fs_group(path, int(fs_group), read_only, policy)
        if user.uid != 0:
            lines += self._expose_image(pod)
        for mount in mounts:
            if mount["name"] not in sources:
                continue
            path, read_only = sources[mount["name"]]
            if mount.get("subPath"):
                path = os.path.join(path, mount["subPath"])
                os.makedirs(path, exist_ok=True)
            target = shlex.quote(mount["mountPath"])
            lines += [f"mkdir -p {target}", f"mount --bind {shlex.quote(path)} {target}"]
            if read_only or mount.get("readOnly"):
                lines.append(f"mount -o remount,bind,ro {target}")
        home = user.home or (workdir if user.uid == 0 else "/")
        if not any(e["name"] == "HOME" for e in container.get("env") or []):
            env = {**env, "HOME": home}
        start_dir = container.get("workingDir") or home
        lines.append(f"cd {shlex.quote(start_dir)} 2>/dev/null || cd /")
        lines.append(f'exec {drop_privileges(user)}"$@"')
        wrapper = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
        return [*wrapper, "\n".join(lines), "sh", *argv], env

    def _expose_image(self, pod: Obj) -> list[str]:
        """Shell lines making the image's paths readable under ancestors its user cannot enter."""
        return expose_paths(self.image_paths)

    def forget(self, pod: Obj) -> None:
        """Remove a finished pod's emptyDir volumes."""
        shutil.rmtree(os.path.join(self.root, "pods", pod["metadata"]["uid"]), ignore_errors=True)


def drop_privileges(user: ProcessUser) -> str:
    """The command prefix (ending in a space, or empty for root) that runs a program as
    ``user``: its uid, gid and exactly its supplementary groups."""
    if user.uid == 0 and user.gid == 0 and not user.groups:
        return ""
    groups = ",".join(str(g) for g in user.groups)
    return f"setpriv --reuid={user.uid} --regid={user.gid} " + (
        f"--groups={groups} -- " if groups else "--clear-groups -- "
    )


def expose_paths(paths: list[str]) -> list[str]:
    """Shell lines, for a mount namespace, making ``paths`` (an image's own files: this
    machine's Python and checkout) readable under ancestors others cannot enter: each such
    ancestor is covered by an empty tmpfs and the path bound back into it. The binds wait in
    a folder of their own in /tmp meanwhile (a covered ancestor may hold the caller's
    scratch folders too), removed once they are back."""
    before, after = exposure(paths)
    return before + after


def exposure(
    paths: list[str],
    mounted: Sequence[str] = (),
    stage_root: str = "/tmp",
    hidden: bool = True,
) -> tuple[list[str], list[str]]:
    """:func:`expose_paths` around the caller's own mounts: (lines before them, lines after).
    ``mounted``: the folders those mounts cover (a pod's emptyDir at /tmp, which hides a
    checkout under /tmp as a real pod's hides nothing of its image); each path under one is
    bound away before and back after them, as is each path under an ancestor others cannot
    enter (``hidden``: the pod's user is not root). ``stage_root`` must be outside every
    mounted folder."""

    def under(path: str, folder: str) -> bool:
        return path == folder or path.startswith(folder.rstrip("/") + "/")

    wanted: list[tuple[str, str | None]] = []
    for path in paths:
        ancestor = _hidden_ancestor(path) if hidden else None
        if ancestor is not None or any(under(path, m) for m in mounted):
            wanted.append((path, ancestor))
    if not wanted:
        return [], []
    if any(under(stage_root, m) for m in mounted):
        raise ValueError(f"the image's paths cannot wait in {stage_root}: a mount covers it")
    before = [f"stage=$(mktemp -d {shlex.quote(stage_root)}/gputap-image.XXXXXX)"]
    covers: list[str] = []
    after: list[str] = []
    for i, (path, ancestor) in enumerate(wanted):
        before += [f'mkdir "$stage/{i}"', f'mount --bind {shlex.quote(path)} "$stage/{i}"']
        after += [
            f"mkdir -p {shlex.quote(path)}",
            f'mount --move "$stage/{i}" {shlex.quote(path)}',
            f'rmdir "$stage/{i}"',
        ]
        if ancestor is not None and ancestor not in covers:
            covers.append(ancestor)
    cover_lines = [f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(c)}" for c in covers]
    return before, cover_lines + after + ['rmdir "$stage"']
