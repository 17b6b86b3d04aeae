"""Pure: what billing reads from a pod, and where a session whose pod vanished ends.

The rules are those of docs/billing.md, "Metering on Kubernetes";
:mod:`billing_service.loops.kube_meter` applies them to the pods it lists and watches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gputap_common.labels import (
    COUNT,
    COURSE,
    ENVIRONMENT,
    OFFERING,
    PRICE_CLASS,
    SERVER,
    SERVER_CONTAINER,
    SESSION,
    TERMINAL_PHASES,
    USER,
    WORKER,
    WORKER_CONTAINER,
)
from gputap_common.names import is_worker_name
from gputap_common.times import parse_kube_time, pod_time

from .pricing import ON_DEMAND, SERVER_PRICE_CLASSES


@dataclass(frozen=True)
class PodSession:
    """Which pod runs which server's session."""

    session_id: str
    namespace: str
    pod_name: str
    pod_uid: str
    username: str
    server_name: str

    @property
    def target(self) -> str:
        return f"{self.namespace}/{self.pod_name}"


@dataclass(frozen=True)
class PodFacts(PodSession):
    """What billing needs from one pod."""

    sku: str
    count: int
    price_class: str
    #: the course that funds it (billing's course slug), "" for the user's own credit
    course: str
    #: the server container's first start; None while it never ran (not billed)
    started_at: datetime | None
    #: when it stopped for good, when the pod says so (container finish, deletion request)
    ended_at: datetime | None
    #: it will not run again: the pod ended (Succeeded, Failed) or is being deleted
    finished: bool
    #: the environment its server runs, as the spawner names it ("" when it says none)
    environment: str = ""
    #: ``w1``… for a worker of the server's group (docs/scale-out.md), "" for the server
    worker: str = ""

    @property
    def running(self) -> bool:
        return self.started_at is not None and not self.finished


def _server_status(pod: Mapping[str, Any], container: str) -> Mapping[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container:
            return status
    return {}


def _first_start(
    pod: Mapping[str, Any], status: Mapping[str, Any], created: datetime | None
) -> datetime | None:
    """The earliest start the container status still shows (a restarted container keeps the
    previous run in ``lastState``), on the API server's clock. Starts before the pod existed
    are the zero time a runtime reports for a container that never started, not a start."""
    starts = []
    for state in (status.get("state") or {}, status.get("lastState") or {}):
        for kind in ("running", "terminated"):
            started = pod_time(pod, (state.get(kind) or {}).get("startedAt"))
            if started is not None and (created is None or started >= created):
                starts.append(started)
    return min(starts, default=None)


def pod_facts(pod: Mapping[str, Any]) -> PodFacts | None:
    """The billing facts of a pod as the API returns it (a dict in the API's JSON shape).

    None for a pod that is not a gputap server (no ``gputap.io/user`` and ``gputap.io/offering``
    annotations). ``ValueError`` for a gputap pod that cannot be billed as it is labelled (a
    count or price class billing does not know, no ``notebook`` container): billing does not
    guess.
    """
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    username = annotations.get(USER)
    sku = annotations.get(OFFERING)
    if not username or not sku:
        return None
    namespace, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
    where = f"pod {namespace}/{name}"
    count_label = labels.get(COUNT, "")
    if not count_label.isdigit() or int(count_label) < 1:
        raise ValueError(f"{where}: label {COUNT} must be a positive integer, not {count_label!r}")
    price_class = labels.get(PRICE_CLASS, ON_DEMAND)
    if price_class not in SERVER_PRICE_CLASSES:
        raise ValueError(
            f"{where}: label {PRICE_CLASS} must be on-demand or spot, not {price_class!r}"
        )
    worker = annotations.get(WORKER, "")
    if worker and not is_worker_name(worker):
        raise ValueError(f"{where}: annotation {WORKER} must be w1 to w999, not {worker[:20]!r}")
    metered = WORKER_CONTAINER if worker else SERVER_CONTAINER
    containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    if metered not in containers:
        raise ValueError(f"{where} has no container named {metered!r} to meter")

    status = _server_status(pod, metered)
    # a container's times come from its node's clock, which may be off the API server's
    started_at = _first_start(pod, status, parse_kube_time(meta.get("creationTimestamp")))
    phase = (pod.get("status") or {}).get("phase")
    ends = []
    finished_at = pod_time(
        pod, ((status.get("state") or {}).get("terminated") or {}).get("finishedAt")
    )
    if phase in TERMINAL_PHASES and finished_at is not None:
        ends.append(finished_at)
    deletion = parse_kube_time(meta.get("deletionTimestamp"))
    if deletion is not None:
        grace = meta.get("deletionGracePeriodSeconds") or 0
        ends.append(deletion - timedelta(seconds=grace))
    return PodFacts(
        session_id=annotations.get(SESSION) or f"pod-{uid}",
        namespace=namespace,
        pod_name=name,
        pod_uid=uid,
        username=username,
        server_name=annotations.get(SERVER, ""),
        sku=sku,
        count=int(count_label),
        price_class=price_class,
        course=annotations.get(COURSE, ""),
        started_at=started_at,
        ended_at=min(ends, default=None),
        finished=phase in TERMINAL_PHASES or deletion is not None,
        environment=annotations.get(ENVIRONMENT, ""),
        worker=worker,
    )


# -- sessions whose pod vanished -----------------------------------------------------------------


@dataclass(frozen=True)
class MeteredSession(PodSession):
    """An open session the meter bound to a pod."""

    started_at: datetime
    last_seen_at: datetime | None


def event_time(event: Mapping[str, Any]) -> datetime | None:
    """When an event last happened (an aggregated event keeps its latest occurrence)."""
    series = event.get("series") or {}
    return parse_kube_time(
        event.get("lastTimestamp")
        or series.get("lastObservedTime")
        or event.get("eventTime")
        or event.get("firstTimestamp")
    )


def killed_at(events: Iterable[Mapping[str, Any]], session: MeteredSession) -> datetime | None:
    """The time of the last ``Killing`` event of the session's pod, if the cluster kept one.

    Events name their pod by uid. An event without a uid counts when its namespace and name
    match and it happened after the session started; as a later server may reuse the pod's
    name, the earliest such event is taken (never charging past what billing can vouch for).
    """
    by_uid, by_name = [], []
    for event in events:
        involved = event.get("involvedObject") or {}
        when = event_time(event)
        if event.get("reason") != "Killing" or when is None:
            continue
        if involved.get("uid"):
            if involved["uid"] == session.pod_uid:
                by_uid.append(when)
        elif (involved.get("namespace"), involved.get("name")) == (
            session.namespace,
            session.pod_name,
        ) and when >= session.started_at:
            by_name.append(when)
    if by_uid:
        return max(by_uid)
    return min(by_name, default=None)


def vanished_end(session: MeteredSession, killed: datetime | None) -> datetime:
    """Where a session whose pod is gone ends: its Killing event, else when billing last saw
    it running, else its start; never before its start."""
    end = killed or session.last_seen_at or session.started_at
    return max(end, session.started_at)
