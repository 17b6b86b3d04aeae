"""Metering on Kubernetes: billing sessions from the pods gputap labels.

The spawner posts each server's start and stop to billing; this meter is the second, idempotent
source, reading the truth from the cluster, so a start or stop the hub never sent (billing
down, hub down) is not lost. Both use the session id the pod carries, and the first writer
wins: a start or stop that was already recorded is a replay that changes nothing.

The rules, also in docs/billing.md ("Metering on Kubernetes"):

- A pod is a gputap server when it has the ``gputap.io/user`` label and the ``gputap.io/user``
  and ``gputap.io/offering`` annotations. Its session id is the ``gputap.io/session``
  annotation (the spawner's), else ``pod-<uid>``.
- The session starts when the server container (``notebook``) started running. A pod that is
  Pending, pulling its image or creating its container is not charged.
- It ends at the container's ``finishedAt`` once the pod has ended (Succeeded or Failed), or at
  the deletion request (``deletionTimestamp - deletionGracePeriodSeconds``), whichever is first.
  A pod that is gone (DELETED) or ended without either time ends when the meter saw that.
- At start-up and at every relist, a session whose pod no longer exists is closed at the pod's
  last known end: its last ``Killing`` event, else the last time billing saw it running
  (``sessions.last_seen_at``), else its start. Billing never charges time it cannot vouch for.
  The meter closes only sessions it has bound to a pod (table ``session_pods``), so a session
  it never saw a pod for is left to the spawner and the hub reconciler.

:func:`pod_facts` and :func:`vanished_end` are the pure decisions; :class:`KubeMeter` lists and
watches pods with kubernetes_asyncio and applies them through the store.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio import watch
from kubernetes_asyncio.client import ApiClient, ApiException, Configuration, CoreV1Api
from sqlalchemy import Engine, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from . import clock
from .orm import BillingSession, SessionPod
from .store import Store, UnknownSku

log = logging.getLogger("billing.meter")

T = TypeVar("T")

PREFIX = "gputap.io/"
SESSION_ANNOTATION = f"{PREFIX}session"
USER_KEY = f"{PREFIX}user"  # a label (slug) and an annotation (the username as is)
SERVER_ANNOTATION = f"{PREFIX}server"
OFFERING_ANNOTATION = f"{PREFIX}offering"
COUNT_LABEL = f"{PREFIX}count"
PRICE_CLASS_LABEL = f"{PREFIX}price-class"
#: the pods the meter lists and watches
LABEL_SELECTOR = USER_KEY
#: KubeSpawner's name for the single-user server's container
SERVER_CONTAINER = "notebook"
TERMINAL_PHASES = ("Succeeded", "Failed")
PRICE_CLASSES = ("on-demand", "spot")

#: how long one watch request lasts before the meter relists and reconciles
WATCH_SECONDS = 300
#: the longest wait before relisting after a failure
MAX_BACKOFF_SECONDS = 30.0


def parse_time(value: str | None) -> datetime | None:
    """A Kubernetes RFC 3339 time ("2026-11-29T19:00:00Z") as an aware datetime."""
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@dataclass(frozen=True)
class PodFacts:
    """What billing needs from one pod."""

    session_id: str
    namespace: str
    pod_name: str
    pod_uid: str
    username: str
    server_name: str
    sku: str
    count: int
    price_class: str
    #: the server container's first start; None while it never ran (not billed)
    started_at: datetime | None
    #: when it stopped for good, when the pod says so (container finish, deletion request)
    ended_at: datetime | None
    #: it will not run again: the pod ended (Succeeded, Failed) or is being deleted
    finished: bool

    @property
    def target(self) -> str:
        return f"{self.namespace}/{self.pod_name}"

    @property
    def running(self) -> bool:
        return self.started_at is not None and not self.finished


def _server_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == SERVER_CONTAINER:
            return status
    return {}


def _first_start(status: Mapping[str, Any], created: datetime | None) -> datetime | None:
    """The earliest start the container status still shows (a restarted container keeps the
    previous run in ``lastState``). Starts before the pod existed are the zero time a runtime
    reports for a container that never started, not a start."""
    starts = []
    for state in (status.get("state") or {}, status.get("lastState") or {}):
        for kind in ("running", "terminated"):
            started = parse_time((state.get(kind) or {}).get("startedAt"))
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
    username = annotations.get(USER_KEY)
    sku = annotations.get(OFFERING_ANNOTATION)
    if not username or not sku:
        return None
    namespace, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
    where = f"pod {namespace}/{name}"
    count_label = labels.get(COUNT_LABEL, "")
    if not count_label.isdigit() or int(count_label) < 1:
        raise ValueError(
            f"{where}: label {COUNT_LABEL} must be a positive integer, not {count_label!r}"
        )
    price_class = labels.get(PRICE_CLASS_LABEL, "on-demand")
    if price_class not in PRICE_CLASSES:
        raise ValueError(
            f"{where}: label {PRICE_CLASS_LABEL} must be on-demand or spot, not {price_class!r}"
        )
    containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    if SERVER_CONTAINER not in containers:
        raise ValueError(f"{where} has no container named {SERVER_CONTAINER!r} to meter")

    status = _server_status(pod)
    started_at = _first_start(status, parse_time(meta.get("creationTimestamp")))
    phase = (pod.get("status") or {}).get("phase")
    ends = []
    finished_at = parse_time(
        ((status.get("state") or {}).get("terminated") or {}).get("finishedAt")
    )
    if phase in TERMINAL_PHASES and finished_at is not None:
        ends.append(finished_at)
    deletion = parse_time(meta.get("deletionTimestamp"))
    if deletion is not None:
        grace = meta.get("deletionGracePeriodSeconds") or 0
        ends.append(deletion - timedelta(seconds=grace))
    return PodFacts(
        session_id=annotations.get(SESSION_ANNOTATION) or f"pod-{uid}",
        namespace=namespace,
        pod_name=name,
        pod_uid=uid,
        username=username,
        server_name=annotations.get(SERVER_ANNOTATION, ""),
        sku=sku,
        count=int(count_label),
        price_class=price_class,
        started_at=started_at,
        ended_at=min(ends, default=None),
        finished=phase in TERMINAL_PHASES or deletion is not None,
    )


# -- sessions whose pod vanished -----------------------------------------------------------------


@dataclass(frozen=True)
class MeteredSession:
    """An open session the meter bound to a pod."""

    session_id: str
    namespace: str
    pod_name: str
    pod_uid: str
    username: str
    server_name: str
    started_at: datetime
    last_seen_at: datetime | None


def event_time(event: Mapping[str, Any]) -> datetime | None:
    """When an event last happened (an aggregated event keeps its latest occurrence)."""
    series = event.get("series") or {}
    return parse_time(
        event.get("lastTimestamp")
        or series.get("lastObservedTime")
        or event.get("eventTime")
        or event.get("firstTimestamp")
    )


def killed_at(events: Iterable[Mapping[str, Any]], session: MeteredSession) -> datetime | None:
    """The time of the last ``Killing`` event of the session's pod, if the cluster kept one.

    Events name their pod by uid; one without a uid counts when its namespace and name match
    and it happened after the session started (a pod name is reused by later servers).
    """
    times = []
    for event in events:
        if event.get("reason") != "Killing":
            continue
        involved = event.get("involvedObject") or {}
        when = event_time(event)
        if when is None:
            continue
        if involved.get("uid"):
            if involved["uid"] != session.pod_uid:
                continue
        elif (involved.get("namespace"), involved.get("name")) != (
            session.namespace,
            session.pod_name,
        ) or when < session.started_at:
            continue
        times.append(when)
    return max(times, default=None)


def vanished_end(session: MeteredSession, killed: datetime | None) -> datetime:
    """Where a session whose pod is gone ends: its Killing event, else when billing last saw
    it running, else its start; never before its start."""
    end = killed or session.last_seen_at or session.started_at
    return max(end, session.started_at)


# -- the meter's own rows (run on the store's executor) ------------------------------------------


def bind_pod(engine: Engine, facts: PodFacts, now: datetime) -> None:
    """Record the pod of ``facts.session_id``; the first binding of a session stays."""
    try:
        with Session(engine) as db, db.begin():
            if db.get(SessionPod, facts.session_id) is None:
                db.add(
                    SessionPod(
                        session_id=facts.session_id,
                        namespace=facts.namespace,
                        pod_name=facts.pod_name,
                        pod_uid=facts.pod_uid,
                        created_at=now,
                    )
                )
    except IntegrityError:
        pass  # a concurrent writer bound it first


def open_metered_sessions(engine: Engine, namespace: str) -> list[MeteredSession]:
    """Open sessions bound to a pod in ``namespace``."""
    query = (
        select(SessionPod, BillingSession)
        .join(BillingSession, BillingSession.id == SessionPod.session_id)
        .where(BillingSession.ended_at.is_(None), SessionPod.namespace == namespace)
        .order_by(BillingSession.started_at, BillingSession.id)
    )
    with Session(engine) as db:
        return [
            MeteredSession(
                session_id=pod.session_id,
                namespace=pod.namespace,
                pod_name=pod.pod_name,
                pod_uid=pod.pod_uid,
                username=session.username,
                server_name=session.server_name,
                started_at=session.started_at,
                last_seen_at=session.last_seen_at,
            )
            for pod, session in db.execute(query).all()
        ]


# -- the loop ------------------------------------------------------------------------------------


class KubeConfigMissing(RuntimeError):
    """No way to reach the Kubernetes API; the message says what to set."""


async def kube_configuration(kubeconfig: str = "", api_host: str = "") -> Configuration:
    """The API client configuration: the kubeconfig file ``kubeconfig``, else the one named
    by ``$KUBECONFIG``, else the pod's service account (in-cluster); ``api_host`` overrides
    the server, as ``spawner.kubernetes.api_host`` does for the spawner."""
    configuration = Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG", "")
    try:
        if path:
            await kube_config.load_kube_config(
                config_file=path, client_configuration=configuration, persist_config=False
            )
        else:
            kube_config.load_incluster_config(client_configuration=configuration)
    except (kube_config.ConfigException, OSError) as e:
        where = f"kubeconfig {path}" if path else "in-cluster service account"
        why = str(e).rstrip(".")
        raise KubeConfigMissing(
            f"Billing meters pods (spawner.backend is kubernetes) but cannot use the {where}: "
            f"{why}. Set billing.kubeconfig or KUBECONFIG to a kubeconfig file, or run billing "
            "in the cluster with a service account that may list and watch pods and events."
        ) from None
    if api_host:
        configuration.host = api_host
    return configuration


class KubeMeter:
    """Lists and watches the gputap pods of one namespace and meters their sessions."""

    def __init__(
        self,
        store: Store,
        executor: Executor,
        api: CoreV1Api,
        namespace: str,
        *,
        seen_interval_seconds: float = 10.0,
        watch_seconds: int = WATCH_SECONDS,
    ) -> None:
        self.store = store
        self.executor = executor
        self.api = api
        self.namespace = namespace
        self.seen_interval_seconds = seen_interval_seconds
        self.watch_seconds = watch_seconds
        #: the gputap pods of the last list, kept current by the watch (by uid)
        self.pods: dict[str, PodFacts] = {}
        #: session id -> start, of sessions this meter started or found open
        self._open: dict[str, datetime] = {}
        #: session ids known to be settled (their events change nothing)
        self._settled: set[str] = set()
        #: pods and sessions reported as unbillable since the last list (logged once each)
        self._refused: set[str] = set()
        #: whether self.pods is current (listed, and the watch is live)
        self.synced = False

    @classmethod
    def from_config(
        cls,
        store: Store,
        executor: Executor,
        configuration: Configuration,
        namespace: str,
        **kwargs: Any,
    ) -> KubeMeter:
        return cls(store, executor, CoreV1Api(ApiClient(configuration)), namespace, **kwargs)

    async def _db(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    # -- one pod ---------------------------------------------------------------------------

    def _facts(self, pod: Mapping[str, Any]) -> PodFacts | None:
        try:
            return pod_facts(pod)
        except ValueError as e:
            uid = (pod.get("metadata") or {}).get("uid", "")
            if uid not in self._refused:
                self._refused.add(uid)
                log.warning("Metering: not billing %s", e)
            return None

    async def apply(self, pod: Mapping[str, Any], deleted: bool, seen_at: datetime) -> None:
        """Apply one pod state (from a list or a watch event); replays change nothing."""
        facts = self._facts(pod)
        if facts is None:
            return
        if deleted:
            self.pods.pop(facts.pod_uid, None)
        else:
            self.pods[facts.pod_uid] = facts
        if facts.started_at is None or facts.session_id in self._settled:
            return
        started_at = await self._start(facts)
        if started_at is not None and (deleted or facts.finished):
            await self._stop(facts, started_at, facts.ended_at or seen_at)

    async def _start(self, facts: PodFacts) -> datetime | None:
        """Start (or find) the pod's session; its start, or None when it is settled or
        cannot be billed."""
        if facts.session_id in self._open:
            return self._open[facts.session_id]
        now = clock.utcnow()
        await self._db(bind_pod, self.store.engine, facts, now)
        try:
            record, created = await self._db(
                self.store.start_session,
                facts.session_id,
                facts.username,
                facts.server_name,
                facts.sku,
                facts.count,
                facts.started_at,
                now,
                facts.price_class,
            )
        except UnknownSku as e:
            if facts.session_id not in self._refused:
                self._refused.add(facts.session_id)
                log.error(
                    "Metering: cannot bill %s (session %s): %s", facts.target, facts.session_id, e
                )
            return None
        if record.ended_at is not None:
            self._settled.add(facts.session_id)
            return None
        self._open[facts.session_id] = record.started_at
        if created:
            log.info(
                "Metering: %s/%s started at %s in pod %s (session %s, %d x %s, %s)",
                facts.username,
                facts.server_name,
                record.started_at.isoformat(),
                facts.target,
                facts.session_id,
                facts.count,
                facts.sku,
                facts.price_class,
            )
        return record.started_at

    async def _stop(self, facts: PodFacts, started_at: datetime, ended_at: datetime) -> None:
        ended_at = max(ended_at, started_at)
        record = await self._db(self.store.stop_session, facts.session_id, ended_at, clock.utcnow())
        self._open.pop(facts.session_id, None)
        self._settled.add(facts.session_id)
        if record.ended_at != ended_at:
            return  # the spawner (or the hub reconciliation) settled it first
        log.info(
            "Metering: %s/%s ended at %s in pod %s (session %s): %s s",
            facts.username,
            facts.server_name,
            record.ended_at.isoformat(),
            facts.target,
            facts.session_id,
            record.billed_seconds,
        )

    # -- list, reconcile, watch ------------------------------------------------------------

    async def _get(self, method: str, **kwargs: Any) -> dict[str, Any]:
        response = await getattr(self.api, method)(self.namespace, _preload_content=False, **kwargs)
        return json.loads(await response.read())

    async def resync(self) -> str:
        """List the pods, apply each, close the sessions whose pods are gone; returns the
        list's resourceVersion to watch from."""
        listing = await self._get("list_namespaced_pod", label_selector=LABEL_SELECTOR)
        seen_at = clock.utcnow()
        items = listing.get("items") or []
        self.pods = {}
        for pod in items:
            await self.apply(pod, deleted=False, seen_at=seen_at)
        # what was learnt about pods that are gone is no longer needed; unbillable pods
        # are reported again after each list, a reminder every few minutes
        self._refused.clear()
        present = {facts.session_id for facts in self.pods.values()}
        self._settled &= present
        self._open = {sid: at for sid, at in self._open.items() if sid in present}
        closed = await self.close_vanished({pod["metadata"]["uid"] for pod in items})
        self.synced = True
        running = [f for f in self.pods.values() if f.running]
        log.info(
            "Metering pods in namespace %s: %d gputap pods, %d running; %d sessions of "
            "vanished pods closed",
            self.namespace,
            len(self.pods),
            len(running),
            closed,
        )
        await self.mark_seen(seen_at)
        return listing["metadata"]["resourceVersion"]

    async def close_vanished(self, present_uids: set[str]) -> int:
        """Close every open session bound to a pod that is not in ``present_uids``."""
        sessions = await self._db(open_metered_sessions, self.store.engine, self.namespace)
        gone = [s for s in sessions if s.pod_uid not in present_uids]
        if not gone:
            return 0
        events = (await self._get("list_namespaced_event", field_selector="reason=Killing"))[
            "items"
        ]
        for session in gone:
            killed = killed_at(events, session)
            ended_at = vanished_end(session, killed)
            record = await self._db(
                self.store.stop_session, session.session_id, ended_at, clock.utcnow()
            )
            self._open.pop(session.session_id, None)
            how = (
                "its Killing event"
                if killed
                else "last seen running"
                if session.last_seen_at
                else "never seen running: its start"
            )
            log.info(
                "Metering: %s/%s ended at %s (%s), pod %s/%s is gone (session %s): %s s",
                session.username,
                session.server_name,
                record.ended_at.isoformat(),
                how,
                session.namespace,
                session.pod_name,
                session.session_id,
                record.billed_seconds,
            )
        return len(gone)

    async def watch(self, resource_version: str) -> None:
        """Apply pod events from ``resource_version`` until the stream ends.

        ``ApiException`` 410 when that version is too old (the caller relists)."""
        # a bare partial: the Watch finds no return type on it and hands over the JSON as is
        stream = watch.Watch().stream(
            partial(self.api.list_namespaced_pod, _preload_content=False),
            self.namespace,
            label_selector=LABEL_SELECTOR,
            resource_version=resource_version,
            timeout_seconds=self.watch_seconds,
        )
        async with stream as events:
            async for event in events:
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    await self.apply(
                        event["raw_object"], event["type"] == "DELETED", clock.utcnow()
                    )

    async def mark_seen(self, at: datetime) -> None:
        """Record that the sessions of running pods were seen running ``at``."""
        ids = [f.session_id for f in self.pods.values() if f.running and f.session_id in self._open]
        await self._db(self.store.mark_seen, ids, at)

    async def _mark_seen_forever(self) -> None:
        while True:
            await asyncio.sleep(self.seen_interval_seconds)
            if not self.synced:
                continue  # the view may be stale: a vanished pod must not look alive
            try:
                await self.mark_seen(clock.utcnow())
            except Exception:
                log.exception("Metering: recording running pods failed; trying again")

    async def run(self) -> None:
        """List, reconcile and watch forever. Every watch ends in a relist: at once after a
        normal end or a 410, after a growing back-off (1 s to 30 s) after an error."""
        seen = asyncio.ensure_future(self._mark_seen_forever())
        delay = 0.0
        try:
            while True:
                try:
                    resource_version = await self.resync()
                    await self.watch(resource_version)
                    delay = 0.0
                except asyncio.CancelledError:
                    raise
                except ApiException as e:
                    if e.status != 410:
                        delay = self._failed(e, delay)
                    else:
                        delay = 0.0
                except Exception as e:
                    delay = self._failed(e, delay)
                self.synced = False
                await asyncio.sleep(max(delay, 1.0))
        finally:
            seen.cancel()
            self.synced = False

    def _failed(self, error: Exception, delay: float) -> float:
        delay = min(max(2 * delay, 1.0), MAX_BACKOFF_SECONDS)
        log.warning(
            "Metering: watching pods in namespace %s failed (%s); relisting in %.0f s",
            self.namespace,
            error,
            delay,
        )
        return delay
