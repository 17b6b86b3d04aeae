"""The simulated pod network: each pod in its own network namespace with its own address."""

import http.server
import ipaddress
import json
import os
import subprocess
import threading
import urllib.request

import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException

from tests.kube_sim import SimulatedCluster, netns
from tests.kube_sim.cluster import admin_key
from tests.kube_sim.conftest import PY, pod_body
from tests.waiting import wait_for

# prints what answered at the URL in argv[1], or why nothing did
FETCH = (
    "import sys, urllib.request\n"
    "try:\n"
    "    print(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode(), flush=True)\n"
    "except OSError as e:\n"
    "    print('unreachable', type(e).__name__, flush=True)\n"
)
# answers "pod" on every address of the pod at the port in $PORT
SERVE = (
    "import http.server, os\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(b'pod')\n"
    "http.server.HTTPServer(('0.0.0.0', int(os.environ['PORT'])), H).serve_forever()\n"
)


@pytest.fixture(scope="module", autouse=True)
def node(kube):
    kube.add_node("cpu-net", allocatable={"cpu": "64"})


class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(f"host {self.server.server_address[0]}".encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def host_server():
    """Start an HTTP server on the host at an address; returns its URL."""
    servers = []

    def start(address):
        server = http.server.HTTPServer((address, 0), Answer)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://{address}:{server.server_address[1]}/"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def run_to_end(core, ns, name, command, env=None):
    body = pod_body(name, command=command, env=env, restartPolicy="Never")
    core.create_namespaced_pod(ns, body)
    wait_for(lambda: core.read_namespaced_pod(name, ns).status.phase == "Succeeded", timeout=15)
    return core.read_namespaced_pod_log(name, ns).strip()


def links() -> set[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout
    return {link["ifname"].partition("@")[0] for link in json.loads(out)}


def pids_in(name: str) -> list[str]:
    """The processes in network namespace ``name`` (nsenter execs its command: same pid)."""
    out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
    return out.split()


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True).stdout
    return {entry["name"] for entry in json.loads(out or "[]")}


def test_a_pod_does_not_reach_the_hosts_loopback(core, ns, host_server):
    url = host_server("127.0.0.1")
    assert urllib.request.urlopen(url, timeout=3).read() == b"host 127.0.0.1"  # it is up
    assert run_to_end(core, ns, "lo", [PY, "-c", FETCH, url]).startswith("unreachable")


def test_a_pod_reaches_the_host_at_its_address_on_the_pod_network(core, ns, host_server, kube):
    url = host_server(kube.host_ip)
    assert run_to_end(core, ns, "gw", [PY, "-c", FETCH, url]) == f"host {kube.host_ip}"
    pod = core.read_namespaced_pod("gw", ns)
    assert pod.status.host_ip == kube.host_ip
    node = core.read_node(pod.spec.node_name)
    internal = [a.address for a in node.status.addresses if a.type == "InternalIP"]
    assert internal == [kube.host_ip]


def test_a_pod_reaches_the_api_server_as_its_service_env_says(core, ns, kube):
    script = (
        "import os, urllib.request\n"
        "h, p = os.environ['KUBERNETES_SERVICE_HOST'], os.environ['KUBERNETES_SERVICE_PORT']\n"
        "auth = {'Authorization': 'Bearer ' + os.environ['TOKEN']}\n"
        "asked = urllib.request.Request(f'http://{h}:{p}/version', headers=auth)\n"
        "print(urllib.request.urlopen(asked, timeout=3).status)\n"
    )
    env = [{"name": "TOKEN", "value": kube.admin_token}]
    assert run_to_end(core, ns, "api", [PY, "-c", script], env=env) == "200"


def test_two_pods_get_different_addresses_in_the_clusters_subnet(core, ns, kube):
    for name in ("one", "two"):
        core.create_namespaced_pod(ns, pod_body(name))
    ips = [
        wait_for(lambda n=name: core.read_namespaced_pod(n, ns).status.pod_ip)
        for name in ("one", "two")
    ]
    assert ips[0] != ips[1]
    subnet = kube.cluster.network.subnet
    assert all(ipaddress.ip_address(ip) in subnet for ip in ips)
    assert kube.host_ip not in ips


def test_the_host_reaches_a_server_listening_on_every_address_of_its_pod(core, ns):
    # what configurable-http-proxy on the host does: http://podIP:port
    env = [{"name": "PORT", "value": "8888"}]
    core.create_namespaced_pod(ns, pod_body("srv", command=[PY, "-c", SERVE], env=env))
    ip = wait_for(lambda: core.read_namespaced_pod("srv", ns).status.pod_ip)

    def answer():
        try:
            return urllib.request.urlopen(f"http://{ip}:8888/", timeout=2).read()
        except OSError:
            return None

    assert wait_for(answer) == b"pod"


def test_stopping_a_cluster_leaves_no_namespace_or_link_behind():
    with SimulatedCluster.run_in_thread(max_grace_seconds=1) as cluster:
        network = cluster.cluster.network
        cluster.add_node("n")
        config = kubernetes.client.Configuration(host=cluster.url, api_key=admin_key(cluster))
        core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(config))
        for name in ("a", "b"):
            core.create_namespaced_pod("default", pod_body(name))
        wait_for(
            lambda: all(
                p.status.phase == "Running" for p in core.list_pod_for_all_namespaces().items
            )
        )
        # this cluster's own: other clusters of this process (the module's) come and go
        during_ns, during_links = network.names()
        assert len(during_ns) == 2 and during_ns <= namespaces()
        assert len(during_links) == 3 and during_links <= links()  # bridge, 2 veths
        core.delete_namespaced_pod("a", "default", grace_period_seconds=0)
        wait_for(lambda: len(during_ns & namespaces()) == 1)
    assert during_ns & namespaces() == set() and during_links & links() == set()


def host_addresses() -> set[tuple[str, str]]:
    out = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True).stdout
    return {
        (link["ifname"].partition("@")[0], addr["local"])
        for link in json.loads(out)
        for addr in link.get("addr_info", [])
    }


def test_a_pod_coming_and_going_changes_no_address_of_the_host(core, ns, kube):
    # a new address on the host is a network change to a browser, which drops its requests
    # in flight (net::ERR_NETWORK_CHANGED): the browser tests run beside these
    before = host_addresses()
    core.create_namespaced_pod(ns, pod_body("quiet"))
    wait_for(lambda: core.read_namespaced_pod("quiet", ns).status.phase == "Running")
    veths = {link for link in links() if link.startswith("ksv")}
    during = host_addresses()
    core.delete_namespaced_pod("quiet", ns, grace_period_seconds=0)
    assert veths, "the pod's veth is on the host"
    assert {(name, addr) for name, addr in during - before if name in veths} == set()


def dead_pid() -> int:
    proc = subprocess.Popen([PY, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_what_a_killed_run_left_is_removed_when_the_next_cluster_starts():
    pid = dead_pid()
    stale_ns, stale_veth, stale_bridge = f"kube-sim-{pid}-1", f"ksv{pid:x}.1", f"ksb{pid:x}.1"
    subprocess.run(["ip", "netns", "add", stale_ns], check=True)
    subprocess.run(["ip", "link", "add", stale_bridge, "type", "bridge"], check=True)
    subprocess.run(
        [
            "ip",
            "link",
            "add",
            stale_veth,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            stale_ns,
        ],
        check=True,
    )
    # a process of the killed run still in its namespace
    sleeper = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{stale_ns}", PY, "-c", "import time; time.sleep(60)"]
    )
    # inside it before the next run starts (nsenter enters a moment after it was started)
    wait_for(
        lambda: str(sleeper.pid) in pids_in(stale_ns),
        f"the sleeper in {stale_ns}",
    )
    try:
        with SimulatedCluster.run_in_thread():
            assert stale_ns not in namespaces()
            assert not {stale_veth, stale_bridge} & links()
            assert sleeper.wait(5) == -9
    finally:
        sleeper.kill()


def test_without_root_the_cluster_refuses_saying_why(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(netns.NetworkError, match="needs root: run the tests as root"):
        netns.PodNetwork().start()


def test_a_restarted_container_keeps_its_pods_address(core, ns, kube):
    # the address the pod's process sends from, printed at each start; then it exits
    script = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.connect((sys.argv[1], 9))\n"
        "print(s.getsockname()[0], flush=True)\n"
        "raise SystemExit(1)\n"
    )
    core.create_namespaced_pod(ns, pod_body("again", command=[PY, "-c", script, kube.host_ip]))

    def two_starts():
        try:
            lines = (core.read_namespaced_pod_log("again", ns) or "").split()
        except ApiException:  # 400 while the container waits out its back-off
            return None
        return lines if len(lines) >= 2 else None

    # the captured output spans the restarts: one line per start
    assert set(wait_for(two_starts)) == {core.read_namespaced_pod("again", ns).status.pod_ip}
