"""The Kubernetes backend's hub configuration (hub_config/kube_backend.py) as the pods
KubeSpawner then builds from it (kubespawner.objects.make_pod, as its get_pod_manifest)."""

from kubernetes_asyncio.client import ApiClient
from kubespawner.objects import make_pod
from traitlets.config import Config

from gputap_common.settings import settings_from_mapping
from hub_config.kube_backend import configure_spawner
from tests.kube_sim.pod_security import restricted_violations


def configured(c: Config | None = None, **kube) -> Config:
    """``c`` (z2jh's configuration, or none) with gputap's for ``spawner.kubernetes``."""
    c = c or Config()
    raw = {"spawner": {"backend": "kubernetes", "kubernetes": kube}}
    configure_spawner(c, settings_from_mapping(raw, "test", {}).spawner["kubernetes"])
    return c


def server_pod(c: Config) -> dict:
    """The server pod KubeSpawner builds from configuration ``c``, as the API takes it."""
    k = c.KubeSpawner
    pod = make_pod(
        name="jupyter-alice",
        cmd=["jupyterhub-singleuser"],
        port=8888,
        image=k.image,
        uid=k.uid,
        fs_gid=k.fs_gid,
        pod_security_context=k.get("pod_security_context"),
        container_security_context=k.get("container_security_context"),
        allow_privilege_escalation=k.get("allow_privilege_escalation"),
        extra_pod_config=k.get("extra_pod_config"),
    )
    return ApiClient().sanitize_for_serialization(pod)


async def test_homes_are_given_to_the_servers_group_only_when_their_root_is_not_yet():
    spec = server_pod(configured())["spec"]
    # the kubelet walks a volume only when its root is not the group's: a home of a million
    # files is not re-chowned at every start
    assert spec["securityContext"]["fsGroup"] == 100
    assert spec["securityContext"]["fsGroupChangePolicy"] == "OnRootMismatch"
    # an operator's own policy stays
    c = Config()
    c.KubeSpawner.pod_security_context = {"fsGroupChangePolicy": "Always"}
    assert server_pod(configured(c))["spec"]["securityContext"]["fsGroupChangePolicy"] == "Always"


async def test_servers_run_under_the_runtime_class_named_else_the_clusters_default():
    assert "runtimeClassName" not in server_pod(configured())["spec"]
    c = Config()
    c.KubeSpawner.extra_pod_config = {"enableServiceLinks": False}  # z2jh's extraPodConfig
    spec = server_pod(configured(c, runtime_class="nvidia"))["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["enableServiceLinks"] is False


async def test_servers_pods_pass_pod_security_restricted_and_an_operators_policy_stays():
    assert restricted_violations(server_pod(configured())["spec"]) == []
    c = Config()
    c.KubeSpawner.container_security_context = {
        "capabilities": {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    }
    spec = server_pod(configured(c))["spec"]
    assert restricted_violations(spec) == [
        "unrestricted capabilities (container \"notebook\" adds ['SYS_PTRACE'])"
    ]
