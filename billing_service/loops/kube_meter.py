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
  Pending, pulling its image or creating its container is not charged. The meter leaves the
  spawner ``start_grace_seconds`` to open a running pod's session itself (with its admission's
  hold), then opens it from the container's start.
- It ends at the container's ``finishedAt`` once the pod has ended (Succeeded or Failed), or at
  the deletion request (``deletionTimestamp - deletionGracePeriodSeconds``), whichever is first.
  A pod that is gone (DELETED) or ended without either time ends when the meter saw that.
- A container's times come from its node's clock: they are read on the API server's clock
  (:func:`gputap_common.times.pod_time`), and never later than when the meter saw them.
- At start-up and at every relist, a session whose pod no longer exists is closed at the pod's
  last known end: its last ``Killing`` event, else the last time billing saw it running
  (``sessions.last_seen_at``), else its start. Billing never charges time it cannot vouch for.
  The meter closes only sessions it has bound to a pod (table ``session_pods``), so a session
  it never saw a pod for is left to the spawner and the hub reconciler.

:mod:`billing_service.domain.pod_facts` holds the pure decisions (``pod_facts``,
``vanished_end``), :mod:`billing_service.store.pods` the meter's own rows; :class:`KubeMeter`
lists and watches pods through :mod:`gputap_common.kube_watch` (on kubernetes_asyncio) and
applies them through the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import ApiClient, ApiException, Configuration, CoreV1Api

from gputap_common import clock, labels
from gputap_common.kube_watch import SilentWatch, list_objects, watch_objects

from ..domain.pod_facts import (
    PodFacts,
    killed_at,
    pod_facts,
    vanished_end,
)
from ..store import Store
from ..store.pods import bind_pod, open_metered_sessions
from . import KubeConfigMissing
from .repeat import repeat

log = logging.getLogger("billing.meter")

T = TypeVar("T")

#: the pods the meter lists and watches
LABEL_SELECTOR = labels.USER
#: how long one watch request lasts before the meter relists and reconciles: short, as the
#: hub's and KubeSpawner's, because a watch whose connection died without closing is only
#: given up WATCH_GRACE_SECONDS after it should have ended, and until then the meter is blind
#: (a pod's end is noticed at most WATCH_SECONDS + WATCH_GRACE_SECONDS + 1 s late)
WATCH_SECONDS = 10
#: the longest wait before relisting after a failure
MAX_BACKOFF_SECONDS = 30.0
#: how often a pod that cannot be billed is reported again while it exists
REFUSAL_REMINDER_SECONDS = 300
#: how often sessions waiting out their start grace are looked at
WAITING_CHECK_SECONDS = 1.0


# -- the loop ------------------------------------------------------------------------------------


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


@dataclass(eq=False)
class KubeMeter:
    """Lists and watches the gputap pods of one namespace and meters their sessions through
    ``store``, on its database thread ``executor``."""

    store: Store
    executor: Executor
    api: CoreV1Api
    namespace: str
    _: KW_ONLY
    #: how often the sessions of running pods are recorded as seen running
    seen_interval_seconds: float = 10.0
    #: how long the spawner has to open a running pod's session before the meter does
    start_grace_seconds: float = 30.0
    #: how long one watch request lasts before the meter relists
    watch_seconds: int = WATCH_SECONDS
    #: set once the meter has listed the pods and closed the sessions of vanished ones
    listed: asyncio.Event = field(default_factory=asyncio.Event)
    #: the gputap pods of the last list, kept current by the watch (by uid)
    pods: dict[str, PodFacts] = field(default_factory=dict, init=False)
    #: session id -> start, of sessions this meter started or found open
    _open: dict[str, datetime] = field(default_factory=dict, init=False)
    #: running pods whose session the spawner has the start grace to open (by session id)
    _waiting: dict[str, PodFacts] = field(default_factory=dict, init=False)
    #: session ids whose pod this process has recorded in session_pods
    _bound: set[str] = field(default_factory=set, init=False)
    #: session ids known to be settled (their events change nothing)
    _settled: set[str] = field(default_factory=set, init=False)
    #: pods and sessions reported as unbillable since the last list (logged once each)
    _refused: set[str] = field(default_factory=set, init=False)
    #: when self._refused was last emptied, so that each is reported again
    _reminded_at: datetime | None = field(default=None, init=False)
    #: whether self.pods is current (listed, and the watch is live)
    synced: bool = field(default=False, init=False)
    #: whether the last watch ended on time (its relist is routine: logged at debug level)
    _routine: bool = field(default=False, init=False)
    #: when self.pods was last known current: a list, a watch event, a watch that ended on
    #: time. A watch gone silent looks like a quiet one until its end is overdue, so only
    #: these moments, not the clock, are recorded as when running pods were seen
    _current_at: datetime | None = field(default=None, init=False)

    @property
    def start_grace(self) -> timedelta:
        return timedelta(seconds=self.start_grace_seconds)

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
        ending = deleted or facts.finished
        if not ending and facts.session_id not in self._open:
            await self._bind(facts)
            if clock.utcnow() - facts.started_at < self.start_grace:
                # the spawner opens it with what only it knows (its admission's hold)
                self._waiting[facts.session_id] = facts
                return
        self._waiting.pop(facts.session_id, None)
        started_at = await self._start(facts)
        if started_at is not None and ending:
            # never an end after the meter saw it (a node's clock may be ahead)
            await self._stop(facts, started_at, min(facts.ended_at or seen_at, seen_at))

    async def _bind(self, facts: PodFacts) -> None:
        if facts.session_id not in self._bound:
            await self._db(bind_pod, self.store.engine, facts, clock.utcnow())
            self._bound.add(facts.session_id)

    async def _start(self, facts: PodFacts) -> datetime | None:
        """Start (or find) the pod's session; its start, or None when it is settled or
        cannot be billed."""
        if facts.session_id in self._open:
            return self._open[facts.session_id]
        await self._bind(facts)
        start = partial(
            self.store.start_session,
            course=facts.course,
            environment=facts.environment,
            worker=facts.worker,
        )
        try:
            record, created = await self._db(
                start,
                facts.session_id,
                facts.username,
                facts.server_name,
                facts.sku,
                facts.count,
                min(facts.started_at, clock.utcnow()),  # never a start in the future
                clock.utcnow(),
                facts.price_class,
            )
        except ValueError as e:  # a SKU without a price, a course the user is not in
            if facts.session_id not in self._refused:
                self._refused.add(facts.session_id)
                log.error(
                    "Metering: cannot bill %s (session %s): %s", facts.target, facts.session_id, e
                )
            return None
        if record.is_storage:  # the pod names a data disk's session: not a server to meter
            if facts.session_id not in self._refused:
                self._refused.add(facts.session_id)
                log.error(
                    "Metering: cannot bill %s: session %s is a data disk's, not a server's",
                    facts.target,
                    facts.session_id,
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

    async def resync(self) -> str:
        """List the pods, apply each, close the sessions whose pods are gone; returns the
        list's resourceVersion to watch from."""
        listing = await list_objects(
            self.api.list_namespaced_pod, self.namespace, label_selector=LABEL_SELECTOR
        )
        seen_at = clock.utcnow()
        items = listing.get("items") or []
        # unbillable pods are reported again every few minutes, not at each relist
        reminder = timedelta(seconds=REFUSAL_REMINDER_SECONDS)
        if self._reminded_at is None or seen_at - self._reminded_at >= reminder:
            self._refused.clear()
            self._reminded_at = seen_at
        self.pods = {}
        for pod in items:
            await self.apply(pod, deleted=False, seen_at=seen_at)
        # what was learnt about pods that are gone is no longer needed
        present = {facts.session_id for facts in self.pods.values()}
        self._settled &= present
        self._bound &= present
        self._open = {sid: at for sid, at in self._open.items() if sid in present}
        self._waiting = {sid: f for sid, f in self._waiting.items() if sid in present}
        closed = await self.close_vanished({pod["metadata"]["uid"] for pod in items})
        self.synced, self._current_at = True, seen_at
        self.listed.set()
        running = [f for f in self.pods.values() if f.running]
        # one line per state change: a relist every few seconds that changed nothing is not one
        log.log(
            logging.DEBUG if self._routine and not closed else logging.INFO,
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
        listing = await list_objects(
            self.api.list_namespaced_event, self.namespace, field_selector="reason=Killing"
        )
        events = listing["items"]
        for session in gone:
            killed = killed_at(events, session)
            # a Killing event has its node's time, which may be ahead
            ended_at = min(vanished_end(session, killed), clock.utcnow())
            record = await self._db(
                self.store.stop_session, session.session_id, ended_at, clock.utcnow()
            )
            self._open.pop(session.session_id, None)
            if record.ended_at != ended_at:
                continue  # the spawner (or the hub reconciliation) settled it meanwhile
            how = (
                "its Killing event"
                if killed
                else "last seen running"
                if session.last_seen_at
                else "never seen running: its start"
            )
            log.info(
                "Metering: %s/%s ended at %s (%s), pod %s is gone (session %s): %s s",
                session.username,
                session.server_name,
                record.ended_at.isoformat(),
                how,
                session.target,
                session.session_id,
                record.billed_seconds,
            )
        return len(gone)

    async def watch(self, resource_version: str) -> None:
        """Apply pod events from ``resource_version`` until the stream ends.

        ``ApiException`` 410 when that version is too old (the caller relists)."""
        events = watch_objects(
            self.api.list_namespaced_pod,
            self.namespace,
            label_selector=LABEL_SELECTOR,
            resource_version=resource_version,
            timeout_seconds=self.watch_seconds,
        )
        # closed at once when applying an event fails, not whenever the generator is collected
        async with contextlib.aclosing(events):
            async for kind, pod in events:
                seen_at = clock.utcnow()
                await self.apply(pod, kind == "DELETED", seen_at)
                self._current_at = seen_at  # what came before it has come too
        self._current_at = clock.utcnow()  # ended on time: nothing was withheld

    async def mark_seen(self, at: datetime) -> None:
        """Record that the sessions of running pods were seen running ``at`` (those the
        spawner opened during their start grace too)."""
        ids = [f.session_id for f in self.pods.values() if f.running]
        await self._db(self.store.mark_seen, ids, at)

    async def _mark_seen_if_synced(self) -> None:
        # never from a stale view: a vanished pod must not look alive
        if self.synced and self._current_at is not None:
            await self.mark_seen(self._current_at)

    async def start_waiting(self) -> None:
        """Open the sessions of running pods whose start grace is over (the spawner did not
        open them): from the container's start, so no second is lost."""
        for session_id, facts in list(self._waiting.items()):
            if clock.utcnow() - facts.started_at < self.start_grace:
                continue
            del self._waiting[session_id]
            current = self.pods.get(facts.pod_uid)
            if current is None or current.finished:
                continue  # apply() has ended it
            try:
                await self._start(current)
            except Exception:
                self._waiting.setdefault(session_id, current)  # next time, or the next list
                raise

    async def run(self) -> None:
        """List, reconcile and watch forever. Every watch ends in a relist: a second after a
        normal end or a 410, after a growing back-off (1 s to 30 s) after an error."""
        seen = asyncio.ensure_future(
            repeat(
                self._mark_seen_if_synced,
                self.seen_interval_seconds,
                log=log,
                failed="Metering: recording running pods failed; trying again",
                wait_first=True,
            )
        )
        waiting = asyncio.ensure_future(
            repeat(
                self.start_waiting,
                WAITING_CHECK_SECONDS,
                log=log,
                failed="Metering: opening sessions after their start grace failed",
                wait_first=True,
            )
        )
        delay = 0.0
        try:
            while True:
                ended_on_time = False
                try:
                    resource_version = await self.resync()
                    await self.watch(resource_version)
                    delay, ended_on_time = 0.0, True
                except asyncio.CancelledError:
                    raise
                except SilentWatch as e:
                    # what the dead connection withheld is not known: relist after the
                    # usual second, as the hub does, not after a growing back-off
                    log.warning(
                        "Metering: watching pods in namespace %s: %s; relisting",
                        self.namespace,
                        e,
                    )
                    delay = 0.0
                except ApiException as e:
                    if e.status != 410:
                        delay = self._failed(e, delay)
                    else:
                        delay = 0.0
                except Exception as e:
                    delay = self._failed(e, delay)
                self.synced, self._routine = False, ended_on_time
                await asyncio.sleep(max(delay, 1.0))
        finally:
            seen.cancel()
            waiting.cancel()
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
