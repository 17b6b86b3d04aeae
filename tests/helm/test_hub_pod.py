"""tests/helm/hub_pod.py: a container's mounts are seen inside its mount namespace only, the
Services' variables and the container's environment are as Kubernetes gives them."""

import socket
import sys
import threading
from pathlib import Path

import pytest

from tests.helm.hub_pod import (
    Manifests,
    Mount,
    ServiceRelay,
    automounts_token,
    container_environment,
    container_mounts,
    container_user,
    run_in_pod,
    service_environment,
)

MISSING = "/usr/local/etc/gputap-hub-pod-test/config"


def run(
    tmp_path: Path, mounts: list[Mount], script: str, read_only_root: bool = False, user=None
) -> str:
    log = tmp_path / "out.log"
    proc = run_in_pod(
        ["sh", "-c", script], {"PATH": "/usr/bin:/bin"}, mounts, tmp_path / "scratch", "/", log,
        read_only_root, user=user,
    )  # fmt: skip
    assert proc.wait(30) == 0, log.read_text()
    return log.read_text()


def test_a_mount_at_a_missing_path_is_seen_inside_only(tmp_path):
    config = tmp_path / "config"
    config.mkdir()
    (config / "z2jh.py").write_text("print('z2jh')\n")
    out = run(tmp_path, [Mount(config, MISSING)], f"cat {MISSING}/z2jh.py; ls /usr/local/etc")
    assert "print('z2jh')" in out and "gputap-hub-pod-test" in out
    assert not Path(MISSING).parent.exists()


def test_a_read_only_root_leaves_only_the_mounts_writable(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    script = f"touch {MISSING}/ok; touch /usr/local/etc/no 2>/dev/null || echo refused"
    assert "refused" in run(tmp_path, [Mount(data, MISSING)], script, read_only_root=True)
    assert (data / "ok").exists()
    assert not Path("/usr/local/etc/no").exists()


def test_services_variables_follow_kubernetes_naming():
    service = {
        "metadata": {"name": "proxy-api"},
        "spec": {"ports": [{"name": "api", "port": 8001}]},
    }
    env = service_environment([service], "10.0.0.7")
    assert env["PROXY_API_SERVICE_HOST"] == "10.0.0.7"
    assert env["PROXY_API_SERVICE_PORT"] == "8001"
    assert env["PROXY_API_SERVICE_PORT_API"] == "8001"
    assert env["PROXY_API_PORT"] == "tcp://10.0.0.7:8001"
    assert env["PROXY_API_PORT_8001_TCP_ADDR"] == "10.0.0.7"


def test_environment_and_volumes_come_from_the_rendered_objects(tmp_path):
    manifests = Manifests(
        [
            {"kind": "Secret", "metadata": {"name": "hub"}, "data": {"token": "czNjcjN0"}},
            {"kind": "ConfigMap", "metadata": {"name": "hub"}, "data": {"a.py": "A", "b": "B"}},
        ]
    )
    container = {
        "env": [
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}},
            {"name": "URL", "value": "http://hub:$(HUB_SERVICE_PORT)/$(NS)"},
        ],
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/x/a.py", "subPath": "a.py"},
            {"name": "config", "mountPath": "/etc/x/config/"},
        ],
    }
    env = container_environment(
        container, manifests, {"metadata.namespace": "gputap"}, {"HUB_SERVICE_PORT": "8081"}
    )
    assert env["TOKEN"] == "s3cr3t" and env["URL"] == "http://hub:8081/gputap"
    spec = {"volumes": [{"name": "config", "configMap": {"name": "hub"}}]}
    mounts = container_mounts(spec, container, manifests, tmp_path, claims={})
    assert [(m.source.relative_to(tmp_path), m.target) for m in mounts] == [
        (Path("config/a.py"), "/etc/x/a.py"),
        (Path("config"), "/etc/x/config"),
    ]
    assert (tmp_path / "config" / "b").read_text() == "B"


def test_the_token_is_mounted_unless_the_pod_or_its_account_opts_out():
    manifests = Manifests(
        [
            {"kind": "ServiceAccount", "metadata": {"name": "quiet"}},
            {
                "kind": "ServiceAccount",
                "metadata": {"name": "none"},
                "automountServiceAccountToken": False,
            },
        ]
    )
    assert automounts_token({}, manifests, "default")
    assert automounts_token({}, manifests, "quiet")
    assert not automounts_token({}, manifests, "none")
    assert automounts_token({"automountServiceAccountToken": True}, manifests, "none")
    assert not automounts_token({"automountServiceAccountToken": False}, manifests, "quiet")


def test_secret_refs_resolve_to_the_operators_secrets_too():
    rendered = Manifests(
        [{"kind": "Secret", "metadata": {"name": "hub"}, "data": {"token": "czNjcjN0"}}]
    )
    # made by the operator before `helm install` (kubectl create secret generic ...)
    operators = [
        {"kind": "Secret", "metadata": {"name": "gputap-db"}, "data": {"url": "cGc6Ly9kYg=="}}
    ]
    container = {
        "env": [
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}},
            {"name": "DB", "valueFrom": {"secretKeyRef": {"name": "gputap-db", "key": "url"}}},
        ]
    }
    env = container_environment(container, rendered, {}, {}, secrets=operators)
    assert env["TOKEN"] == "s3cr3t" and env["DB"] == "pg://db"
    # a Secret nobody made: the kubelet would not start the container
    missing = {"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}}]}
    with pytest.raises(ValueError, match='secret "nope" not found'):
        container_environment(missing, rendered, {}, {}, secrets=operators)
    absent_key = {
        "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "gputap-db", "key": "k"}}}]
    }
    with pytest.raises(ValueError, match="couldn't find key k in Secret gputap/gputap-db"):
        container_environment(absent_key, rendered, {"metadata.namespace": "gputap"}, {},
                              secrets=operators)  # fmt: skip


def test_a_service_relay_passes_connections_to_its_endpoint_both_ways():
    endpoint = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = endpoint.accept()
        with conn:
            conn.sendall(b"echo:" + conn.recv(100))

    threading.Thread(target=answer, daemon=True).start()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with (
        ServiceRelay("127.0.0.1", port, endpoint.getsockname()),
        socket.create_connection(("127.0.0.1", port), timeout=5) as client,
    ):
        client.sendall(b"ping")
        assert client.recv(100) == b"echo:ping"
        # the endpoint closed: so does the relayed connection
        assert client.recv(100) == b""
    endpoint.close()


def test_a_container_runs_as_its_user_and_its_volumes_are_its_fs_groups(tmp_path):
    pod_spec = {
        "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 2000},
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "tmp", "emptyDir": {}},
        ],
    }
    container = {
        "securityContext": {"runAsUser": 1001},
        "volumeMounts": [
            {"name": "data", "mountPath": MISSING},
            {"name": "tmp", "mountPath": f"{MISSING}-tmp"},
        ],
    }
    claims = {"data": tmp_path / "claims" / "data"}
    mounts = container_mounts(pod_spec, container, Manifests([]), tmp_path / "volumes", claims)
    user = container_user(pod_spec, container)
    touch = f"touch {MISSING}/ok {MISSING}-tmp/ok"
    script = f"id -u; id -g; id -G; {touch}; {sys.executable} -c 1 && echo py"
    out = run(tmp_path, mounts, script, user=user).split()
    # the container's runAsUser over the pod's, the pod's runAsGroup, fsGroup as a group
    assert out[:3] == ["1001", "1000", "1000"] and "2000" in out[3:], out
    assert out[-1] == "py"  # this machine's Python (the image's) is readable to that user
    # the fresh claim (root's, 0755) was given to the fsGroup: the file is the group's too
    made = claims["data"] / "ok"
    assert (made.stat().st_uid, made.stat().st_gid) == (1001, 2000)
