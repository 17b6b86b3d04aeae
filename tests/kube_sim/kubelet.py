"""The simulated kubelet: runs each bound pod's first container as a local process.

One kubelet serves every node. It reports the pod lifecycle the way a real kubelet does
(ContainerCreating, Running with startedAt, Succeeded/Failed with a terminated state, restarts
under restartPolicy), emits the usual events, captures output for the log endpoint, and on
deletion sends SIGTERM, waits out the grace period (capped), sends SIGKILL and removes the pod.

The times it writes (status.startTime, a container's startedAt and finishedAt, its events)
come from the node's clock, as a real kubelet's do: a node may run ahead of or behind the API
server (``clock_offsets``).

Each pod's process runs in the pod's own network namespace (netns.py), behind the command
prefix :meth:`Kubelet._launch_prefix` builds.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from .api import NODE, POD, TERMINAL_PHASES, Api, set_condition
from .container_env import ConfigError, container_argv, container_env
from .control_loop import ControlLoop, cancel
from .gpus import DevicePlugin, image_env
from .netns import NetworkError, PodNetwork
from .store import ApiError, Obj, WatchEvent, rfc3339, utcnow
from .volumes import Volumes, runs_as_root_against_policy

log = logging.getLogger("kube_sim.kubelet")

MAX_LOG_BYTES = 1 << 20


@dataclass
class PodRun:
    namespace: str
    name: str
    uid: str
    workdir: str
    output: bytearray = field(default_factory=bytearray)
    proc: asyncio.subprocess.Process | None = None
    task: asyncio.Task | None = None
    terminating: bool = False
    started_at: str = ""
    pod_ip: str = ""
    netns: str = ""  # the pod's network namespace, while it has one


class Kubelet(ControlLoop):
    """Watches the store for pods bound to nodes and runs them."""

    def __init__(
        self,
        api: Api,
        network: PodNetwork,
        api_url: str = "",
        image_pull_delay: float = 0.0,
        max_grace_seconds: float = 5.0,
        crash_backoff: float = 1.0,
        root_dir: str | None = None,
        volumes: Volumes | None = None,
    ):
        self.api = api
        self.network = network
        # mounts and the process's user (volumes.py); None: the kubelet's own user, no mounts
        self.volumes = volumes
        self.api_url = api_url
        self.image_pull_delay = image_pull_delay
        self.max_grace_seconds = max_grace_seconds
        self.crash_backoff = crash_backoff
        self._tmp = None if root_dir else tempfile.TemporaryDirectory(prefix="kube-sim-")
        self.root_dir = root_dir or self._tmp.name
        self.runs: dict[str, PodRun] = {}  # by pod uid
        self.devices = DevicePlugin()
        self._logs: dict[tuple[str, str], PodRun] = {}
        self._queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        #: node name -> how far its clock is ahead of the API server's (behind: negative)
        self.clock_offsets: dict[str, timedelta] = {}
        #: uids of pods whose containers' status carries allocatedResourcesStatus
        self.health_reported: set[str] = set()

    def node_now(self, node: str) -> datetime:
        """The time on ``node``'s clock."""
        return utcnow() + self.clock_offsets.get(node, timedelta())

    # -- lifecycle -----------------------------------------------------------------------------

    async def stop(self) -> None:
        await super().stop()
        for run in list(self.runs.values()):
            await self._kill(run, 0)
            await cancel(run.task)
            await self._release(run)
        if self._tmp:
            self._tmp.cleanup()

    def _on_change(self, event: WatchEvent) -> None:
        # never write from inside a store callback: watchers would see events out of order
        if event.key[1] == "Pod":
            self._queue.put_nowait(event)

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                self._handle(event)
            except Exception:
                log.exception("kubelet failed on %s %s", event.type, event.key)

    def _handle(self, event: WatchEvent) -> None:
        pod = event.obj
        uid = pod["metadata"]["uid"]
        run = self.runs.get(uid)
        if event.type == "DELETED":
            if run is not None:
                # removed without a grace period (force delete, or a pod already Failed)
                self.runs.pop(uid, None)
                self.health_reported.discard(uid)
                self._logs.pop((run.namespace, run.name), None)
                run.terminating = True
                asyncio.create_task(self._stop(run, 0))
            return
        if not pod["spec"].get("nodeName"):
            return
        current = self.api.find(POD, pod["metadata"]["namespace"], pod["metadata"]["name"])
        if current is None or current["metadata"]["uid"] != uid:
            return
        if current["metadata"].get("deletionTimestamp"):
            if run is None:
                self._remove(current)
            elif not run.terminating:
                run.terminating = True
                grace = current["metadata"].get("deletionGracePeriodSeconds", 30)
                asyncio.create_task(self._terminate(run, current, grace))
            return
        if run is None and current["status"].get("phase") not in TERMINAL_PHASES:
            meta = current["metadata"]
            workdir = os.path.join(self.root_dir, meta["namespace"], meta["name"])
            os.makedirs(workdir, exist_ok=True)
            run = PodRun(
                meta["namespace"], meta["name"], uid, workdir, pod_ip=self.network.allocate()
            )
            self.runs[uid] = run
            self._logs[(run.namespace, run.name)] = run
            run.task = asyncio.create_task(self._pod_lifecycle(run))

    # -- logs ----------------------------------------------------------------------------------

    def logs(
        self, namespace: str, name: str, container: str | None, tail: int | None
    ) -> str | None:
        """Captured output of a pod's container, or None if it never started."""
        run = self._logs.get((namespace, name))
        if run is None or not run.started_at:
            return None
        text = run.output.decode(errors="replace")
        if tail is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-tail:]) if tail > 0 else ""
        return text

    # -- running a pod -------------------------------------------------------------------------

    def _status(self, run: PodRun, mutate) -> Obj | None:
        pod = self.api.find(POD, run.namespace, run.name)
        if pod is None or pod["metadata"]["uid"] != run.uid or run.terminating:
            return None
        return self.api.update_status(run.namespace, run.name, mutate)

    def _report(
        self,
        run: PodRun,
        container: Obj,
        state: Obj,
        restarts: int,
        last: Obj | None,
        phase: str | None = None,
        ready: bool = False,
        reason: str = "ContainersNotReady",
    ) -> Obj | None:
        """Write the container's state (and the pod phase, if given) to the pod status."""
        unready = f"containers with unready status: [{container['name']}]"

        def mutate(p: Obj) -> None:
            if phase:
                p["status"]["phase"] = phase
            for c in ("ContainersReady", "Ready"):
                if ready:
                    set_condition(p, c, "True")
                else:
                    set_condition(
                        p, c, "False", reason, "" if reason == "PodCompleted" else unready
                    )
            p["status"]["containerStatuses"] = [
                self._container_status(container, restarts, state, ready, last)
            ]
            self._resource_health(run.uid, p)

        return self._status(run, mutate)

    def _resource_health(self, uid: str, pod: Obj) -> None:
        if uid not in self.health_reported:
            return
        for status in pod["status"].get("containerStatuses") or []:
            health = self.devices.resource_status(uid, status["name"])
            if health:
                status["allocatedResourcesStatus"] = health
            else:
                status.pop("allocatedResourcesStatus", None)

    def device_health_changed(self, node: str, device: str, report: bool) -> list[Obj]:
        """The device plugin changed the health of ``device`` on ``node``. With ``report``
        (a kubelet with ResourceHealthStatus: alpha from 1.31, beta and on from 1.36) the
        pods holding it get their containers' ``allocatedResourcesStatus`` written; without,
        their status stays as before 1.36, but for pods whose status already reports their
        devices. Either way they run on (kubernetes#60388). Returns the pods whose status
        was written."""
        written = []
        for uid in self.devices.holders(node, device):
            run = self.runs.get(uid)
            if run is None or not (report or uid in self.health_reported):
                continue
            self.health_reported.add(uid)
            pod = self._status(run, lambda p, uid=uid: self._resource_health(uid, p))
            if pod is not None:
                written.append(pod)
        return written

    def _event(self, pod: Obj | None, reason: str, message: str, type_: str = "Normal") -> None:
        if pod is not None:
            node = pod["spec"]["nodeName"]
            self.api.record_event(
                pod, reason, message, type_, "kubelet", node, at=self.node_now(node)
            )

    def _container_status(
        self, container: Obj, restarts: int, state: Obj, ready: bool, last: Obj | None = None
    ) -> Obj:
        image = container["image"]
        digest = hashlib.sha256(image.encode()).hexdigest()
        status = {
            "name": container["name"],
            "image": image,
            "imageID": f"{image.split(':')[0]}@sha256:{digest}",
            "ready": ready,
            "restartCount": restarts,
            "started": "running" in state,
            "state": state,
            "lastState": last or {},
        }
        if "waiting" not in state:
            status["containerID"] = f"containerd://{digest[:32]}{restarts:032d}"[:77]
        return status

    async def _pod_lifecycle(self, run: PodRun) -> None:
        pod = self.api.find(POD, run.namespace, run.name)
        if pod is None:
            return
        container = pod["spec"]["containers"][0]
        node = pod["spec"]["nodeName"]
        try:
            run.netns = await self.network.add_pod(run.pod_ip)
        except NetworkError as e:
            # the kubelet's words when the CNI plugin fails; the pod stays Pending
            self._event(pod, "FailedCreatePodSandBox", f"Failed to create pod sandbox: {e}")
            log.error("%s/%s: no pod network: %s", run.namespace, run.name, e)
            return
        now = rfc3339(self.node_now(node))

        def creating(p: Obj) -> None:
            s = p["status"]
            s.update(
                hostIP=self.network.host_ip,
                hostIPs=[{"ip": self.network.host_ip}],
                podIP=run.pod_ip,
                podIPs=[{"ip": run.pod_ip}],
                startTime=now,
            )
            for c in ("Initialized", "PodScheduled"):
                set_condition(p, c, "True")
            for c in ("ContainersReady", "Ready"):
                set_condition(
                    p,
                    c,
                    "False",
                    "ContainersNotReady",
                    f"containers with unready status: [{container['name']}]",
                )
            s["containerStatuses"] = [
                self._container_status(
                    container, 0, {"waiting": {"reason": "ContainerCreating"}}, False
                )
            ]

        pod = self._status(run, creating)
        if not await self._wait_attached(run):
            return
        image = container["image"]
        self._event(pod, "Pulling", f'Pulling image "{image}"')
        if self.image_pull_delay:
            await asyncio.sleep(self.image_pull_delay)
        self._event(
            pod,
            "Pulled",
            f'Successfully pulled image "{image}" in '
            f"{self.image_pull_delay:.3f}s ({self.image_pull_delay:.3f}s including "
            "waiting). Image size: 0 bytes.",
        )
        restarts, last_state = 0, None
        while not run.terminating:
            pod = self.api.find(POD, run.namespace, run.name)
            if pod is None:
                return
            try:
                refusal = self.volumes and runs_as_root_against_policy(
                    pod, container, self.volumes.images
                )
                if refusal:
                    raise ConfigError(refusal)
                argv, env, cwd = self._command(pod, container, run.workdir)
            except ConfigError as e:
                self._event(pod, "Failed", f"Error: {e}", "Warning")
                waiting = {"reason": "CreateContainerConfigError", "message": str(e)}
                self._report(run, container, {"waiting": waiting}, restarts, last_state)
                await asyncio.sleep(max(self.crash_backoff, 0.5))
                continue
            if self.volumes:
                argv, env = self.volumes.wrap(pod, container, argv, env, run.workdir)
            self._event(pod, "Created", f"Created container {container['name']}")
            try:
                program = os.path.join(cwd, argv[0]) if "/" in argv[0] else argv[0]
                if shutil.which(program, path=env["PATH"]) is None:
                    # checked here: behind the launch prefix, exec fails in nsenter instead
                    raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
                run.proc = await asyncio.create_subprocess_exec(
                    *self._launch_prefix(run),
                    *argv,
                    env=env,
                    cwd=cwd,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                )
            except OSError as e:
                message = f"failed to start container: exec: {argv[0]}: {e.strerror}"
                code, started = 128, rfc3339(self.node_now(node))
                self._event(pod, "Failed", f"Error: {message}", "Warning")
            else:
                started = rfc3339(self.node_now(node))
                run.started_at = started
                reader = asyncio.create_task(self._capture(run))
                log.info(
                    "%s/%s running on %s (pid %d)", run.namespace, run.name, node, run.proc.pid
                )
                self._event(pod, "Started", f"Started container {container['name']}")

                state = {"running": {"startedAt": started}}
                self._report(run, container, state, restarts, last_state, "Running", True)
                code = await run.proc.wait()
                await reader
                message = ""
            if run.terminating:
                return
            if code < 0:
                code = 128 - code  # killed by a signal, as a container runtime reports it
            terminated = {
                "exitCode": code,
                "reason": "Completed" if code == 0 else ("Error" if not message else "StartError"),
                "startedAt": started,
                "finishedAt": rfc3339(self.node_now(node)),
                "containerID": f"containerd://{run.uid[:8]}",
            }
            if message:
                terminated["message"] = message
            log.info("%s/%s container exited with %d", run.namespace, run.name, code)
            policy = pod["spec"].get("restartPolicy", "Always")
            if policy == "Never" or (policy == "OnFailure" and code == 0):
                phase = "Succeeded" if code == 0 else "Failed"

                self._report(
                    run,
                    container,
                    {"terminated": terminated},
                    restarts,
                    last_state,
                    phase,
                    reason="PodCompleted",
                )
                # a finished pod's sandbox goes; its status keeps the podIP it had
                await self._release(run)
                return
            restarts += 1
            last_state = {"terminated": terminated}
            backoff = min(self.crash_backoff * 2 ** (restarts - 1), 10 * self.crash_backoff)

            waiting = {
                "reason": "CrashLoopBackOff",
                "message": f"back-off {backoff:g}s restarting failed container="
                f"{container['name']} pod={run.name}_{run.namespace}",
            }
            pod = self._report(run, container, {"waiting": waiting}, restarts, last_state)
            self._event(
                pod,
                "BackOff",
                f"Back-off restarting failed container "
                f"{container['name']} in pod {run.name}_{run.namespace}",
                "Warning",
            )
            await asyncio.sleep(backoff)

    async def _wait_attached(self, run: PodRun) -> bool:
        """Wait while a volume is attached to another node (the attach/detach controller's
        FailedAttachVolume) or cannot be mounted (the kubelet's FailedMount: an NFS export no
        server serves), the pod ContainerCreating; False if the pod went meanwhile."""
        reported = ""
        while self.volumes and not run.terminating:
            pod = self.api.find(POD, run.namespace, run.name)
            if pod is None:
                return False
            error = self.volumes.attach_error(pod)
            reason, source = "FailedAttachVolume", "attachdetach-controller"
            if not error:
                error = self.volumes.mount_error(pod)
                reason, source = "FailedMount", "kubelet"
            if not error:
                return True
            if error != reported:
                reported = error
                self.api.record_event(pod, reason, error, "Warning", source)
            await asyncio.sleep(0.5)
        return not run.terminating

    async def _capture(self, run: PodRun) -> None:
        assert run.proc and run.proc.stdout
        while chunk := await run.proc.stdout.read(65536):
            run.output.extend(chunk)
            if len(run.output) > MAX_LOG_BYTES:
                del run.output[: len(run.output) - MAX_LOG_BYTES]

    def _command(self, pod: Obj, container: Obj, workdir: str) -> tuple[list[str], dict, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": workdir,
            "HOSTNAME": pod["metadata"]["name"],
        }
        if self.api_url:
            host, _, port = self.api_url.removeprefix("http://").partition(":")
            env.update(KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=port or "80")
        env = self._gpu_env(pod, container, container_env(self.api, pod, container, env))
        cwd = container.get("workingDir") or ""
        return container_argv(container, env), env, cwd if cwd and os.path.isdir(cwd) else workdir

    def _gpu_env(self, pod: Obj, container: Obj, env: dict[str, str]) -> dict[str, str]:
        """The image's NVIDIA variables, then the device plugin's, then the container's
        own (tests/kube_sim/gpus.py); records which GPUs the container sees."""
        node = self.api.find(NODE, "", pod["spec"].get("nodeName") or "")
        if node is None:
            return env
        plugin = self.devices.allocate(node, pod, set(self.runs))
        env = {**image_env(container.get("image") or ""), **plugin, **env}
        self.devices.expose(node, pod, env)
        return env

    def _launch_prefix(self, run: PodRun) -> list[str]:
        """What the container's command runs behind: into the pod's network namespace."""
        return self.network.exec_prefix(run.netns)

    # -- stopping ------------------------------------------------------------------------------

    async def _kill(self, run: PodRun, grace: float) -> None:
        """SIGTERM the process group, wait up to grace (capped), then SIGKILL."""
        proc = run.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        try:
            await asyncio.wait_for(proc.wait(), min(grace, self.max_grace_seconds) or 0.001)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    async def _stop(self, run: PodRun, grace: float) -> None:
        await self._kill(run, grace)
        if run.task is not asyncio.current_task():
            await cancel(run.task)
        await self._release(run)

    async def _release(self, run: PodRun) -> None:
        """Tear down the pod's network namespace once nothing runs in it; idempotent."""
        if run.pod_ip:
            ip, run.pod_ip, run.netns = run.pod_ip, "", ""
            await self.network.remove_pod(ip)

    async def _terminate(self, run: PodRun, pod: Obj, grace: float) -> None:
        self.api.record_event(
            pod,
            "Killing",
            f"Stopping container {pod['spec']['containers'][0]['name']}",
            component="kubelet",
            host=pod["spec"]["nodeName"],
            at=self.node_now(pod["spec"]["nodeName"]),
        )
        await self._stop(run, grace)
        log.info("%s/%s stopped", run.namespace, run.name)
        self._remove(pod)

    def _remove(self, pod: Obj) -> None:
        meta = pod["metadata"]
        if self.volumes:
            self.volumes.forget(pod)
        self.runs.pop(meta["uid"], None)
        self.health_reported.discard(meta["uid"])
        self._logs.pop((meta["namespace"], meta["name"]), None)
        current = self.api.find(POD, meta["namespace"], meta["name"])
        if current is not None and current["metadata"]["uid"] == meta["uid"]:
            with contextlib.suppress(ApiError):
                self.api.store.remove(
                    POD.api_version, POD.kind, meta["namespace"], meta["name"], POD.plural
                )
