"""The hub the chart describes really runs, for the chart's default values and for each values
file in helm/gputap/examples/: z2jh's own jupyterhub_config.py, from the rendered ConfigMap
`hub`, with the rendered Secret `hub`, mounted where the hub pod mounts them, starts against
the simulated cluster; configurable-http-proxy and billing run as their rendered pods say; a
user signs in, the spawn form is GPUKubeSpawner's with what `custom.gputap` sets, the user's
MIG slice server is a pod requesting the slice's `nvidia.com/mig-*` resource, and billing
meters it to the second. One release runs at a time (the module's fixtures are parametrized
by example, and each pod listens on its rendered port). Every example runs on the hub image's
JupyterHub (`make test-jh55`); on .venv's newer one only minimal-sqlite does (RUN below).

What each example needs, the test provides as its operator would, without changing the file:
- a cluster with the GPUs its prices are for (EXAMPLES below) and the StorageClasses it names;
- GitHub login (github-postgres, mig-spot-courses): the OAuth app is registered at the GitHub
  stand-in (tests/github_sim) with the example's client id, its secret in the Secret
  `gputap-github` the example reads, a member of the example's allowed organization signs in
  through the OAuth web flow; the test's values point `hub.github.url` at the stand-in and
  `callback_url` at the proxy (the example's public URL does not resolve here);
- PostgreSQL (github-postgres): a fresh role and databases on the test server
  (127.0.0.1:5432, tests/postgres.py), dropped afterwards; the Secret `gputap-db` holds
  billing's URL and the hub's password, the test's values name the fresh role and databases
  (as an operator's own names), and `postgres` (the operator's database Service) resolves in
  each pod's /etc/hosts to 127.0.0.1. Billing asks for two replicas there (a shared ledger, no
  volume), and both run: the second listens on the same port as the first, so it runs in a
  network namespace of its own on the cluster's pod network (tests/kube_sim/netns.py), where
  it reaches the Services at the gateway: the hub listens there, the API's HTTPS port too,
  and the database through a relay standing in for the Service's routing
  (hub_pod.ServiceRelay). Both meter the cluster's pods; the Services route to the first only
  (the proxy reaches billing at its Service), and the test asks the second at its pod
  address for the same ledger. The Ingress is rendered, not served.

Each pod is a local process in a mount namespace of its own (tests/helm/hub_pod.py). How the
pieces find each other, and why:

- The Kubernetes API: z2jh's hub runs in-cluster, and so do KubeSpawner's and billing's
  clients: `load_incluster_config`, https to `$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`
  with the service account's token and `ca.crt`. The simulated cluster serves HTTPS with its own
  CA (tests/kube_sim/tls.py) and each pod gets the service account volume, so nothing in the
  chart or the hub changes for the test (a KUBECONFIG would be a path the pod never has).
- Services: their variables (`HUB_SERVICE_PORT`, `PROXY_API_SERVICE_PORT`, ...) as Kubernetes
  sets them, and their names in each pod's /etc/hosts at 127.0.0.1, where cluster DNS would
  answer. Services do not route here, so each pod listens on its rendered container port
  (8081, 8000, 8001, 8091), which is also each Service's port except proxy-public's 80: the test
  reaches the proxy at 8000, as a port-forward to the proxy pod would. Those ports must be free.
- Single-user servers run in the simulated kubelet, each in a network namespace of its own
  and as the single-user image's user, without cluster DNS: the values below set
  `custom.gputap.spawner.kubernetes.hub_connect_url` to the hub's port at the pod network's
  gateway, where the hub (listening on every address, as z2jh has it) is reached from a pod
  (the setting exists for hubs that servers reach another way), and the servers' command to
  this machine's jupyterhub-singleuser, as the Kubernetes tests do.
- RBAC: the cluster holds the rendered ServiceAccounts, roles and bindings, each pod's service
  account volume carries the token the cluster issued its ServiceAccount, and nothing the hub
  or billing asked was refused.
- Users: each container runs as its rendered securityContext says (runAsUser and runAsGroup,
  the pod's fsGroup as a supplementary group: the hub 1000, the proxy 65534, billing 1000),
  its volumes given to the fsGroup as the kubelet gives them (a fresh claim is root's, 0755),
  billing's root filesystem read-only; the image's WORKDIR (the hub's /srv/jupyterhub where
  no volume is mounted) is the image user's folder in the container's own layer, gone with
  the pod.

Not stood in for: the images (this machine's virtualenv, Python and node_modules play the hub,
billing and proxy images, readable to the pods' users; their files' owners are this
machine's), probes, NetworkPolicies, the seccomp profile and dropped capabilities, and routing
through the Services (beyond ServiceRelay's one port for the second billing pod).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath

import jupyterhub
import kubernetes
import kubernetes.utils
import kubernetes.watch
import pytest
import requests
import yaml
from packaging.version import Version

from tests.github_sim import GitHubSim
from tests.github_sim.client import sign_in as github_sign_in
from tests.helm import test_chart
from tests.helm.hub_pod import (
    Manifests,
    Mount,
    ServiceRelay,
    automounts_token,
    container_argv,
    container_environment,
    container_mounts,
    container_user,
    hosts_mount,
    run_in_pod,
    service_account_mount,
    service_environment,
)
from tests.helm.test_hub_pins import pins
from tests.integration.test_form import row
from tests.kube.conftest import singleuser_image_user
from tests.kube_sim.cluster import SimulatedCluster, admin_key
from tests.kube_sim.storage import STANDARD_CLASSES
from tests.kube_sim.tls import serving_certificate
from tests.kube_sim.volumes import ProcessUser
from tests.postgres import admin_connection

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
NAMESPACE = test_chart.RELEASE["namespace"]
EXAMPLES_DIR = test_chart.CHART / "examples"
#: where the test stands in for the Services' cluster IPs and for the pods' addresses
LOOPBACK = "127.0.0.1"
#: the proxy pod's http port (Service proxy-public targets it)
PROXY = f"http://{LOOPBACK}:8000"
#: the test's own values over the example: servers this machine can run (see the docstring)
TEST_VALUES = {
    "jupyterhub": {
        "custom": {
            "gputap": {
                "spawner": {
                    "start_timeout": 60,
                    "kubernetes": {
                        "cmd": [str(VENV_BIN / "jupyterhub-singleuser")],
                        "args": ["--allow-root"],
                        "environment": {
                            "JUPYTER_CONFIG_PATH": str(ROOT / "hub_config" / "singleuser")
                        },
                    },
                }
            }
        }
    }
}
#: one H100 partitioned all-1g.10gb by the GPU Operator's MIG manager: 7 slices
H100_MIG = {"product": "NVIDIA-H100-80GB-HBM3", "gpus": 1, "mig": "all-1g.10gb"}
H100_SLICE = {"kind": "slice", "card": "H100-80GB", "profile": "1g.10gb"}

chart_dir = test_chart.chart_dir


@dataclass(frozen=True)
class Example:
    """A values file, the cluster its operator runs it on, and what its hub must show."""

    #: the file in helm/gputap/examples/; empty: the chart's default values
    file: str
    #: gpu_node keyword arguments by node name (by default the H100 MIG node)
    nodes: dict[str, dict] = field(default_factory=lambda: {"gpu-h100": H100_MIG})
    #: the MIG slice server's user_options, its SKU, node and priority class
    slice_options: dict = field(default_factory=lambda: H100_SLICE)
    slice_sku: str = "H100-80GB/1g.10gb"
    slice_node: str = "gpu-h100"
    slice_priority_class: str = "gputap-on-demand"
    #: what billing charges for it per hour, in micro-credits (by default the card's default
    #: price over 7: 12.00/h for an H100-80GB), and its price class
    slice_price_micro: int = 1_714_286
    slice_price_class: str = "on-demand"
    #: texts the spawn form must show in the row of each option key
    form: dict[str, tuple[str, ...]] = field(
        default_factory=lambda: {
            "H100-80GB/1g.10gb": ("H100-80GB 1g.10gb slice", "7 of 7 free", "1.714286/h")
        }
    )
    #: texts the spawn form must show anywhere (the spot choice, ...)
    page: tuple[str, ...] = ()
    #: the user's credit the form shows (trial_credit)
    credit: str = "10.00"
    #: the home volume's size (custom.gputap's home_size)
    home_size: str = "10Gi"
    #: StorageClasses the values name besides the cluster's default standard-rwo
    storage_classes: tuple[str, ...] = ()
    #: GitHub login limited to this organization (the example's allowed_organizations)
    github_org: str = ""
    #: the hub's and billing's databases in PostgreSQL (Secret gputap-db)
    postgres: bool = False
    #: billing's pods (billing.replicas)
    billing_replicas: int = 1

    @property
    def id(self) -> str:
        return self.file.removesuffix(".yaml") or "defaults"

    def values(self) -> dict:
        return yaml.safe_load((EXAMPLES_DIR / self.file).read_text()) if self.file else {}


EXAMPLES = [
    Example(
        file="",
        # custom.gputap's default home_size
        home_size="10Gi",
    ),
    Example(
        file="minimal-sqlite.yaml",
        credit="5.00",
        # custom.gputap's home_size (5Gi), not z2jh's singleuser.storage.capacity (10Gi)
        home_size="5Gi",
    ),
    Example(
        file="github-postgres.yaml",
        # the example's environments, offered on the form beside gputap's own
        page=("PyTorch 2.13", "TensorFlow 2.21", "vLLM 0.34"),
        home_size="20Gi",
        github_org="acme",
        postgres=True,
        billing_replicas=2,
    ),
    Example(
        file="mig-spot-courses.yaml",
        nodes={
            # an A100 all-1g.10gb (7 slices), and a T4 shared four ways by time-slicing
            "gpu-a100": {"product": "NVIDIA-A100-SXM4-80GB", "gpus": 1, "mig": "all-1g.10gb"},
            "gpu-t4": {"product": "Tesla-T4", "gpus": 1, "memory_mib": 15360, "replicas": 4},
        },
        slice_options={**H100_SLICE, "card": "A100-80GB", "spot": True},
        slice_sku="A100-80GB/1g.10gb",
        slice_node="gpu-a100",
        slice_priority_class="gputap-spot",
        # the example's 1.00/h, 70% off as spot
        slice_price_micro=300_000,
        slice_price_class="spot",
        form={
            "A100-80GB/1g.10gb": ("A100-80GB 1g.10gb slice", "7 of 7 free", "1.00/h"),
            "T4/shared": ("4 of 4 free", "0.30/h"),
        },
        page=('id="gputap-spot"', "Interruptible (spot): 70% cheaper"),
        storage_classes=("premium-rwo",),
        github_org="uni-ml",
    ),
]


def merged(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def user_scheduler_names(manifests: Manifests) -> tuple[str, ...]:
    """The scheduler names of z2jh's user-scheduler, from its rendered configuration (none
    when the values leave it off)."""
    found = [m for m in manifests.of_kind("ConfigMap") if m["metadata"]["name"] == "user-scheduler"]
    if not found:
        return ()
    config = yaml.safe_load(found[0]["data"]["config.yaml"])
    return tuple(profile["schedulerName"] for profile in config["profiles"])


def port_taken(port: int) -> bool:
    """Whether a server listens on ``port``. SO_REUSEADDR, as the pods' servers bind: the
    previous release's closed connections (TIME_WAIT, a minute) do not hold the port then."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


def wait_ports_free(pods: list[dict], timeout: float = 60) -> None:
    """The rendered pods' container ports, free on this machine: each pod listens on its own
    (another test's server, or the previous example's release, may hold one for a while)."""
    ports = {
        port["containerPort"]: f"{pod['metadata']['name']}'s {port.get('name')}"
        for pod in pods
        for container in pod["spec"]["template"]["spec"]["containers"]
        for port in container.get("ports") or []
    }
    deadline = time.monotonic() + timeout
    while taken := [f"{port} ({what})" for port, what in ports.items() if port_taken(port)]:
        if time.monotonic() > deadline:
            pytest.fail(f"ports taken on this machine for {timeout:.0f} s: {', '.join(taken)}")
        time.sleep(1)


class Release:
    """The rendered release's hub, proxy and billing pods, running. The first pod of each
    Deployment runs in this machine's network; another replica (billing's second) in a
    network namespace of its own on the cluster's pod network, since it listens on the same
    port: it reaches the Services at the gateway."""

    def __init__(
        self,
        manifests: Manifests,
        root: Path,
        cluster,
        api_port: int,
        ca_cert: Path,
        tokens: dict[str, str],
        operator_secrets: list[dict],
        operator_services: dict[str, int],
    ):
        """``tokens``: each ServiceAccount's token, by name, for the pods that run as it;
        ``operator_secrets``: the Secrets the operator made before installing;
        ``operator_services``: the operator's own Services the pods reach (a database), by
        name, with the port their endpoint listens on at this machine's loopback."""
        self.manifests = manifests
        self.root = root
        self.cluster = cluster
        self.tokens = tokens
        self.operator_secrets = operator_secrets
        self.operator_services = operator_services
        self.procs: dict[str, subprocess.Popen] = {}
        self.users: dict[str, ProcessUser] = {}
        #: the address of each pod on the pod network, by pod name
        self.pod_ips: dict[str, str] = {}
        self._networks: dict[str, list[str]] = {}
        self._relays = contextlib.ExitStack()
        kubernetes_service = {
            "metadata": {"name": "kubernetes"},
            "spec": {"ports": [{"name": "https", "port": api_port}]},
        }
        self.services = [kubernetes_service, *manifests.of_kind("Service")]
        self.ca_cert = ca_cert
        # the claims of the release (hub-db-dir, gputap-billing), kept across pod restarts
        self.claims = {
            claim["metadata"]["name"]: root / "claims" / claim["metadata"]["name"]
            for claim in manifests.of_kind("PersistentVolumeClaim")
        }

    def service_names(self) -> list[str]:
        """The release's Services and the operator's, as cluster DNS would resolve them."""
        names = [s["metadata"]["name"] for s in self.services[1:]]
        return [*names, *self.operator_services]

    def image_environment(self, pod_name: str) -> dict[str, str]:
        """What the images would set: this machine's Python environment and proxy stand for
        the hub, billing and proxy images."""
        path = [
            str(VENV_BIN),
            str(ROOT / "node_modules" / ".bin"),
            "/usr/local/bin",
            "/usr/bin",
            "/bin",
        ]
        return {
            "PATH": ":".join(path),
            "HOME": str(self.root / pod_name / "home"),
            "HOSTNAME": pod_name,
            "LANG": "C.UTF-8",
            # the images hold this checkout's gputap, whichever one the virtualenv installed
            "PYTHONPATH": str(ROOT),
        }

    def pod_network(self, pod_name: str) -> list[str]:
        """The pod's network namespace on the pod network (its containers share it), made
        with its first container; with the first one the operator's Services are routed
        from the gateway."""
        if pod_name not in self._networks:
            if not self._networks:
                for port in self.operator_services.values():
                    relay = ServiceRelay(self.cluster.host_ip, port, (LOOPBACK, port))
                    self._relays.enter_context(relay)
            ip, prefix = self.cluster.pod_network_namespace()
            self.pod_ips[pod_name], self._networks[pod_name] = ip, prefix
        return self._networks[pod_name]

    def run(
        self, deployment_name: str, container: dict, workdir: str, tag: str = "", replica: int = 0
    ) -> subprocess.Popen:
        """Start one container of the ``replica``-th pod of a rendered Deployment as the
        kubelet would; its log is NAME.log, NAME the Deployment's, ``-replica`` after the
        first, ``tag``."""
        deployment = self.manifests.one("Deployment", deployment_name)
        pod_spec = deployment["spec"]["template"]["spec"]
        pod_name = f"{deployment_name}-{replica}"
        account = pod_spec.get("serviceAccountName") or "default"
        name = f"{deployment_name}{f'-{replica}' if replica else ''}{tag}"
        folder = self.root / f"{pod_name}{tag}"
        user = container_user(pod_spec, container)
        # the image's home, its user's
        (folder / "home").mkdir(parents=True)
        os.chown(folder / "home", user.uid, user.gid)
        # where the pod reaches the Services (what cluster IPs and DNS would answer)
        network = self.pod_network(pod_name) if replica else []
        service_ip = self.cluster.host_ip if replica else LOOPBACK
        base = {
            **self.image_environment(pod_name),
            **service_environment(self.services, service_ip),
        }
        base["HOME"] = str(folder / "home")
        fields = {"metadata.namespace": NAMESPACE, "metadata.name": pod_name}
        env = container_environment(container, self.manifests, fields, base, self.operator_secrets)
        mounts = [
            hosts_mount(folder, pod_name, self.service_names(), service_ip),
            *container_mounts(pod_spec, container, self.manifests, folder / "volumes", self.claims),
        ]
        if automounts_token(pod_spec, self.manifests, account):
            token = self.tokens[account]
            mounts.append(service_account_mount(folder, token, self.ca_cert, NAMESPACE))
        if workdir != "/" and not any(
            PurePosixPath(workdir).is_relative_to(m.target) for m in mounts
        ):
            # the image's WORKDIR where no volume is mounted: its user's (the k8s-hub image's
            # /srv/jupyterhub is jovyan's), in the container's own layer, gone with the pod
            image_dir = folder / "workdir"
            image_dir.mkdir()
            os.chown(image_dir, user.uid, user.gid)
            mounts.append(Mount(image_dir, workdir))
        log = self.root / f"{name}.log"
        read_only = (container.get("securityContext") or {}).get("readOnlyRootFilesystem")
        argv = container_argv(container, env)
        proc = run_in_pod(
            argv, env, mounts, folder / "scratch", workdir, log, bool(read_only), network, user
        )
        self.procs[name] = proc
        self.users[name] = user
        return proc

    def start(self) -> None:
        proxy = self.manifests.one("Deployment", "proxy")
        (chp,) = proxy["spec"]["template"]["spec"]["containers"]
        self.run("proxy", chp, "/")
        billing = self.manifests.one("Deployment", "gputap-billing")["spec"]
        pod = billing["template"]["spec"]
        for replica in range(billing["replicas"]):
            for init in pod.get("initContainers") or []:
                tag = f"-{init['name']}"
                if self.run("gputap-billing", init, "/", tag, replica).wait(120) != 0:
                    log = self.log(f"gputap-billing{f'-{replica}' if replica else ''}{tag}")
                    raise AssertionError(f"billing's {init['name']} failed:\n{log}")
            (billing_container,) = pod["containers"]
            self.run("gputap-billing", billing_container, "/", replica=replica)
        hub = self.manifests.one("Deployment", "hub")
        (hub_container,) = [
            c for c in hub["spec"]["template"]["spec"]["containers"] if c["name"] == "hub"
        ]
        # the k8s-hub image's WORKDIR: z2jh's sqlite-pvc database is jupyterhub.sqlite there
        self.run("hub", hub_container, "/srv/jupyterhub")

    def billing_urls(self) -> list[str]:
        """Where each billing pod answers: the first through the proxy (as its Service
        routes), the others at their pod address."""
        port = self.manifests.one("Service", "gputap-billing")["spec"]["ports"][0]["port"]
        others = [
            f"http://{ip}:{port}/services/billing"
            for pod, ip in sorted(self.pod_ips.items())
            if pod.startswith("gputap-billing-")
        ]
        return [f"{PROXY}/services/billing", *others]

    def log(self, name: str, lines: int = 60) -> str:
        try:
            text = (self.root / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def logs(self) -> str:
        return "\n".join(f"--- {name}:\n{self.log(name)}" for name in self.procs)

    def wait_up(self, url: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() not in (None, 0):
                    raise AssertionError(f"{name} exited:\n{self.logs()}")
            try:
                if requests.get(url, timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.3)
        raise AssertionError(f"{url} did not answer:\n{self.logs()}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._relays.close()


@dataclass(frozen=True)
class Database:
    """A fresh PostgreSQL role with the hub's and billing's databases, on the test server."""

    role: str
    password: str
    hub: str
    billing: str

    def url(self, database: str, password: bool = False) -> str:
        """Its URL as the pods reach it: at the operator's Service `postgres`."""
        secret = f":{self.password}" if password else ""
        return f"postgresql+psycopg://{self.role}{secret}@postgres:5432/{database}"


def overrides(
    example: Example, hub_connect_url: str, github: GitHubSim | None, database: Database | None
) -> dict:
    """The test's values over the example: servers this machine runs, told the hub at
    ``hub_connect_url``; GitHub at the stand-in, the callback at the proxy; the fresh
    database's names."""
    kube = {"hub_connect_url": hub_connect_url}
    # everything answers at one loopback address here: no users' subdomains (the examples'
    # wildcard hosts resolve nowhere), so the test's users are declared trusted
    gputap: dict = {"spawner": {"kubernetes": kube}, "hub": {"all_users_trusted": True}}
    hub: dict = {"config": {"JupyterHub": {"subdomain_host": ""}}}
    values: dict = {"jupyterhub": {"custom": {"gputap": gputap}, "hub": hub}}
    if github is not None:
        gputap["hub"]["github"] = {"url": github.url, "callback_url": f"{PROXY}/hub/oauth_callback"}
    if database is not None:
        gputap["billing"] = {"database_url": database.url(database.billing)}
        hub["db"] = {"url": database.url(database.hub)}
    return merged(TEST_VALUES, values)


def render(
    chart_dir,
    example: Example,
    hub_connect_url: str = "",
    github: GitHubSim | None = None,
    database: Database | None = None,
) -> Manifests:
    over = overrides(example, hub_connect_url, github, database)
    return Manifests(test_chart.render(chart_dir, merged(example.values(), over)))


def secret(name: str, data: dict[str, str]) -> dict:
    """A Secret as `kubectl create secret generic NAME --from-literal=...` makes it."""
    encoded = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "type": "Opaque",
        "data": encoded,
    }


#: what the chart creates that the cluster must hold before the hub's pod starts
INSTALLED = (
    "PriorityClass",
    "ServiceAccount",
    "Role",
    "ClusterRole",
    "RoleBinding",
    "ClusterRoleBinding",
)


def the_hub_images_jupyterhub() -> bool:
    """Whether this environment's JupyterHub is the one images/hub holds (.venv-jh55, where
    `make test-jh55` runs this module again), not .venv's newer one."""
    return Version(jupyterhub.__version__) == pins()["jupyterhub"]


#: the chart's hub runs the hub image's JupyterHub, so every example runs there (`make test`
#: runs this module there alone); run by hand on .venv's newer JupyterHub (what one machine
#: runs, never the chart), the minimal example is enough to see the chart's configuration
#: still starts it
RUN = EXAMPLES if the_hub_images_jupyterhub() else [e for e in EXAMPLES if e.id == "minimal-sqlite"]


@pytest.fixture(scope="module", params=RUN, ids=lambda e: e.id)
def example(request) -> Example:
    return request.param


@pytest.fixture(scope="module")
def github(example):
    """The GitHub stand-in with the example's OAuth app (its client id, the callback at the
    proxy), and ada and bea in its allowed organization, dave in none; None without GitHub
    login."""
    if not example.github_org:
        yield None
        return
    client_id = example.values()["jupyterhub"]["custom"]["gputap"]["hub"]["github"]["client_id"]
    sim = GitHubSim(
        client_id=client_id,
        client_secret=secrets.token_hex(20),
        callback_url=f"{PROXY}/hub/oauth_callback",
    )
    for login in ("ada", "bea", "dave"):
        sim.add_user(login, name=login.title())
    sim.add_org(example.github_org, members=["ada", "bea"])
    with sim.in_thread():
        yield sim


@pytest.fixture(scope="module")
def database(example):
    """A fresh role and databases for the example's PostgreSQL, dropped afterwards; None when
    the example keeps SQLite."""
    if not example.postgres:
        yield None
        return
    suffix = secrets.token_hex(6)
    db = Database(
        role=f"gputap_{suffix}",
        password=secrets.token_hex(12),
        hub=f"jupyterhub_{suffix}",
        billing=f"billing_{suffix}",
    )
    with admin_connection() as admin:
        admin.execute(f"CREATE ROLE \"{db.role}\" LOGIN PASSWORD '{db.password}'")
        for name in (db.hub, db.billing):
            admin.execute(f'CREATE DATABASE "{name}" OWNER "{db.role}"')
    try:
        yield db
    finally:
        with admin_connection() as admin:
            for name in (db.hub, db.billing):
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.execute(f'DROP ROLE IF EXISTS "{db.role}"')


@pytest.fixture(scope="module")
def operator_secrets(example, github, database) -> list[dict]:
    """The Secrets the example's comments tell the operator to create before installing."""
    made = []
    if github is not None:
        made.append(secret("gputap-github", {"client-secret": github.client_secret}))
    if database is not None:
        billing_url = database.url(database.billing, password=True)
        made.append(
            secret("gputap-db", {"billing-url": billing_url, "hub-password": database.password})
        )
    return made


@pytest.fixture(scope="module")
def cluster(chart_dir, example, operator_secrets):
    # the user-scheduler's name is the same whatever the hub's address
    names = ("default-scheduler", *user_scheduler_names(render(chart_dir, example)))
    images = {"gputap/singleuser": singleuser_image_user()}
    classes = [
        *STANDARD_CLASSES,
        *({**STANDARD_CLASSES[0], "metadata": {"name": name}} for name in example.storage_classes),
    ]
    with SimulatedCluster.run_in_thread(
        seed=15, scheduler_names=names, images=images, storage_classes=classes
    ) as c:
        for name, node in example.nodes.items():
            c.gpu_node(name, **node)
        core = kube_api(c)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        # the ServiceAccount controller's, in every namespace
        core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "default"}})
        for made in operator_secrets:
            core.create_namespaced_secret(NAMESPACE, made)
        yield c
        accounts = [f"system:serviceaccount:{NAMESPACE}:{a}" for a in ("hub", "gputap-billing")]
        refused = [r for r in c.audit if r.user in accounts and not r.allowed]
        assert refused == [], "the chart's RBAC refused these"


@pytest.fixture(scope="module")
def manifests(chart_dir, example, cluster, github, database) -> Manifests:
    """The release, its servers told the hub at the pod network's gateway; what it creates
    before the hub starts (PriorityClasses, ServiceAccounts, RBAC) is in the cluster."""
    manifests = render(chart_dir, example, f"http://{cluster.host_ip}:8081", github, database)
    core = kube_api(cluster)
    for kind in INSTALLED:
        for manifest in manifests.of_kind(kind):
            kubernetes.utils.create_from_dict(core.api_client, manifest, namespace=NAMESPACE)
    return manifests


def kube_api(cluster) -> kubernetes.client.CoreV1Api:
    config = kubernetes.client.Configuration(host=cluster.url, api_key=admin_key(cluster))
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(config))


@pytest.fixture(scope="module")
def release(manifests, cluster, operator_secrets, database, tmp_path_factory):
    root = tmp_path_factory.mktemp("release")
    # for the API where pods reach it: here, and at the pod network's gateway
    certificate = serving_certificate(root / "cluster-ca", ips=(LOOPBACK, cluster.host_ip))
    api_port = cluster.serve_tls(certificate)
    pods = [manifests.one("Deployment", name) for name in ("hub", "proxy", "gputap-billing")]
    wait_ports_free(pods)
    # the hub's own (ServiceAccount `hub`), billing's (`gputap-billing`), and the proxy's
    # (`default`): the place for the tokens the cluster issues each ServiceAccount
    accounts = ["default", *(a["metadata"]["name"] for a in manifests.of_kind("ServiceAccount"))]
    tokens = {account: cluster.service_account_token(NAMESPACE, account) for account in accounts}
    # the operator's database Service, its endpoint on this machine
    services = {"postgres": 5432} if database is not None else {}
    r = Release(
        manifests, root, cluster, api_port, certificate.ca_cert, tokens, operator_secrets, services
    )
    try:
        r.start()
        r.wait_up(f"{PROXY}/hub/health")
        for url in r.billing_urls():
            r.wait_up(f"{url}/health")
        yield r
    finally:
        r.stop()


def with_xsrf(s: requests.Session) -> requests.Session:
    s.headers["X-XSRFToken"] = s.cookies.get("_xsrf", path="/hub/")
    return s


def sign_in(example: Example, name: str) -> requests.Session:
    """A browser's session after signing in as the example's hub has it (the development
    login, or GitHub's web flow at the stand-in), with its XSRF header set."""
    s = requests.Session()
    if example.github_org:
        r = github_sign_in(s, f"{PROXY}/hub/oauth_login", name)
        assert r.ok and r.url.startswith(f"{PROXY}/hub/"), (r.url, r.text[:1000])
        if not s.cookies.get("_xsrf", path="/hub/"):
            s.get(f"{PROXY}/hub/home", timeout=30)
        return with_xsrf(s)
    s.get(f"{PROXY}/hub/login", timeout=10)
    r = s.post(
        f"{PROXY}/hub/login",
        data={"username": name, "password": "x", "_xsrf": s.cookies.get("_xsrf")},
        timeout=30,
    )
    assert r.ok, r.text
    return with_xsrf(s)


def user_token(s: requests.Session, name: str) -> dict[str, str]:
    """An API token of the signed-in user, as the header to send it in."""
    r = s.post(f"{PROXY}/hub/api/users/{name}/tokens", json={"note": "test"}, timeout=30)
    assert r.status_code == 201, r.text
    return {"Authorization": f"token {r.json()['token']}"}


def billing_sessions(
    token: dict[str, str], name: str, billing: str = f"{PROXY}/services/billing"
) -> list[dict]:
    """The user's sessions as billing's API (at ``billing``) shows them to the user."""
    r = requests.get(f"{billing}/api/sessions?username={name}", headers=token, timeout=30)
    assert r.ok, r.text
    return r.json()["sessions"]


def user_servers(s: requests.Session, name: str) -> dict:
    r = s.get(f"{PROXY}/hub/api/users/{name}", timeout=30)
    assert r.ok, r.text
    return r.json()["servers"]


def wait_ready(s: requests.Session, name: str, release: Release, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not user_servers(s, name).get("", {}).get("ready"):
        assert time.monotonic() < deadline, f"{name}'s server is not ready:\n{release.logs()}"
        time.sleep(0.3)


def wait_stopped(s: requests.Session, name: str, release: Release, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while user_servers(s, name):
        assert time.monotonic() < deadline, f"{name}'s server did not stop:\n{release.logs()}"
        time.sleep(0.2)


def deletion_of(cluster, pod: dict) -> dict:
    """The pod as its deletion request left it (deletionTimestamp set), from the watch
    history after the pod's last known version: the pod itself is gone by now."""
    watch = kubernetes.watch.Watch()
    for event in watch.stream(
        kube_api(cluster).list_namespaced_pod,
        NAMESPACE,
        field_selector=f"metadata.name={pod['metadata']['name']}",
        resource_version=pod["metadata"]["resourceVersion"],
        timeout_seconds=5,
    ):
        if event["raw_object"]["metadata"].get("deletionTimestamp"):
            watch.stop()
            return event["raw_object"]
    raise AssertionError(f"no deletion of {pod['metadata']['name']} was seen")


def parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_the_hub_is_gputap_on_z2jh_config_with_custom_gputap(example, release):
    log = (release.root / "hub.log").read_text()
    # z2jh's files read the mounted Secret, then run the chart's extraConfig
    assert "Loading /usr/local/etc/jupyterhub/secret/values.yaml" in log
    assert "Loading extra config: gputap" in log
    assert "Using Spawner: spawner.kube.spawner.GPUKubeSpawner" in log
    # the hub saw them in its own mount namespace, not on this machine
    assert not Path("/usr/local/etc/jupyterhub").exists()
    # users' GitHub tokens are encrypted with z2jh's key, kept in its Secret, never with one
    # the hub made on its pod's disk (lost with the pod where no volume holds it)
    assert "created the auth_state encryption key" not in log
    page = sign_in(example, "ada").get(f"{PROXY}/hub/spawn", timeout=30).content.decode()
    # GPUKubeSpawner's form: the nodes' GPUs, read from the cluster in-cluster, at the prices
    # of custom.gputap (or the defaults); the trial credit of custom.gputap
    for key, texts in example.form.items():
        option = row(page, key)
        for text in texts:
            assert text in option, (key, text, option)
    for text in example.page:
        assert text in page, text
    assert f'id="gputap-available">{example.credit}<' in page
    if example.github_org:
        # someone outside the allowed organization is turned away at the callback
        r = github_sign_in(requests.Session(), f"{PROXY}/hub/oauth_login", "dave")
        assert r.status_code == 403 and example.github_org in r.text, r.text[:1000]
    # billing: SQLite on its claim and one pod, or PostgreSQL and the pods the values ask for
    billing = release.manifests.one("Deployment", "gputap-billing")
    assert billing["spec"]["replicas"] == example.billing_replicas == len(release.billing_urls())
    claims = [c["metadata"]["name"] for c in release.manifests.of_kind("PersistentVolumeClaim")]
    assert ("gputap-billing" in claims) is not example.postgres


#: whom each pod runs as: z2jh's hub (jovyan) and proxy (nobody), gputap's billing; the
#: volumes' group (fsGroup)
RUN_AS = {
    "hub": (1000, 1000, {1000}),
    "proxy": (65534, 65534, set()),
    "gputap-billing": (1000, 1000, {1000}),
}


def proc_ids(pid: int) -> tuple[int, int, set[int]]:
    """A process's effective uid, gid and supplementary groups."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    uid, gid = int(fields["Uid"].split()[1]), int(fields["Gid"].split()[1])
    return uid, gid, {int(g) for g in fields["Groups"].split()}


def test_each_pod_runs_as_the_user_its_securitycontext_says(release):
    for name, (uid, gid, groups) in RUN_AS.items():
        proc = release.procs[name]
        assert proc.poll() is None, f"{name} exited:\n{release.log(name)}"
        assert proc_ids(proc.pid) == (uid, gid, groups), name
    # what billing keeps, it keeps as its user on its volume (SQLite), never as root
    claim = release.claims.get("gputap-billing")
    if claim is not None:
        ledger = claim / "billing.sqlite"
        assert (ledger.stat().st_uid, ledger.stat().st_gid) == (1000, 1000)


def test_a_mig_slice_server_is_metered_to_the_second(example, release, cluster):
    s = sign_in(example, "bea")
    r = s.post(
        f"{PROXY}/hub/api/users/bea/server",
        json={"user_options": example.slice_options},
        timeout=90,
    )
    assert r.status_code in (201, 202), r.text
    wait_ready(s, "bea", release)
    (pod,) = [
        p
        for p in cluster.pods(NAMESPACE)
        if p["metadata"]["labels"].get("hub.jupyter.org/username") == "bea"
    ]
    token = user_token(s, "bea")
    # the server answers through the proxy, signed in with the hub's OAuth (another cluster's
    # pod on this machine with the same loopback address would answer instead: named below)
    status = requests.get(f"{PROXY}/user/bea/api/status", headers=token, timeout=30)
    assert status.status_code == 200, (pod["status"]["podIP"], status.text[:300])
    profile = example.slice_options["profile"]
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    assert limits[f"nvidia.com/mig-{profile}"] == "1" and "nvidia.com/gpu" not in limits
    assert pod["spec"]["nodeName"] == example.slice_node
    assert pod["spec"]["priorityClassName"] == example.slice_priority_class
    # scheduled by z2jh's user-scheduler where the values enable it
    schedulers = user_scheduler_names(release.manifests) or ("default-scheduler",)
    assert pod["spec"].get("schedulerName", "default-scheduler") in schedulers
    claim = kube_api(cluster).read_namespaced_persistent_volume_claim("home-bea", NAMESPACE)
    assert claim.spec.resources.requests["storage"] == example.home_size
    # the values' StorageClass, else the cluster's default
    kube = example.values().get("jupyterhub", {}).get("custom", {}).get("gputap", {})
    kube = kube.get("spawner", {}).get("kubernetes", {})
    assert claim.spec.storage_class_name == (kube.get("storage_class") or "standard-rwo")
    started = parse(pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])
    r = s.delete(f"{PROXY}/hub/api/users/bea/server", timeout=90)
    assert r.status_code in (202, 204), r.text
    wait_stopped(s, "bea", release)
    deleting = deletion_of(cluster, pod)
    grace = deleting["metadata"]["deletionGracePeriodSeconds"]
    requested = parse(deleting["metadata"]["deletionTimestamp"]) - timedelta(seconds=grace)
    (session,) = billing_sessions(token, "bea")
    assert session["state"] == "ended" and session["sku"] == example.slice_sku
    assert session["price_class"] == example.slice_price_class, session
    assert session["price_per_hour_micro"] == example.slice_price_micro, session
    assert abs(parse(session["started_at"]) - started) <= timedelta(seconds=1), (session, started)
    assert abs(parse(session["ended_at"]) - requested) <= timedelta(seconds=1), (session, requested)
    # every billing pod meters the cluster's pods and answers from the one ledger, where the
    # session is once
    for url in release.billing_urls()[1:]:
        assert billing_sessions(token, "bea", url) == [session], url
