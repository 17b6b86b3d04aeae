"""Run a container of a rendered Deployment as a local process, as the kubelet would run it.

What the pod would see is built from the rendered manifests, not restated: its command and
args with ``$(VAR)`` expanded, its environment (values, ``secretKeyRef``, ``configMapKeyRef``,
``fieldRef``, the Services' variables), and its volumes laid out as files (ConfigMap and Secret
keys, ``subPath`` mounts, claims and emptyDirs as folders) and mounted at the container's
paths in a mount namespace of its own (``unshare --mount``, we are root), so nothing is written
to the machine's /usr/local/etc/jupyterhub or /srv. Where a mount point does not exist here,
its nearest existing parent is covered by an overlay whose changes go to a scratch folder: the
container's own filesystem, never the machine's. The program then runs as the container's user
(``setpriv``: runAsUser, runAsGroup, fsGroup as a group), the volumes given to the fsGroup
first, as the simulated kubelet does for servers (tests/kube_sim/volumes.py).

Kubernetes' rules followed (https://kubernetes.io/docs/):
- Services' variables: concepts/services-networking/service/#environment-variables
  (``{NAME}_SERVICE_HOST``, ``{NAME}_SERVICE_PORT``, ``{NAME}_SERVICE_PORT_{PORT_NAME}`` and the
  docker-links ``{NAME}_PORT*`` ones, name upper-cased with ``-`` as ``_``);
- ``$(VAR)`` in command, args and env values: tasks/inject-data-application/
  define-interdependent-environment-variables (``$$`` escapes, an unknown name stays as written);
- a volume's keys as files, ``items`` choosing and renaming them; a ``subPath`` mount is one
  entry of the volume: concepts/storage/volumes/#using-subpath;
- the service account's token, ``ca.crt`` and ``namespace`` at
  /var/run/secrets/kubernetes.io/serviceaccount (concepts/security/service-accounts) and a
  kubelet-managed /etc/hosts (concepts/services-networking/add-entries-to-pod-etc-hosts-with-
  host-aliases).
"""

from __future__ import annotations

import asyncio
import base64
import os
import shlex
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tests.kube_sim.container_env import expand
from tests.kube_sim.volumes import (
    ProcessUser,
    apply_fs_group,
    drop_privileges,
    exposure,
    machine_image_paths,
    process_user,
)

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: the "images'" own files a non-root container must read: this machine's Python, the tests'
#: virtualenv and this checkout, which may live under a folder others cannot enter (/root)
IMAGE_PATHS = tuple(machine_image_paths())


class Manifests:
    """The rendered objects of one release, looked up by kind and name."""

    def __init__(self, items: list[dict]):
        self.items = items

    def one(self, kind: str, name: str) -> dict:
        found = [m for m in self.items if m["kind"] == kind and m["metadata"]["name"] == name]
        assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
        return found[0]

    def of_kind(self, kind: str) -> list[dict]:
        return [m for m in self.items if m["kind"] == kind]

    def secret_data(self, name: str) -> dict[str, bytes]:
        return secret_data(self.one("Secret", name))

    def configmap_data(self, name: str) -> dict[str, bytes]:
        config = self.one("ConfigMap", name)
        data = {k: v.encode() for k, v in (config.get("data") or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (config.get("binaryData") or {}).items()})
        return data


def service_environment(services: list[dict], cluster_ip: str) -> dict[str, str]:
    """The variables Kubernetes gives every container for each Service of its namespace;
    ``cluster_ip`` stands in for every Service's cluster IP."""
    env: dict[str, str] = {}
    for service in services:
        name = service["metadata"]["name"].upper().replace("-", "_")
        ports = service["spec"].get("ports") or []
        if not ports:
            continue
        env[f"{name}_SERVICE_HOST"] = cluster_ip
        env[f"{name}_SERVICE_PORT"] = str(ports[0]["port"])
        for port in ports:
            if port.get("name"):
                key = port["name"].upper().replace("-", "_")
                env[f"{name}_SERVICE_PORT_{key}"] = str(port["port"])
            proto = port.get("protocol", "TCP")
            link = f"{name}_PORT_{port['port']}_{proto}"
            env[link] = f"{proto.lower()}://{cluster_ip}:{port['port']}"
            env[f"{link}_PROTO"] = proto.lower()
            env[f"{link}_PORT"] = str(port["port"])
            env[f"{link}_ADDR"] = cluster_ip
        env[f"{name}_PORT"] = (
            f"{ports[0].get('protocol', 'TCP').lower()}://{cluster_ip}:{ports[0]['port']}"
        )
    return env


def secret_data(secret: dict) -> dict[str, bytes]:
    """A Secret's keys and values, ``data`` decoded and ``stringData`` over it."""
    data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    data.update({k: v.encode() for k, v in (secret.get("stringData") or {}).items()})
    return data


def _secret_value(ref: dict, secrets: Sequence[dict], namespace: str) -> str:
    """A ``secretKeyRef``'s value, or the kubelet's refusal to start the container
    (CreateContainerConfigError) in its words."""
    found = [s for s in secrets if s["metadata"]["name"] == ref["name"]]
    if not found:
        raise ValueError(f'secret "{ref["name"]}" not found')
    data = secret_data(found[0])
    if ref["key"] not in data:
        raise ValueError(f"couldn't find key {ref['key']} in Secret {namespace}/{ref['name']}")
    return data[ref["key"]].decode()


def container_environment(
    container: dict,
    manifests: Manifests,
    pod: dict[str, str],
    base: dict[str, str],
    secrets: Sequence[dict] = (),
) -> dict[str, str]:
    """``base`` (the image's and the Services' variables) with the container's own ``env``
    over it, in order, each value expanded against those before it. ``pod``: the
    ``metadata.*`` fields a ``fieldRef`` may name (``metadata.namespace``, ...). A
    ``secretKeyRef`` names a rendered Secret or one of ``secrets``, those the cluster holds
    besides the release's (the operator's, made before ``helm install``)."""
    env = dict(base)
    cluster_secrets = [*manifests.of_kind("Secret"), *secrets]
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = expand(str(var["value"]), env)
            continue
        source = var["valueFrom"]
        if "secretKeyRef" in source:
            namespace = pod.get("metadata.namespace", "")
            ref = source["secretKeyRef"]
            env[var["name"]] = _secret_value(ref, cluster_secrets, namespace)
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[var["name"]] = manifests.configmap_data(ref["name"])[ref["key"]].decode()
        elif "fieldRef" in source:
            env[var["name"]] = pod[source["fieldRef"]["fieldPath"]]
        else:
            raise ValueError(f"{var['name']}: no stand-in for {sorted(source)}")
    return env


def container_argv(container: dict, env: dict[str, str]) -> list[str]:
    """``command`` + ``args``, expanded. Without a ``command`` the image's entrypoint would
    run the args: z2jh's images have tini there, which only reaps, so the args run alone."""
    return [
        expand(part, env)
        for part in [*(container.get("command") or []), *(container.get("args") or [])]
    ]


@dataclass(frozen=True)
class Mount:
    """A file or folder here, seen at ``target`` inside the container."""

    source: Path
    target: str


def _write_keys(folder: Path, data: dict[str, bytes], items: list[dict] | None) -> None:
    folder.mkdir(parents=True)
    chosen = items or [{"key": key, "path": key} for key in data]
    for item in chosen:
        path = folder / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[item["key"]])


def container_mounts(
    pod_spec: dict,
    container: dict,
    manifests: Manifests,
    root: Path,
    claims: dict[str, Path],
) -> list[Mount]:
    """The container's ``volumeMounts`` with each volume laid out under ``root``: ConfigMaps
    and Secrets as one file per key, emptyDirs as new folders (0777), claims as the folders
    ``claims`` gives by claim name (they outlive the pod; a fresh one is root's, 0755, as a
    new volume arrives). The pod's ``fsGroup`` is then applied to each, as the kubelet
    applies it (tests/kube_sim/volumes.py)."""
    sources: dict[str, Path] = {}
    fs_group = (pod_spec.get("securityContext") or {}).get("fsGroup")
    for volume in pod_spec.get("volumes") or []:
        folder = root / volume["name"]
        read_only = False
        if "configMap" in volume:
            ref = volume["configMap"]
            _write_keys(folder, manifests.configmap_data(ref["name"]), ref.get("items"))
            read_only = True
        elif "secret" in volume:
            ref = volume["secret"]
            _write_keys(folder, manifests.secret_data(ref["secretName"]), ref.get("items"))
            read_only = True
        elif "emptyDir" in volume:
            folder.mkdir(parents=True)
            folder.chmod(0o777)
        elif "persistentVolumeClaim" in volume:
            folder = claims[volume["persistentVolumeClaim"]["claimName"]]
            if not folder.exists():
                folder.mkdir(parents=True)
                folder.chmod(0o755)
        else:
            raise ValueError(f"volume {volume['name']}: no stand-in for its kind")
        if fs_group is not None:
            apply_fs_group(str(folder), int(fs_group), read_only)
        sources[volume["name"]] = folder
    mounts = []
    for mount in container.get("volumeMounts") or []:
        source = sources[mount["name"]]
        if mount.get("subPath"):
            source = source / mount["subPath"]
        mounts.append(Mount(source, mount["mountPath"].rstrip("/") or "/"))
    return mounts


def container_user(pod_spec: dict, container: dict) -> ProcessUser:
    """Whom the container runs as: its securityContext's runAsUser and runAsGroup over the
    pod's, the pod's fsGroup as a supplementary group (the kubelet's rule,
    tests/kube_sim/volumes.py). The rendered pods say their users; an image's USER
    (root here) only counts where they do not."""
    return process_user({"spec": pod_spec}, container, images={})


def automounts_token(pod_spec: dict, manifests: Manifests, account: str) -> bool:
    """Whether the pod gets its service account's token: the pod's
    ``automountServiceAccountToken``, else the rendered ServiceAccount's, else yes."""
    if pod_spec.get("automountServiceAccountToken") is not None:
        return bool(pod_spec["automountServiceAccountToken"])
    accounts = [a for a in manifests.of_kind("ServiceAccount") if a["metadata"]["name"] == account]
    return all(a.get("automountServiceAccountToken", True) for a in accounts)


def service_account_mount(root: Path, token: str, ca_cert: Path, namespace: str) -> Mount:
    """The projected service account volume every pod gets unless it opts out."""
    folder = root / "serviceaccount"
    folder.mkdir(parents=True)
    (folder / "token").write_text(token)
    (folder / "ca.crt").write_bytes(ca_cert.read_bytes())
    (folder / "namespace").write_text(namespace)
    return Mount(folder, SERVICE_ACCOUNT_DIR)


def hosts_mount(root: Path, pod_name: str, names: list[str], ip: str) -> Mount:
    """The pod's /etc/hosts, as the kubelet writes it, with ``names`` (the Services, which
    cluster DNS would resolve) at ``ip``."""
    path = root / "hosts"
    path.write_text(
        "# Kubernetes-managed hosts file.\n"
        "127.0.0.1\tlocalhost\n"
        f"127.0.0.1\t{pod_name}\n"
        f"{ip}\t{' '.join(names)}\n"
    )
    return Mount(path, "/etc/hosts")


def _nearest_existing(path: PurePosixPath) -> PurePosixPath:
    while not os.path.lexists(path):
        path = path.parent
    return PurePosixPath(os.path.realpath(path))


def _stage_root(mounted: list[str]) -> str:
    """A folder of this machine no mount of the pod covers, where the image's paths wait."""
    for root in ("/tmp", "/dev/shm", "/run"):
        if not any(root == m or root.startswith(m.rstrip("/") + "/") for m in mounted):
            return root
    raise ValueError(f"every staging folder is covered by the pod's mounts: {mounted}")


def mount_script(
    mounts: list[Mount],
    scratch: Path,
    workdir: str,
    read_only_root: bool,
    user: ProcessUser | None = None,
) -> str:
    """A shell script that, run in a new mount namespace, makes the container's view: an
    overlay over each parent that lacks a mount point, the mounts parents first, then
    ``exec "$@"`` in ``workdir``, as ``user`` when given (with IMAGE_PATHS readable to it).
    A mount over a folder that holds another mount's source comes after it (bind sources
    are looked up when mounted). ``read_only_root``
    (``securityContext.readOnlyRootFilesystem``): everything but the mounts is read-only."""
    lines = ["set -e"]
    covered: list[PurePosixPath] = []
    for mount in mounts:
        target = PurePosixPath(mount.target)
        if os.path.lexists(target):
            continue
        parent = _nearest_existing(target.parent)
        if any(parent == c or parent.is_relative_to(c) for c in covered):
            continue
        covered.append(parent)
    # the image's paths (this machine's Python and checkout) wait outside what the mounts
    # cover and come back after them: a checkout under /tmp would be hidden by an emptyDir
    # at /tmp, which hides nothing of a real image
    mounted = [*(m.target for m in mounts), *(str(c) for c in covered)]
    before, after = exposure(
        list(IMAGE_PATHS),
        mounted,
        stage_root=_stage_root(mounted),
        hidden=user is not None and user.uid != 0,
    )
    lines += before
    for index, parent in enumerate(sorted(covered, key=lambda p: len(p.parts))):
        upper, work = scratch / f"upper-{index}", scratch / f"work-{index}"
        upper.mkdir(parents=True)
        work.mkdir(parents=True)
        options = f"lowerdir={parent},upperdir={upper},workdir={work}"
        lines.append(
            f"mount -t overlay overlay -o {shlex.quote(options)} {shlex.quote(str(parent))}"
        )

    def shadows_a_source(mount: Mount) -> bool:
        return any(m.source.is_relative_to(mount.target) for m in mounts if m is not mount)

    for mount in sorted(
        mounts, key=lambda m: (shadows_a_source(m), len(PurePosixPath(m.target).parts))
    ):
        target = shlex.quote(mount.target)
        if mount.source.is_dir():
            lines.append(f"mkdir -p {target}")
        else:
            lines.append(f"mkdir -p {shlex.quote(str(PurePosixPath(mount.target).parent))}")
            lines.append(f"[ -e {target} ] || touch {target}")
        lines.append(f"mount --bind {shlex.quote(str(mount.source))} {target}")
    lines += after
    if read_only_root:
        lines.append("mount -o remount,bind,ro /")
        lines += [f"mount -o remount,ro {shlex.quote(str(parent))}" for parent in covered]
    lines.append(f"cd {shlex.quote(workdir)}")
    lines.append(f'exec {drop_privileges(user) if user else ""}"$@"')
    return "\n".join(lines)


def run_in_pod(
    argv: list[str],
    env: dict[str, str],
    mounts: list[Mount],
    scratch: Path,
    workdir: str,
    log: Path,
    read_only_root: bool = False,
    network: Sequence[str] = (),
    user: ProcessUser | None = None,
) -> subprocess.Popen:
    """Start ``argv`` in a mount namespace of its own that shows ``mounts``, as ``user``
    (:func:`container_user`; None: root). ``network``: the command prefix that enters the
    pod's network namespace (``nsenter --net=...``, from the simulated cluster's pod
    network); none: this machine's network."""
    script = mount_script(mounts, scratch, workdir, read_only_root, user)
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                *network,
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                script,
                "pod",
                *argv,
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class ServiceRelay:
    """A Service's routing, for one port: connections to ``host:port`` are passed on to
    ``target`` (host, port), as kube-proxy passes a Service's connections to its endpoint.
    For pods on the pod network, which reach the Services at the gateway, where the endpoint
    (a database on this machine's loopback) does not listen. Serves from a thread of its own
    while the ``with`` block lasts."""

    def __init__(self, host: str, port: int, target: tuple[str, int]):
        self.host, self.port, self.target = host, port, target
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    def __enter__(self) -> ServiceRelay:
        self._thread.start()
        start = asyncio.start_server(self._connection, self.host, self.port)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
