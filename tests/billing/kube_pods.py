"""gputap pods on the simulated cluster, and what the cluster recorded about them.

Shared by the pod meter's tests: they create pods the way the spawner labels them and compare
billing's sessions with the truth the simulated kubelet reported (container start, finish,
deletion request, Killing event).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

from gputap_common.times import parse_kube_time as parse_time
from tests.kube_sim.store import WatchEvent

NAMESPACE = "gputap"
SLEEP = "/bin/sleep"


def gputap_pod(
    name: str,
    username: str,
    sku: str = "A100-80GB",
    *,
    seconds: float = 300,
    count: int = 1,
    price_class: str = "on-demand",
    session_id: str | None = None,
    server_name: str = "",
    restart_policy: str = "Never",
    command: list[str] | None = None,
    node_selector: dict[str, str] | None = None,
    environment: str = "",
) -> dict:
    """A pod labelled and annotated as GPUKubeSpawner labels its pods (kube_objects.py), whose
    server container sleeps ``seconds``. Without ``session_id`` it has no session annotation
    (billing then calls its session ``pod-<uid>``)."""
    annotations = {
        "gputap.io/user": username,
        "gputap.io/server": server_name,
        "gputap.io/offering": sku,
    }
    if session_id:
        annotations["gputap.io/session"] = session_id
    if environment:
        annotations["gputap.io/environment"] = environment
    spec = {
        "restartPolicy": restart_policy,
        "containers": [
            {
                "name": "notebook",
                "image": "quay.io/jupyter/base-notebook:latest",
                "command": command or [SLEEP, f"{seconds:g}"],
            }
        ],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {
        "metadata": {
            "name": name,
            "labels": {
                "gputap.io/user": username,
                "gputap.io/count": str(count),
                "gputap.io/price-class": price_class,
            },
            "annotations": annotations,
        },
        "spec": spec,
    }


@dataclass
class PodTruth:
    """One pod's lifecycle as the simulated cluster reported it."""

    name: str
    uid: str
    session_id: str
    username: str
    sku: str
    count: int
    price_class: str
    started: datetime | None = None  # the container's first start
    finished: datetime | None = None  # its finish, once the pod ended
    delete_requested: datetime | None = None  # deletionTimestamp - grace
    deleted: bool = False  # the object is gone

    @property
    def end(self) -> datetime | None:
        ends = [t for t in (self.finished, self.delete_requested) if t is not None]
        return min(ends, default=None)

    def seconds(self) -> int:
        """Seconds from container start to end, floored like billing floors them."""
        return math.floor((self.end - self.started).total_seconds())


class Truth:
    """Records every pod of the namespace from the cluster's store (its write callbacks), so
    the record does not depend on the watch billing uses."""

    def __init__(self) -> None:
        self.pods: dict[str, PodTruth] = {}  # by uid
        self._lock = threading.Lock()

    def __call__(self, event: WatchEvent) -> None:
        if event.key[1] != "Pod" or event.key[2] != NAMESPACE:
            return
        pod = event.obj
        meta = pod["metadata"]
        annotations = meta.get("annotations") or {}
        labels = meta.get("labels") or {}
        with self._lock:
            truth = self.pods.get(meta["uid"])
            if truth is None:
                truth = self.pods[meta["uid"]] = PodTruth(
                    name=meta["name"],
                    uid=meta["uid"],
                    session_id=annotations.get("gputap.io/session") or f"pod-{meta['uid']}",
                    username=annotations.get("gputap.io/user", ""),
                    sku=annotations.get("gputap.io/offering", ""),
                    count=int(labels.get("gputap.io/count", "1")),
                    price_class=labels.get("gputap.io/price-class", "on-demand"),
                )
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                state = status.get("state") or {}
                for kind in ("running", "terminated"):
                    started = parse_time((state.get(kind) or {}).get("startedAt"))
                    if started and truth.started is None:
                        truth.started = started
                finished = parse_time((state.get("terminated") or {}).get("finishedAt"))
                if finished and pod["status"].get("phase") in ("Succeeded", "Failed"):
                    truth.finished = truth.finished or finished
            deletion = parse_time(meta.get("deletionTimestamp"))
            if deletion and truth.delete_requested is None:
                grace = meta.get("deletionGracePeriodSeconds") or 0
                truth.delete_requested = deletion - timedelta(seconds=grace)
            truth.deleted = truth.deleted or event.type == "DELETED"

    def snapshot(self) -> dict[str, PodTruth]:
        with self._lock:
            return {uid: PodTruth(**vars(t)) for uid, t in self.pods.items()}


def killing_times(events: list[dict]) -> dict[str, datetime]:
    """Pod uid -> the time of its (last) Killing event."""
    times: dict[str, datetime] = {}
    for event in events:
        if event.get("reason") == "Killing":
            uid = event["involvedObject"]["uid"]
            when = parse_time(event["lastTimestamp"])
            times[uid] = max(when, times.get(uid, when))
    return times
