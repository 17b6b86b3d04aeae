"""The simulated kube-scheduler: filters, a deterministic score, preemption, FailedScheduling.

The placement rules are pure functions of (pod, nodes, pods); `Scheduler` is the loop that
applies them to the store whenever pods or nodes change, and once a second regardless.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from . import storage
from .api import NODE, POD, TERMINAL_PHASES, Api, set_condition
from .control_loop import ControlLoop
from .faults import Faults
from .store import ApiError, Obj, WatchEvent

log = logging.getLogger("kube_sim.scheduler")

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")
_SUFFIX = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}


def parse_quantity(value: str | int | float) -> Fraction:
    """A Kubernetes quantity ("500m", "16Gi", "2", "1e3") as an exact number."""
    if isinstance(value, int | float):
        return Fraction(value)
    m = _QUANTITY.match(str(value).strip())
    if not m:
        raise ValueError(f"invalid quantity {value!r}")
    number, suffix = Fraction(m.group(1)), m.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return number * Fraction(10) ** int(suffix[1:])
    return number * _SUFFIX[suffix]


def pod_requests(pod: Obj) -> dict[str, Fraction]:
    """What a pod asks of a node: per container requests, limits where no request is given."""
    total: Counter[str] = Counter({"pods": Fraction(1)})
    for c in pod["spec"].get("containers", []):
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for name, q in merged.items():
            total[name] += parse_quantity(q)
    return dict(total)


def is_active(pod: Obj) -> bool:
    """Whether a pod holds its node's resources (bound and not finished)."""
    return (
        bool(pod["spec"].get("nodeName"))
        and pod.get("status", {}).get("phase") not in TERMINAL_PHASES
    )


def priority(pod: Obj) -> int:
    return int(pod["spec"].get("priority") or 0)


def tolerates(tolerations: list[Obj], taint: Obj) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        op = t.get("operator", "Equal")
        if not t.get("key") and op == "Exists":
            return True
        if t.get("key") == taint.get("key") and (
            op == "Exists" or t.get("value", "") == taint.get("value", "")
        ):
            return True
    return False


def _expression_matches(expr: Obj, labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values") or []
    if op == "In":
        return labels.get(key) in values
    if op == "NotIn":
        return labels.get(key) not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels:
        try:
            a, b = int(labels[key]), int(values[0])
        except (ValueError, IndexError):
            return False
        return a > b if op == "Gt" else a < b
    return False


def matches_node(pod: Obj, node: Obj) -> bool:
    """spec.nodeSelector and required node affinity against the node's labels."""
    labels = node["metadata"].get("labels") or {}
    for k, v in (pod["spec"].get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    affinity = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if not affinity:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}
    for term in affinity.get("nodeSelectorTerms") or []:
        if all(_expression_matches(e, labels) for e in term.get("matchExpressions") or []) and all(
            _expression_matches(e, fields) for e in term.get("matchFields") or []
        ):
            return True
    return False


def free_on(node: Obj, pods: list[Obj], excluding: set[str] = frozenset()) -> dict[str, Fraction]:
    """The node's allocatable minus what its active pods (other than `excluding` uids) hold."""
    free = {k: parse_quantity(v) for k, v in (node["status"].get("allocatable") or {}).items()}
    name = node["metadata"]["name"]
    for p in pods:
        if p["spec"].get("nodeName") == name and is_active(p):
            if p["metadata"]["uid"] in excluding:
                continue
            for k, q in pod_requests(p).items():
                free[k] = free.get(k, Fraction(0)) - q
    return free


def static_reason(pod: Obj, node: Obj) -> str | None:
    """Why a node is out regardless of resources, in kube-scheduler's words; None if it is not."""
    if node["spec"].get("unschedulable"):
        return "node(s) were unschedulable"
    for taint in node["spec"].get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(
            pod["spec"].get("tolerations") or [], taint
        ):
            return f"node(s) had untolerated taint {{{taint['key']}: {taint.get('value', '')}}}"
    if not matches_node(pod, node):
        return "node(s) didn't match Pod's node affinity/selector"
    return None


def resource_reasons(requests: dict[str, Fraction], free: dict[str, Fraction]) -> list[str]:
    reasons = []
    for k, q in sorted(requests.items()):
        if q > 0 and free.get(k, Fraction(0)) < q:
            reasons.append("Too many pods" if k == "pods" else f"Insufficient {k}")
    return reasons


@dataclass
class Placement:
    node: str | None
    message: str  # the FailedScheduling message when node is None


NodeFilter = Callable[[Obj], str | None]


def _no_filter(node: Obj) -> str | None:
    return None


def place(
    pod: Obj, nodes: list[Obj], pods: list[Obj], volume_filter: NodeFilter = _no_filter
) -> Placement:
    """Choose a node: every filter passes, then the tightest fit (least left over), then name.
    `volume_filter` says why the pod's volumes rule a node out (storage.node_reason)."""
    if not nodes:
        return Placement(None, "no nodes available to schedule pods")
    requests = pod_requests(pod)
    reasons: Counter[str] = Counter()
    fits: list[tuple[Fraction, str]] = []
    for node in nodes:
        reason = static_reason(pod, node) or volume_filter(node)
        if reason:
            reasons[reason] += 1
            continue
        free = free_on(node, pods)
        missing = resource_reasons(requests, free)
        if missing:
            reasons.update(missing)
            continue
        alloc = node["status"].get("allocatable") or {}
        left = sum(
            (
                (free[k] - q) / parse_quantity(alloc[k])
                for k, q in requests.items()
                if q > 0 and parse_quantity(alloc.get(k, 0)) > 0
            ),
            Fraction(0),
        )
        fits.append((left, node["metadata"]["name"]))
    if fits:
        return Placement(min(fits)[1], "")
    detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
    return Placement(None, f"0/{len(nodes)} nodes are available: {detail}.")


def preemption_plan(
    pod: Obj, nodes: list[Obj], pods: list[Obj], volume_filter: NodeFilter = _no_filter
) -> tuple[str, list[Obj]] | None:
    """The node and the fewest, lowest-priority victims whose eviction lets the pod fit."""
    if pod["spec"].get("preemptionPolicy") == "Never":
        return None  # kube-scheduler's DefaultPreemption: such a pod never evicts others
    requests, mine = pod_requests(pod), priority(pod)
    plans = []
    for node in nodes:
        if static_reason(pod, node) or volume_filter(node):
            continue
        name = node["metadata"]["name"]
        candidates = sorted(
            (
                p
                for p in pods
                if p["spec"].get("nodeName") == name
                and is_active(p)
                and priority(p) < mine
                and not p["metadata"].get("deletionTimestamp")
            ),
            key=lambda p: (priority(p), p["metadata"]["creationTimestamp"]),
        )
        evicted: set[str] = {p["metadata"]["uid"] for p in candidates}
        if resource_reasons(requests, free_on(node, pods, evicted)):
            continue
        # reprieve: keep every candidate, highest priority first, whose eviction is not needed
        for p in sorted(candidates, key=priority, reverse=True):
            trial = evicted - {p["metadata"]["uid"]}
            if not resource_reasons(requests, free_on(node, pods, trial)):
                evicted = trial
        victims = [p for p in candidates if p["metadata"]["uid"] in evicted]
        if victims:
            top = max(priority(v) for v in victims)
            plans.append((top, len(victims), name, victims))
    if not plans:
        return None
    _, _, name, victims = min(plans, key=lambda plan: plan[:3])
    return name, victims


class Scheduler(ControlLoop):
    """Binds Pending pods; reruns on every pod or node change and every `retry_interval` s."""

    def __init__(
        self,
        api: Api,
        faults: Faults,
        retry_interval: float = 1.0,
        event_interval: float = 5.0,
        names: tuple[str, ...] = ("default-scheduler",),
    ):
        self.api = api
        self.faults = faults
        # a pod is placed only by the scheduler its spec.schedulerName names; a second name
        # stands in for a second scheduler Deployment, such as z2jh's user-scheduler (a
        # kube-scheduler whose profile carries that name)
        self.names = names
        self.retry_interval = retry_interval
        self.event_interval = event_interval
        self._wake = asyncio.Event()
        self._last_event: dict[str, tuple[float, str]] = {}  # pod uid -> (when, message)

    def _on_change(self, event: WatchEvent) -> None:
        if event.key[1] in ("Pod", "Node", "PersistentVolumeClaim"):
            self._wake.set()

    async def _run(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancel that
            # arrives as the wake-up does (gh-86296), and stop() then waits forever
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.retry_interval):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.schedule_pending()
            except Exception:
                log.exception("scheduling pass failed")

    def _pending(self) -> list[Obj]:
        pending = [
            p
            for p in self.api.view(POD)
            if not p["spec"].get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
            and p["status"].get("phase") == "Pending"
            and p["spec"].get("schedulerName", "default-scheduler") in self.names
        ]
        return sorted(
            pending,
            key=lambda p: (
                -priority(p),
                p["metadata"]["creationTimestamp"],
                int(p["metadata"]["resourceVersion"]),
            ),
        )

    async def schedule_pending(self) -> None:
        """One pass over the Pending pods, highest priority first."""
        for pod in self._pending():
            ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            nodes = self.api.view(NODE)
            unresolvable = storage.prefilter(self.api, pod, self.api.view(POD))
            if unresolvable:
                self._unschedulable(pod, f"0/{len(nodes)} nodes are available: {unresolvable}.")
                continue

            def volumes(node: Obj, pod: Obj = pod) -> str | None:
                return storage.node_reason(self.api, pod, node)

            placement = place(pod, nodes, self.api.view(POD), volumes)
            if placement.node is None:
                plan = preemption_plan(pod, nodes, self.api.view(POD), volumes)
                if plan is None:
                    self._unschedulable(pod, placement.message)
                    continue
                self._preempt(pod, *plan)
                placement = place(pod, nodes, self.api.view(POD), volumes)
                if placement.node is None:
                    continue
            if self.faults.bind_delay:
                await asyncio.sleep(self.faults.bind_delay)
                current = self.api.find(POD, ns, name)
                if current is None or current["spec"].get("nodeName"):
                    continue
                placement = place(current, self.api.view(NODE), self.api.view(POD), volumes)
                if placement.node is None:
                    continue
            try:
                storage.bind_for(self.api, pod, self.api.get(NODE, "", placement.node))
                bound = self.api.bind(ns, name, placement.node)
            except ApiError as e:
                log.info("bind %s/%s failed: %s", ns, name, e.message)
                continue
            self._last_event.pop(pod["metadata"]["uid"], None)
            log.info("bound %s/%s to %s", ns, name, placement.node)
            self.api.record_event(
                bound, "Scheduled", f"Successfully assigned {ns}/{name} to {placement.node}"
            )

    def _unschedulable(self, pod: Obj, message: str) -> None:
        ns, name, uid = (
            pod["metadata"]["namespace"],
            pod["metadata"]["name"],
            pod["metadata"]["uid"],
        )
        updated = self.api.update_status(
            ns, name, lambda p: set_condition(p, "PodScheduled", "False", "Unschedulable", message)
        )
        now = time.monotonic()
        last = self._last_event.get(uid)
        if updated is None or (last and now - last[0] < self.event_interval):
            return
        self._last_event[uid] = (now, message)
        log.info("%s/%s unschedulable: %s", ns, name, message)
        self.api.record_event(updated, "FailedScheduling", message, "Warning")

    def _preempt(self, pod: Obj, node: str, victims: list[Obj]) -> None:
        """kube-scheduler's DefaultPreemption: each victim gets the DisruptionTarget condition
        and a Preempted event, then an ordinary graceful delete. The phase is left to the
        kubelet, which stops the containers within the grace period (its Killing event) and
        removes the pod; until then the victim holds its node's resources."""
        preemptor = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        message = f"Preempted by {preemptor} on node {node}"
        scheduler = pod["spec"].get("schedulerName", "default-scheduler")
        for v in victims:
            vns, vname = v["metadata"]["namespace"], v["metadata"]["name"]

            def disrupt(p: Obj) -> None:
                set_condition(
                    p,
                    "DisruptionTarget",
                    "True",
                    "PreemptionByScheduler",
                    f"{scheduler}: preempting to accommodate a higher priority pod",
                )

            updated = self.api.update_status(vns, vname, disrupt)
            if updated is None:
                continue
            log.info("preempted %s/%s for %s on %s", vns, vname, preemptor, node)
            self.api.record_event(updated, "Preempted", message)
            with contextlib.suppress(ApiError):
                self.api.delete(POD, vns, vname)
        self.api.update_status(
            pod["metadata"]["namespace"],
            pod["metadata"]["name"],
            lambda p: p["status"].update(nominatedNodeName=node),
        )
