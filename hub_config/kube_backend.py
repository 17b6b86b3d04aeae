"""The hub's configuration for the Kubernetes backend (``spawner.backend: kubernetes``):
KubeSpawner's settings from gputap's, its reflectors' timing, where pods reach the hub.

A module of its own, imported only when that backend is configured: the Kubernetes client it
brings costs a one-machine hub 0.3-0.5 CPU-s at every start (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import ipaddress
from typing import Any

from gputap_common.kube_watch import WATCH_GRACE_SECONDS
from gputap_common.settings import SettingsError
from spawner.core.catalog import Catalog
from spawner.kube.homes import KUBE_HOME
from spawner.kube.machine import keep_placeholders
from spawner.kube.placeholders import check_wanted
from spawner.kube.watch import WATCH_SECONDS

#: when the kubelet gives a volume to fs_gid: only when its root is not the group's already
FS_GROUP_CHANGE_POLICY = "OnRootMismatch"


def configure(c: Any, kube: dict[str, Any], hub_port: int) -> None:
    """Fill JupyterHub's config object ``c`` for servers as pods (``spawner.kubernetes``), the
    hub on a machine of its own (on the chart, z2jh places the hub: hub_config/z2jh.py)."""
    configure_spawner(c, kube)
    _hub_for_pods(c, kube, hub_port)


def configure_spawner(c: Any, kube: dict[str, Any]) -> None:
    """KubeSpawner's settings from ``spawner.kubernetes``: image, homes, users, runtime
    class, priorities."""
    c.JupyterHub.spawner_class = "gputap-kubernetes"
    if kube["api_host"]:
        c.KubeSpawner.k8s_api_host = kube["api_host"]
    if kube["hub_connect_url"]:
        c.JupyterHub.hub_connect_url = kube["hub_connect_url"]
    c.KubeSpawner.namespace = kube["namespace"]
    c.KubeSpawner.image = kube["image"]
    if kube["cmd"]:
        c.KubeSpawner.cmd = list(kube["cmd"])
    if kube["args"]:
        c.KubeSpawner.args = list(kube["args"])
    # beside z2jh's singleuser.extraEnv on the chart (gputap's own win where both name one)
    c.KubeSpawner.environment = {**c.KubeSpawner.get("environment", {}), **kube["environment"]}
    # one home per user, kept across servers, restarts and card changes
    c.KubeSpawner.storage_pvc_ensure = True
    c.KubeSpawner.pvc_name_template = "home-{username}"
    c.KubeSpawner.storage_capacity = kube["home_size"]
    if kube["storage_class"]:
        c.KubeSpawner.storage_class = kube["storage_class"]
    c.KubeSpawner.storage_access_modes = [kube["home_access_mode"]]
    c.KubeSpawner.volumes = [{"name": "home", "persistentVolumeClaim": {"claimName": "{pvc_name}"}}]
    c.KubeSpawner.volume_mounts = [{"name": "home", "mountPath": KUBE_HOME}]
    _reflectors(c)
    # servers run as the single-user image's user; volumes arrive owned by root, so they are
    # given to its group (fsGroup), or a fresh home is not writable (docs/kubernetes.md)
    c.KubeSpawner.uid = kube["uid"]
    c.KubeSpawner.fs_gid = kube["fs_gid"]
    # and only when a volume's root is not the group's yet: a home of a million files is not
    # walked and re-chowned at every start (an operator's own policy stays)
    # Pod Security "restricted" admits them (docs/kubernetes.md, "Pod Security"): never root,
    # the runtime's seccomp profile, no capabilities, no privilege escalation; workers copy
    # both from their server (an operator's own policy stays)
    c.KubeSpawner.pod_security_context = {
        "fsGroupChangePolicy": FS_GROUP_CHANGE_POLICY,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
        **c.KubeSpawner.get("pod_security_context", {}),
    }
    c.KubeSpawner.allow_privilege_escalation = False
    c.KubeSpawner.container_security_context = {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
        **c.KubeSpawner.get("container_security_context", {}),
    }
    if kube["runtime_class"]:
        # beside z2jh's singleuser.extraPodConfig on the chart; workers copy it from the server
        c.KubeSpawner.extra_pod_config = {
            **c.KubeSpawner.get("extra_pod_config", {}),
            "runtimeClassName": kube["runtime_class"],
        }
    # they must exist: the Helm chart creates them, one machine's operator does (kubernetes.md)
    classes = kube["priority_classes"]
    if classes["on_demand"]:
        c.GPUKubeSpawner.on_demand_priority_class = classes["on_demand"]
    if classes["spot"]:
        c.GPUKubeSpawner.spot_priority_class = classes["spot"]


def _reflectors(c: Any) -> None:
    """KubeSpawner's pod and event reflectors (how the hub sees a server start and stop) time
    their watches out as gputap's own do: KubeSpawner's default would leave a watch whose
    connection died without closing unnoticed for 60 s (docs/kubernetes.md, "Watches")."""
    c.ResourceReflector.timeout_seconds = WATCH_SECONDS
    c.ResourceReflector.request_timeout = WATCH_SECONDS + WATCH_GRACE_SECONDS


def _hub_for_pods(c: Any, kube: dict[str, Any], hub_port: int) -> None:
    """Where the hub listens when it runs on a machine of its own and spawns pods: at an
    address pods reach (``spawner.kubernetes.hub_ip``), never loopback only. A pod has its own
    network namespace, whose 127.0.0.1 is the pod itself (docs/kubernetes.md, "How servers
    reach the hub"); servers are told http://HUB_IP:HUB_PORT, or ``hub_connect_url``."""
    where = "spawner.kubernetes.hub_ip"
    hint = (
        "an IP address of this machine that the pods reach, such as the node's InternalIP or "
        "the pod network's gateway on it (k3s: 10.42.0.1), or 0.0.0.0 with "
        "spawner.kubernetes.hub_connect_url"
    )
    if not kube["hub_ip"]:
        raise SettingsError(
            f"{where} is empty: servers' pods have their own network and cannot reach a hub on "
            f"127.0.0.1; set it to {hint}"
        )
    try:
        address = ipaddress.ip_address(kube["hub_ip"])
    except ValueError:
        raise SettingsError(
            f"{where} {kube['hub_ip']!r} is not an IP address; set it to {hint}"
        ) from None
    if address.is_loopback:
        raise SettingsError(
            f"{where} {address} is a loopback address, which in a pod is the pod itself; "
            f"set it to {hint}"
        )
    if address.is_unspecified and not kube["hub_connect_url"]:
        raise SettingsError(
            f"{where} {address} listens on every address but names none a pod can dial "
            "(JupyterHub would tell servers this machine's hostname); set "
            f"spawner.kubernetes.hub_connect_url too, e.g. http://10.42.0.1:{hub_port}"
        )
    c.JupyterHub.hub_ip = str(address)


#: the placeholder keepers running in this hub (a task nobody holds may be collected)
_keepers: set[asyncio.Task] = set()
#: how long one request of KubeSpawner's to the API server (a home's claim, a pod) may take
API_REQUEST_SECONDS = 30


def configure_shared(c: Any, spawner: dict[str, Any], catalog: Catalog) -> None:
    """What the Kubernetes backend needs on one machine and under the chart alike, after
    the spawner's settings: the API server's time, and the placeholders."""
    api_timeouts(c, spawner["start_timeout"])
    placeholders(c, spawner["kubernetes"], catalog)


def api_timeouts(c: Any, start_timeout: int) -> None:
    """KubeSpawner gives one request 3 s and its retries 30 s, then fails the start. A class
    clicking Start at once slows the API server past both (bench/kube_spawn.py: 500 users
    in 10 s), and a request killed at 3 s is sent again, adding to the load: a slow API
    server delays a start rather than failing it, up to the start's own timeout
    (docs/kubernetes.md, "Watches"). An operator's own values stay."""
    if "k8s_api_request_timeout" not in c.KubeSpawner:
        c.KubeSpawner.k8s_api_request_timeout = min(API_REQUEST_SECONDS, start_timeout)
    if "k8s_api_request_retry_timeout" not in c.KubeSpawner:
        c.KubeSpawner.k8s_api_request_retry_timeout = start_timeout


def placeholders(c: Any, kube: dict[str, Any], catalog: Catalog) -> None:
    """``spawner.kubernetes.placeholders`` kept from the hub's start, in the servers'
    namespace, at the spot class, tolerating what servers tolerate. Checked here, so a card
    the catalog lacks stops the hub with one line; nothing runs outside the hub's loop (a
    check of the settings)."""
    wanted = {key: count for key, count in kube["placeholders"].items() if count}
    try:
        check_wanted(wanted, catalog)
    except ValueError as e:
        raise SettingsError(f"spawner.kubernetes.placeholders: {e}") from None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    if not wanted:
        return
    spawner_config = c.KubeSpawner
    keeping = keep_placeholders(
        namespace=kube["namespace"],
        wanted=wanted,
        catalog=catalog,
        priority_class=kube["priority_classes"]["spot"] or "gputap-spot",
        image=kube["placeholder_image"],
        tolerations=c.GPUKubeSpawner.get("tolerations", spawner_config.get("tolerations")) or [],
        api={
            "host": spawner_config.get("k8s_api_host"),
            "ssl_ca_cert": spawner_config.get("k8s_api_ssl_ca_cert"),
            "verify_ssl": spawner_config.get("k8s_api_verify_ssl"),
        },
    )

    def start() -> None:
        task = asyncio.ensure_future(keeping)
        _keepers.add(task)
        task.add_done_callback(_keepers.discard)

    loop.call_soon(start)
