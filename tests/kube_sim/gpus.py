"""Which of a node's GPUs a container sees: the NVIDIA device plugin and container runtime.

On a real GPU node the NVIDIA device plugin (default ``deviceListStrategy: envvar``) answers
the kubelet's Allocate with ``NVIDIA_VISIBLE_DEVICES=<the devices given to the pod>``, and
the NVIDIA container runtime exposes what that variable says in the container's final
environment. The kubelet puts the device plugin's variables first and the container's own
``env`` after them, so a pod's own value wins, and a pod without a GPU request keeps what its
image sets. NVIDIA's CUDA images set ``NVIDIA_VISIBLE_DEVICES=all``: a CPU-only pod from
such an image on a GPU node sees every GPU of the node, unless it sets ``void`` (or
``none``, or an empty value; NVIDIA Container Toolkit, "Environment variables": ``void``,
empty or unset behave as runc, ``none`` gives no GPU but the driver).

Pure: device IDs are ``GPU-<node>-<i>`` for whole GPUs and ``<kind>-<node>-<i>`` for other
``nvidia.com/`` resources (``mig-1g.10gb-<node>-0``, ``gpu.shared-<node>-3``). A pod learns
its own from ``NVIDIA_VISIBLE_DEVICES``, and the kubelet reports them as the ``resourceID``
of ``allocatedResourcesStatus`` (ResourceHealthStatus), as the real device plugin's IDs.

A device the plugin marked Unhealthy (:meth:`DevicePlugin.mark_unhealthy`) is given to no
new pod; the pod holding it keeps it (kubernetes#60388: nothing evicts it).
"""

from __future__ import annotations

from .store import Obj

GPU = "nvidia.com/gpu"
PREFIX = "nvidia.com/"
VISIBLE = "NVIDIA_VISIBLE_DEVICES"
#: what images set in their ENV, by repository: NVIDIA's CUDA images, and gputap's
#: single-user image, which is built FROM nvidia/cuda (images/singleuser/Dockerfile)
IMAGE_ENV = {
    "nvidia/cuda": {VISIBLE: "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
    "gputap/singleuser": {VISIBLE: "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
}
NO_GPU = ("", "void", "none")


def image_env(image: str) -> dict[str, str]:
    """The NVIDIA variables an image's ENV sets (repository without tag or digest)."""
    repository = image.split("@", 1)[0]
    if ":" in repository.rsplit("/", 1)[-1]:
        repository = repository.rsplit(":", 1)[0]
    return dict(IMAGE_ENV.get(repository.removeprefix("docker.io/"), {}))


def device_id(resource: str, node: str, index: int) -> str:
    kind = "GPU" if resource == GPU else resource.removeprefix(PREFIX)
    return f"{kind}-{node}-{index}"


def node_gpus(node: Obj) -> list[str]:
    """Every physical GPU of a node (what ``all`` exposes), from GFD's count label."""
    labels = node["metadata"].get("labels") or {}
    name = node["metadata"]["name"]
    count = int(labels.get("nvidia.com/gpu.count", "0") or 0)
    if labels.get("nvidia.com/mig.strategy") == "single":
        count = int((node["status"].get("capacity") or {}).get(GPU, "0"))
    return [device_id(GPU, name, i) for i in range(count)]


class DevicePlugin:
    """The devices each running pod holds, and what its container sees."""

    def __init__(self) -> None:
        self.held: dict[str, tuple[str, list[str]]] = {}  # pod uid -> (node, device IDs)
        self.visible: dict[str, list[str]] = {}  # pod uid -> device IDs its container sees
        #: pod uid -> container name -> resource -> the device IDs given to it
        self.given: dict[str, dict[str, dict[str, list[str]]]] = {}
        #: node name -> device IDs the plugin reports Unhealthy
        self.unhealthy: dict[str, set[str]] = {}

    def allocate(self, node: Obj, pod: Obj, live: set[str]) -> dict[str, str]:
        """Give the pod devices for its ``nvidia.com/`` limits, among the healthy ones no live
        pod (uids in ``live``) holds; the environment the device plugin adds (empty without)."""
        for uid in [u for u in self.held if u not in live]:
            del self.held[uid]
            self.visible.pop(uid, None)
            self.given.pop(uid, None)
        name, uid = node["metadata"]["name"], pod["metadata"]["uid"]
        self.held.pop(uid, None)
        self.given.pop(uid, None)
        taken = {d for n, devices in self.held.values() if n == name for d in devices}
        taken |= self.unhealthy.get(name, set())
        capacity = node["status"].get("capacity") or {}
        given: list[str] = []
        per_container: dict[str, dict[str, list[str]]] = {}
        for container in pod["spec"].get("containers") or []:
            limits = (container.get("resources") or {}).get("limits") or {}
            for resource, quantity in limits.items():
                if not resource.startswith(PREFIX):
                    continue
                pool = [device_id(resource, name, i) for i in range(int(capacity.get(resource, 0)))]
                free = [d for d in pool if d not in taken and d not in given][: int(quantity)]
                given += free
                per_container.setdefault(container["name"], {})[resource] = free
        if not given:
            return {}
        self.held[uid] = (name, given)
        self.given[uid] = per_container
        return {VISIBLE: ",".join(given)}

    def mark_unhealthy(self, node: str, device: str) -> bool:
        """The plugin's health check failed ``device`` (ListAndWatch sends it Unhealthy);
        False if it already was."""
        bad = self.unhealthy.setdefault(node, set())
        if device in bad:
            return False
        bad.add(device)
        return True

    def mark_healthy(self, node: str, device: str) -> bool:
        """``device`` is advertised Healthy again (the plugin restarted, or its check
        passed); False if it was not Unhealthy."""
        bad = self.unhealthy.get(node, set())
        if device not in bad:
            return False
        bad.discard(device)
        return True

    def holders(self, node: str, device: str) -> list[str]:
        """The uids of the pods holding ``device`` of ``node``."""
        return [uid for uid, (n, devices) in self.held.items() if n == node and device in devices]

    def resource_status(self, uid: str, container: str) -> list[dict[str, object]]:
        """The container's ``allocatedResourcesStatus`` as a kubelet with ResourceHealthStatus
        writes it: each device-plugin resource it was given, each device with its health."""
        node = self.held.get(uid, ("", []))[0]
        bad = self.unhealthy.get(node, set())
        return [
            {
                "name": resource,
                "resources": [
                    {"resourceID": d, "health": "Unhealthy" if d in bad else "Healthy"}
                    for d in devices
                ],
            }
            for resource, devices in self.given.get(uid, {}).get(container, {}).items()
            if devices
        ]

    def expose(self, node: Obj, pod: Obj, env: dict[str, str]) -> list[str]:
        """What the container runtime exposes for the container's final environment;
        recorded under the pod's uid."""
        value = env.get(VISIBLE, "").strip()
        if value in NO_GPU:
            seen: list[str] = []
        elif value == "all":
            seen = node_gpus(node)
        else:
            seen = [d.strip() for d in value.split(",") if d.strip()]
        self.visible[pod["metadata"]["uid"]] = seen
        return seen
