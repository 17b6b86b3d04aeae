"""Billing killed -9 again and again while 200 servers come and go on the cluster.

The real billing service (``python -m billing_service``, as the hub starts it, on PostgreSQL)
meters the gputap pods of the simulated cluster. The test creates the pods itself, at most 30
running at once; some exit by themselves, the others are deleted. Meanwhile it kills billing
with SIGKILL at random moments (seeded), some right after a deletion, and starts it again after
a while. In the end every session is closed once, billed exactly its running time, and charged
once.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from sqlalchemy import create_engine, inspect, text

from billing_service.domain.pricing import make_price_book
from gputap_common.settings import load_settings
from tests.kube_sim import SimulatedCluster
from tests.kube_sim.api import NAMESPACE, POD
from tests.platform import free_port
from tests.postgres import fresh_postgres_database

from .kube_pods import NAMESPACE as NS
from .kube_pods import Truth, gputap_pod, killing_times

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = 200
AT_ONCE = 30
SEED = 20261130
USERS = [f"user{i}" for i in range(8)]
SKUS = ["cpu", "T4", "L40S", "A100-80GB", "A100-80GB/1g.10gb", "H100-80GB/3g.40gb"]
TRIAL = 10_000_000
#: a pod is deleted only after it ran this long while a billing process was watching, so that
#: its deletion may come while billing watches (and be applied, or not, by a billing killed
#: then), and only once billing has opened its session (see run_servers)
SEEN_MARGIN = timedelta(seconds=2)
#: how long the servers may take to come and go: about 90 s on an idle machine, twice that
#: when other tests load it (the billing processes then take seconds to start)
RUN_SECONDS = 300


@pytest.fixture
def postgres_url():
    """A fresh PostgreSQL database, dropped afterwards."""
    with fresh_postgres_database("gputap_billing_meter") as url:
        yield url


class Billing:
    """``python -m billing_service`` with the environment the hub gives it; the hub itself is
    not running (its API URL is a closed port, so the hub reconciler closes nothing)."""

    def __init__(self, root: Path, database_url: str, kubeconfig: str):
        settings = {
            "data_dir": str(root / "data"),
            "spawner": {"backend": "kubernetes", "kubernetes": {"namespace": NS}},
            "billing": {
                "database_url": database_url,
                "kubeconfig": kubeconfig,
                "meter_seen_interval_seconds": 1,
                # no spawner here: billing opens every session itself, at once
                "meter_start_grace_seconds": 0,
                "charge_interval_seconds": 3,  # interval charges while they run, then final
                "enforce_interval_seconds": 20,
                "reconcile_interval_seconds": 3600,
            },
        }
        path = root / "gputap.yaml"
        path.write_text(yaml.safe_dump(settings))
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",  # a killed process loses no log line
            "GPUTAP_SETTINGS": str(path),
            "JUPYTERHUB_API_TOKEN": "not-a-hub-token",
            "JUPYTERHUB_API_URL": f"http://127.0.0.1:{free_port()}/hub/api",
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{free_port()}",
            "JUPYTERHUB_SERVICE_PREFIX": "/services/billing/",
        }
        self.log_path = root / "billing.log"
        self.proc: subprocess.Popen | None = None
        self.kills = 0
        self._read = 0  # how much of the log was searched for the synced line
        self._synced = False
        #: (from, to) of every process's watch: from its synced line to its kill (None: now)
        self.watches: list[tuple[datetime, datetime | None]] = []

    def start(self) -> None:
        self._read = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._synced = False
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "billing_service"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def synced(self) -> bool:
        """Whether this process has listed the pods and reconciled (it logs a line then)."""
        if not self.up:
            assert self.proc is None, f"billing exited by itself:\n{self.log_tail()}"
            return False
        if not self._synced:
            with open(self.log_path, "rb") as log:
                log.seek(self._read)
                new = log.read()
            # a line may be half written: search again from its start next time
            self._read += new.rfind(b"\n") + 1
            self._synced = b"Metering pods in namespace" in new
            if self._synced:
                self.watches.append((datetime.now(UTC), None))
        return self._synced

    def has_seen(self, started: datetime) -> bool:
        """Whether a pod running since ``started`` was in view of a live watch for
        SEEN_MARGIN."""
        now = datetime.now(UTC)
        return any((to or now) - max(started, since) >= SEEN_MARGIN for since, to in self.watches)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.proc = None
        self.kills += 1
        if self._synced:
            self.watches[-1] = (self.watches[-1][0], datetime.now(UTC))
        self._synced = False

    def stop(self) -> None:
        if self.up:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class Plan:
    """One server: who, what, and how it ends (exits by itself, or deleted) after ``life`` s."""

    name: str
    username: str
    sku: str
    count: int
    price_class: str
    session_id: str | None
    deleted: bool
    life: float
    created: bool = False
    delete_asked: bool = False


def plans(rng: random.Random) -> list[Plan]:
    return [
        Plan(
            name=f"srv-{i:03d}",
            username=rng.choice(USERS),
            sku=rng.choice(SKUS),
            count=rng.choice([1, 1, 2]),
            price_class="spot" if rng.random() < 0.2 else "on-demand",
            # most carry the spawner's session id; the others are billed as pod-<uid>
            session_id=str(uuid.uuid4()) if rng.random() < 0.8 else None,
            deleted=rng.random() < 0.5,
            life=rng.uniform(5, 11),
        )
        for i in range(SESSIONS)
    ]


def test_billing_killed_at_random_moments_bills_every_pod_once_for_its_running_time(
    tmp_path, postgres_url
):
    rng = random.Random(SEED)
    todo = plans(rng)
    truth = Truth()
    with SimulatedCluster.run_in_thread(seed=SEED, max_grace_seconds=1) as cluster:
        sim = cluster.cluster
        cluster.add_node("cpu-1", allocatable={"cpu": "256", "memory": "1Ti", "pods": "300"})
        cluster.call(sim.api.create, NAMESPACE, "", {"metadata": {"name": NS}})
        cluster.call(sim.api.store.subscribe, truth)
        kubeconfig = cluster.write_kubeconfig(str(tmp_path / "kubeconfig"), namespace=NS)
        billing = Billing(tmp_path, postgres_url, kubeconfig)
        billing.start()
        try:
            run_servers(cluster, billing, todo, truth, rng, postgres_url)
            # billing up for good: every session gets closed
            if not billing.up:
                billing.start()
            settled = wait_settled(postgres_url, truth, billing)
        finally:
            billing.stop()
        events = cluster.events(NS)
    assert billing.kills >= 5, billing.kills
    check_bills(postgres_url, todo, truth.snapshot(), killing_times(events), settled)


def run_servers(cluster, billing: Billing, todo: list[Plan], truth: Truth, rng, url: str) -> None:
    """Create the pods in waves, end them, and kill and restart billing, until all ended.

    A pod is deleted only once billing has opened its session: billing must have seen the pod
    to know its session (a pod that lives and dies unseen is billed by the spawner's own start
    and stop, which this test does not send). SEEN_MARGIN of a live watch alone was not
    enough on a loaded machine: billing opened sessions up to 8 s after their container
    started, and a pod deleted before that, billing killed meanwhile, was gone when the next
    billing process listed, its session never opened."""
    engine = create_engine(url)
    try:
        _run_servers(cluster, billing, todo, truth, rng, engine)
    finally:
        engine.dispose()


def opened_sessions(engine) -> set[str]:
    """The ids of the sessions billing has opened, ended or not (none before its first
    process made the tables)."""
    with engine.connect() as db:
        if not inspect(db).has_table("sessions"):
            return set()
        return set(db.scalars(text("SELECT id FROM sessions")))


def _run_servers(cluster, billing, todo, truth, rng, engine) -> None:
    sim = cluster.cluster
    next_kill: float | None = None
    down_until = 0.0
    deadline = time.monotonic() + RUN_SECONDS
    while time.monotonic() < deadline:
        now = datetime.now(UTC)
        pods = {t.name: t for t in truth.snapshot().values()}
        active = [p for p in todo if p.created and not ended(pods.get(p.name))]
        if all(p.created for p in todo) and not active:
            return
        for plan in [p for p in todo if not p.created][: max(AT_ONCE - len(active), 0)]:
            seconds = 600 if plan.deleted else plan.life
            body = gputap_pod(
                plan.name,
                plan.username,
                plan.sku,
                seconds=round(seconds, 1),
                count=plan.count,
                price_class=plan.price_class,
                session_id=plan.session_id,
            )
            cluster.call(sim.api.create, POD, NS, body)
            plan.created = True
        synced = billing.synced()
        opened = opened_sessions(engine)
        for plan in active:
            pod = pods.get(plan.name)
            if not plan.deleted or plan.delete_asked or pod is None or pod.started is None:
                continue
            if now - pod.started < timedelta(seconds=plan.life):
                continue
            if not billing.has_seen(pod.started) or pod.session_id not in opened:
                continue
            cluster.call(sim.api.delete, POD, NS, plan.name)
            plan.delete_asked = True
            if synced and rng.random() < 0.15:
                # billing dies while this pod ends: its DELETED may or may not be applied
                billing.kill()
                synced = False
                down_until, next_kill = time.monotonic() + rng.uniform(0, 1.5), None
        if synced and next_kill is None:
            next_kill = time.monotonic() + rng.uniform(2, 7)
        if synced and time.monotonic() >= next_kill:
            billing.kill()
            down_until, next_kill = time.monotonic() + rng.uniform(0, 1.5), None
        if not billing.up and time.monotonic() >= down_until:
            billing.start()
        time.sleep(0.1)
    raise AssertionError(f"the servers did not all end within {RUN_SECONDS} s")


def ended(pod) -> bool:
    return pod is not None and (pod.finished is not None or pod.deleted)


def wait_settled(url: str, truth: Truth, billing: Billing) -> dict[str, dict]:
    """Every pod's session, once all are closed (billing's last process reconciles them)."""
    engine = create_engine(url)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with engine.connect() as db:
                rows = {r.id: r._asdict() for r in db.execute(text("SELECT * FROM sessions"))}
            pods = {t.session_id: t for t in truth.snapshot().values()}
            never = sorted(pods[s].name for s in pods if s not in rows)
            open_ = sorted(pods[s].name for s in pods if s in rows and not rows[s]["ended_at"])
            if not never and not open_:
                return rows
            time.sleep(0.5)
    finally:
        engine.dispose()
    raise AssertionError(
        f"sessions not closed within 60 s: still open {open_}, never opened {never}\n"
        f"{billing.log_tail()}"
    )


def check_bills(url, todo, pods, killed, sessions) -> None:
    prices = make_price_book(load_settings(environ={}).billing["prices"])
    truth = {t.name: t for t in pods.values()}
    assert len(truth) == SESSIONS
    assert set(sessions) == {t.session_id for t in truth.values()}  # no session too many
    costs: dict[str, int] = {}
    for plan in todo:
        pod = truth[plan.name]
        session = sessions[pod.session_id]
        assert pod.session_id == (plan.session_id or f"pod-{pod.uid}")
        assert (session["username"], session["sku"], session["count"]) == (
            plan.username,
            plan.sku,
            plan.count,
        )
        assert session["price_class"] == plan.price_class
        assert session["price_per_hour_micro"] == prices.price(plan.sku, plan.price_class)
        # the container's start -> its finish, or the kill the cluster recorded, within 1 s
        end = pod.finished if not plan.deleted else killed[pod.uid]
        true_seconds = (end - pod.started).total_seconds()
        assert abs(session["billed_seconds"] - true_seconds) <= 1, (plan, session, pod)
        assert session["started_at"].replace(tzinfo=UTC) == pod.started
        cost = session["price_per_hour_micro"] * plan.count * session["billed_seconds"] // 3600
        assert session["cost_micro"] == cost
        assert session["charged_micro"] == cost
        costs[plan.username] = costs.get(plan.username, 0) + cost
    engine = create_engine(url)
    try:
        with engine.connect() as db:
            charges = db.execute(
                text(
                    "SELECT t.session_id, t.idempotency_key, "
                    "COALESCE(SUM(CASE WHEN a.code LIKE 'system:revenue:%' "
                    "THEN p.amount_micro END), 0) AS revenue "
                    "FROM ledger_transactions t "
                    "JOIN ledger_postings p ON p.transaction_id = t.id "
                    "JOIN ledger_accounts a ON a.id = p.ledger_account_id "
                    "WHERE t.kind = 'charge' GROUP BY t.id, t.session_id, t.idempotency_key"
                )
            ).all()
            balances = dict(
                db.execute(
                    text(
                        "SELECT u.username, SUM(a.balance_micro) FROM ledger_accounts a "
                        "JOIN accounts u ON u.id = a.account_id GROUP BY u.username"
                    )
                ).all()
            )
    finally:
        engine.dispose()
    intervals: dict[str, int] = dict.fromkeys(sessions, 0)
    finals: dict[str, int] = {}
    for session_id, key, amount in charges:
        # interval charges charge:{id}:{k} while it ran, then the final charge:{id}:final
        # for the rest (or a refund), posted only when there is a rest
        k = key.removeprefix(f"charge:{session_id}:")
        if k == "final":
            finals[session_id] = amount
        else:
            assert k.isdigit(), key
            intervals[session_id] += amount
    for session_id, session in sessions.items():
        rest = session["cost_micro"] - intervals[session_id]
        assert finals.get(session_id, 0) == rest  # charged once, in full
        assert (session_id in finals) == (rest != 0)
    assert sum(intervals.values()) > 0  # the charger ran too, between kills
    assert sum(intervals.values()) > 0  # the charger ran while billing was being killed
    assert balances == {user: TRIAL - costs.get(user, 0) for user in balances}
    assert set(balances) == {plan.username for plan in todo}
