"""The simulated cluster's pod network: each pod in its own network namespace, with its own IP.

A real pod has its own network namespace: its 127.0.0.1 is its own, and it reaches anything
else (its node, the hub, other pods) at an address on the pod network. Here every cluster gets
a Linux bridge on the host holding the first address of a subnet of its own (the node's
InternalIP and the pods' gateway, where a hub on the host listens for pods, as a hub is reached
at its Service); every pod gets a network namespace (``ip netns add``) joined to the bridge by
a veth pair, the pod side named eth0 with the next free address of the subnet (its podIP), lo
up and a default route via the bridge, as a bridge CNI plugin with host-local IPAM sets a pod
up (https://www.cni.dev/plugins/current/main/bridge/). The pod's process runs in it through
:meth:`PodNetwork.exec_prefix` (``nsenter --net``).

Several clusters run at once (pytest workers, test modules): names carry the process id and a
counter, the subnet is chosen under a lock among those no route of the host uses, and objects
left by a killed run (their process id is gone) are removed when the next network starts.
Creating namespaces and links needs root.

The host's side of every link gets no IPv6 link-local address (``addrgenmode none``): a new
address on the host is a network change to every browser on the machine, which drops its
requests in flight (Chromium's ``net::ERR_NETWORK_CHANGED``), and the browser tests run beside
the cluster tests. Only the bridge's own address comes and goes, once per cluster.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import ipaddress
import itertools
import json
import logging
import os
import re
import shutil
import signal
import subprocess

log = logging.getLogger("kube_sim.netns")

#: the pool the clusters' subnets come from, and each cluster's share of it (4094 pod addresses)
POOL = ipaddress.ip_network("10.128.0.0/9")
PREFIX = 20
LOCK_PATH = "/run/kube-sim-netns.lock"
NETNS_DIR = "/run/netns"
# interface names are at most 15 bytes (IFNAMSIZ 16 with the NUL): "ksb" + pid + "." + counter
_BRIDGE = re.compile(r"ksb([0-9a-f]+)\.[0-9a-f]+")
_VETH = re.compile(r"ksv([0-9a-f]+)\.[0-9a-f]+")
_NETNS = re.compile(r"kube-sim-([0-9]+)-[0-9]+")
_clusters = itertools.count(1)
_pods = itertools.count(1)
#: names this process made and has not removed yet (the rest with its pid are a dead run's)
_live: set[str] = set()


class NetworkError(RuntimeError):
    """The pod network cannot be set up (not root, no `ip`, a command failed)."""


def _ip(*args: str, stdin: str | None = None) -> str:
    result = subprocess.run(["ip", *args], input=stdin, capture_output=True, text=True)
    if result.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


async def _ip_async(*args: str, stdin: str | None = None) -> str:
    proc = await asyncio.create_subprocess_exec(
        "ip",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await proc.communicate(stdin.encode() if stdin else None)
    except asyncio.CancelledError:
        # a pod deleted while its namespace is being made: let `ip` finish, so that what it
        # makes exists when the kubelet then removes it; its input ends here (a batch cut
        # short of its end of file would wait for it forever)
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {err.decode().strip()}")
    return out.decode()


def _kill_all(pids: str) -> None:
    """SIGKILL every process listed (``ip netns pids``), as tearing a pod's sandbox down ends
    whatever still runs in the pod, children that left the process group included."""
    for pid in pids.split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale(name: str, pattern: re.Pattern[str], base: int) -> bool:
    """A name of ours whose process is gone, or of this process but not made by it (the pid
    of a killed run, reused)."""
    m = pattern.fullmatch(name)
    if not m:
        return False
    pid = int(m.group(1), base)
    return name not in _live if pid == os.getpid() else not _alive(pid)


def sweep_stale() -> list[str]:
    """Remove the namespaces, veths and bridges left by runs that were killed; their names."""
    removed = []
    for entry in json.loads(_ip("-j", "netns", "list") or "[]"):
        name = entry["name"]
        if _stale(name, _NETNS, 10):
            with contextlib.suppress(NetworkError):
                _kill_all(_ip("netns", "pids", name))
                _ip("netns", "delete", name)
                removed.append(name)
    # a veth goes with its namespace; one whose namespace is gone stays on the host alone
    for link in json.loads(_ip("-j", "link", "show") or "[]"):
        name = link["ifname"].partition("@")[0]
        if _stale(name, _VETH, 16) or _stale(name, _BRIDGE, 16):
            with contextlib.suppress(NetworkError):
                _ip("link", "delete", name)
                removed.append(name)
    return removed


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network the host routes or holds an address in."""
    used = []
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all") or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(dst, strict=False))
    for link in json.loads(_ip("-j", "-4", "addr", "show") or "[]"):
        for addr in link.get("addr_info", []):
            used.append(ipaddress.ip_network(f"{addr['local']}/{addr['prefixlen']}", strict=False))
    return used


def free_subnet(used: list[ipaddress.IPv4Network], start: int) -> ipaddress.IPv4Network:
    """The first /PREFIX of POOL, from the start-th on (wrapping), that overlaps none of used."""
    subnets = list(POOL.subnets(new_prefix=PREFIX))
    for i in range(len(subnets)):
        candidate = subnets[(start + i) % len(subnets)]
        if not any(candidate.overlaps(u) for u in used):
            return candidate
    raise NetworkError(f"no free /{PREFIX} left in {POOL} for another simulated cluster")


def require_root() -> None:
    """Refuse clearly where namespaces cannot be made, before anything is half set up."""
    if os.geteuid() != 0:
        raise NetworkError(
            "the simulated cluster gives each pod its own network namespace (ip netns, veth, a "
            "bridge), which needs root: run the tests as root (CI and `make test` do)"
        )
    for tool in ("ip", "nsenter"):
        if shutil.which(tool) is None:
            raise NetworkError(f"the simulated pod network needs `{tool}` (iproute2, util-linux)")


class PodNetwork:
    """One cluster's bridge and subnet, and a network namespace per pod."""

    def __init__(self) -> None:
        self._n = next(_clusters)
        self.bridge = f"ksb{os.getpid():x}.{self._n:x}"
        self.subnet: ipaddress.IPv4Network | None = None
        self.host_ip = ""
        self._in_use: set[str] = set()
        self._next = 0
        self._pods: dict[str, tuple[str, str]] = {}  # pod IP -> (namespace, host-side veth)

    def start(self) -> None:
        """Sweep what killed runs left, choose a free subnet and bring the bridge up."""
        require_root()
        os.makedirs(os.path.dirname(LOCK_PATH), exist_ok=True)
        with open(LOCK_PATH, "w") as lock:
            # parallel clusters must not both see a subnet free and take it
            fcntl.flock(lock, fcntl.LOCK_EX)
            removed = sweep_stale()
            if removed:
                log.info("removed what killed runs left: %s", ", ".join(removed))
            # each cluster starts looking at a subnet of its own, so that parallel workers
            # seldom try the same ones
            start = os.getpid() * 7 + self._n
            self.subnet = free_subnet(_used_networks(), start)
            self.host_ip = str(self.subnet.network_address + 1)
            _live.add(self.bridge)
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "addrgenmode", "none")
            _ip("addr", "add", f"{self.host_ip}/{PREFIX}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        atexit.register(self.stop)
        log.info("pod network %s on bridge %s (host %s)", self.subnet, self.bridge, self.host_ip)

    def allocate(self) -> str:
        """The next free pod address, after the last one given (host-local IPAM's order)."""
        assert self.subnet is not None, "start() the network first"
        hosts = self.subnet.num_addresses - 3  # network, gateway, broadcast
        for _ in range(hosts):
            self._next = self._next % hosts + 1
            ip = str(self.subnet.network_address + 1 + self._next)
            if ip not in self._in_use:
                self._in_use.add(ip)
                return ip
        raise NetworkError(f"pod network {self.subnet} is full")

    async def add_pod(self, ip: str) -> str:
        """Make the pod's namespace with eth0 at ``ip`` on the bridge; returns its name."""
        k = next(_pods)
        netns, veth = f"kube-sim-{os.getpid()}-{k}", f"ksv{os.getpid():x}.{k:x}"
        _live.update((netns, veth))
        self._pods[ip] = (netns, veth)
        await _ip_async(
            "-batch",
            "-",
            stdin=(
                f"netns add {netns}\n"
                f"link add {veth} type veth peer name eth0 netns {netns}\n"
                f"link set {veth} addrgenmode none\n"
                f"link set {veth} master {self.bridge} up\n"
            ),
        )
        await _ip_async(
            "-n",
            netns,
            "-batch",
            "-",
            stdin=(
                f"addr add {ip}/{PREFIX} dev eth0\n"
                "link set eth0 up\n"
                "link set lo up\n"
                f"route add default via {self.host_ip}\n"
            ),
        )
        return netns

    def names(self) -> tuple[set[str], set[str]]:
        """This cluster's network namespaces, and its links (the bridge and pods' veths)."""
        pods = list(self._pods.values())
        return {netns for netns, _ in pods}, {self.bridge, *(veth for _, veth in pods)}

    def exec_prefix(self, netns: str) -> list[str]:
        """The command prefix that runs a program inside the pod's namespace."""
        return ["nsenter", f"--net={NETNS_DIR}/{netns}", "--"]

    async def remove_pod(self, ip: str) -> None:
        """End what still runs in the pod's namespace and delete it (its veth goes with it:
        a namespace lives on while a process is in it); free its address."""
        names = self._pods.get(ip)
        if names is None:
            return
        with contextlib.suppress(NetworkError):
            _kill_all(await _ip_async("netns", "pids", names[0]))
        with contextlib.suppress(NetworkError):
            await _ip_async("netns", "delete", names[0])
        # forgotten only now: a cluster stopped meanwhile (this task never to finish) still
        # finds the namespace in stop()
        self._pods.pop(ip, None)
        self._in_use.discard(ip)
        _live.difference_update(names)

    def stop(self) -> None:
        """Delete every pod namespace and the bridge; safe to call twice."""
        for ip, names in list(self._pods.items()):
            with contextlib.suppress(NetworkError):
                _kill_all(_ip("netns", "pids", names[0]))
                _ip("netns", "delete", names[0])
            _live.difference_update(names)
            del self._pods[ip]
        self._in_use.clear()
        if self.bridge in _live:
            with contextlib.suppress(NetworkError):
                _ip("link", "delete", self.bridge)
            _live.discard(self.bridge)
        atexit.unregister(self.stop)
