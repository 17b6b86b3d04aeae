"""The records the store answers with: frozen, detached from the database, priced at any
``now`` without another query."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from . import ledger
from .money import billed_seconds, cost_micro
from .pricing import ON_DEMAND, STORAGE, PriceBook

R = TypeVar("R")

#: what an idempotent write answers: the record, and whether this call wrote it (False: the
#: request was answered before, and this is its replay, which changed nothing)
Saved = tuple[R, bool]


@dataclass(frozen=True)
class SessionRecord:
    id: str
    username: str
    server_name: str
    sku: str
    count: int
    price_per_hour_micro: int
    started_at: datetime
    ended_at: datetime | None
    billed_seconds: int | None
    cost_micro: int | None
    price_class: str = ON_DEMAND
    charged_micro: int = 0
    course: str = ""
    price_book_version: int | None = None
    last_seen_at: datetime | None = None
    fallback: bool = False
    #: the environment the server ran ("" before environments were recorded)
    environment: str = ""
    #: the scale-out worker (``wK``) of ``server_name`` it meters, "" for the server itself
    worker: str = ""

    @property
    def rate_per_hour_micro(self) -> int:
        return self.price_per_hour_micro * self.count

    @property
    def is_worker(self) -> bool:
        """A worker of a server's group: stopped before servers, looked up among the
        server's workers by the reconciler."""
        return bool(self.worker)

    @property
    def is_storage(self) -> bool:
        """A data disk's session: never stopped, not a server on the hub, not GPU time."""
        return self.price_class == STORAGE

    def seconds_at(self, now: datetime) -> int:
        """Billed seconds: final when ended, so far (until ``now``) when running."""
        if self.billed_seconds is not None:
            return self.billed_seconds
        return billed_seconds(self.started_at, max(now, self.started_at))

    def cost_at(self, now: datetime) -> int:
        """Cost in micro-credits: final when ended, running cost until ``now`` otherwise."""
        if self.cost_micro is not None:
            return self.cost_micro
        return cost_micro(self.price_per_hour_micro, self.count, self.seconds_at(now))

    def uncharged_at(self, now: datetime) -> int:
        """What this session has cost by ``now`` beyond its charges posted so far."""
        return max(self.cost_at(now) - self.charged_micro, 0)

    def minimum_left_at(self, now: datetime, min_billable_seconds: int) -> int:
        """What its minimum billable period still claims beyond its cost by ``now``: a young
        server keeps holding the credit its admission held."""
        minimum = cost_micro(self.price_per_hour_micro, self.count, min_billable_seconds)
        return max(minimum - self.cost_at(now), 0)


@dataclass(frozen=True)
class TransactionRecord:
    """A ledger transaction as one user sees it: ``amount_micro`` is the net to their pools."""

    id: int
    username: str | None
    kind: str
    amount_micro: int
    postings: tuple[tuple[str, int], ...]
    session_id: str | None
    idempotency_key: str
    memo: str
    created_by: str
    created_at: datetime


@dataclass(frozen=True)
class HoldRecord:
    id: str
    username: str
    sku: str
    count: int
    price_class: str
    amount_micro: int
    created_at: datetime
    expires_at: datetime
    released_at: datetime | None
    release_reason: str
    session_id: str | None


@dataclass(frozen=True)
class OwnMoney:
    """The user's own credit: trial and paid pools, and the servers and disks it pays for.

    ``balance`` already has the posted charges of running sessions taken off; ``uncharged``
    is what they cost beyond those charges (and what course sessions that pay on cost beyond
    their course's allowance), so ``available = balance - uncharged`` and ``free = available
    - held`` (what a new server may claim)."""

    trial_micro: int
    paid_micro: int
    running_cost_micro: int
    charged_micro: int
    uncharged_micro: int
    held_micro: int
    rate_per_hour_micro: int

    @property
    def balance_micro(self) -> int:
        return self.trial_micro + self.paid_micro

    @property
    def available_micro(self) -> int:
        return self.balance_micro - self.uncharged_micro

    @property
    def free_micro(self) -> int:
        return self.available_micro - self.held_micro


@dataclass(frozen=True)
class CourseMoney:
    """One course's allowance for this student: the pool, and what is left of it after its
    running sessions' cost beyond their charges."""

    course: str
    pool_micro: int
    available_micro: int
    rate_per_hour_micro: int


@dataclass(frozen=True)
class Money:
    own: OwnMoney
    courses: tuple[CourseMoney, ...]


@dataclass(frozen=True)
class AccountState:
    """An account's pools, open sessions and active holds: enough to price it at any ``now``."""

    username: str
    created_at: datetime
    balance_micro: int
    running: tuple[SessionRecord, ...]
    pools: dict[str, int] = field(default_factory=dict)
    held_micro: int = 0

    @property
    def rate_per_hour_micro(self) -> int:
        """What the open sessions cost per hour together, data disks included."""
        return sum(s.rate_per_hour_micro for s in self.running)

    @property
    def servers(self) -> tuple[SessionRecord, ...]:
        """Open sessions of servers (on the hub, stopped when credit runs out)."""
        return tuple(s for s in self.running if not s.is_storage)

    @property
    def disks(self) -> tuple[SessionRecord, ...]:
        """Open storage sessions: data disks, never stopped by billing."""
        return tuple(s for s in self.running if s.is_storage)

    def running_cost_at(self, now: datetime) -> int:
        """What the open sessions (servers and disks) have cost so far (charged or not)."""
        return sum(s.cost_at(now) for s in self.running)

    def available_at(self, now: datetime) -> int:
        """Balance less what running servers cost beyond their posted charges."""
        return self.balance_micro - sum(s.uncharged_at(now) for s in self.running)

    def course_available_at(self, course: str, now: datetime) -> int:
        """A course's allowance left for this student: its pool less what the student's
        sessions of that course cost beyond their charges."""
        code = next((c for c in self.pools if c.endswith(f":allowance:{course}")), None)
        pool = self.pools.get(code, 0) if code else 0
        return pool - sum(s.uncharged_at(now) for s in self.running if s.course == course)

    def funding_groups(self, now: datetime) -> list[tuple[str, int, tuple[SessionRecord, ...]]]:
        """(course or "", available, sessions) for each group of running sessions that share
        their money: each course whose sessions its allowance alone pays, and the rest."""
        groups: list[tuple[str, int, tuple[SessionRecord, ...]]] = []
        alone = sorted({s.course for s in self.running if s.course and not s.fallback})
        for course in alone:
            sessions = tuple(s for s in self.running if s.course == course and not s.fallback)
            groups.append((course, self.course_available_at(course, now), sessions))
        rest = tuple(s for s in self.running if not s.course or s.fallback)
        if rest:
            # the user's own pools and the allowances of the courses of these sessions (a
            # student who pays on); other allowances pay for none of them, disks included
            usable = {
                ledger.pool_code(self.username, "allowance", s.course) for s in rest if s.course
            }
            theirs = sum(v for c, v in self.pools.items() if ":allowance:" in c and c not in usable)
            available = self.balance_micro - theirs - sum(s.uncharged_at(now) for s in rest)
            groups.append(("", available, rest))
        return groups

    def money_at(self, now: datetime) -> Money:
        """The account's money as two kinds a user must not confuse: their own credit (trial
        and paid pools) and each course's allowance, each less what its running sessions cost
        beyond their charges. A course session that pays on with the student's own credit
        (``fallback``) takes from the course first, and what the course cannot cover from the
        own credit. ``available_at`` is exactly the own credit's available plus the courses'."""
        courses = []
        overflow = 0
        for code, pool in sorted(self.pools.items()):
            if ":allowance:" not in code:
                continue
            course = ledger.course_of_pool(code)
            sessions = tuple(s for s in self.running if s.course == course)
            left = pool - sum(s.uncharged_at(now) for s in sessions)
            if left < 0 and any(s.fallback for s in sessions):
                overflow, left = overflow + left, 0
            courses.append(
                CourseMoney(
                    course=course,
                    pool_micro=pool,
                    available_micro=left,
                    rate_per_hour_micro=sum(s.rate_per_hour_micro for s in sessions),
                )
            )
        own_sessions = tuple(s for s in self.running if not s.course)
        own = OwnMoney(
            trial_micro=self.pools.get(ledger.pool_code(self.username, "trial"), 0),
            paid_micro=self.pools.get(ledger.pool_code(self.username, "paid"), 0),
            running_cost_micro=sum(s.cost_at(now) for s in own_sessions),
            charged_micro=sum(min(s.charged_micro, s.cost_at(now)) for s in own_sessions),
            uncharged_micro=sum(s.uncharged_at(now) for s in own_sessions) - overflow,
            held_micro=self.held_micro,
            rate_per_hour_micro=sum(s.rate_per_hour_micro for s in own_sessions),
        )
        return Money(own=own, courses=tuple(courses))

    def admissible_at(self, now: datetime, min_billable_seconds: int) -> int:
        """Credit a new server may claim: available less active holds, and less the rest of
        the minimum period of servers younger than it (a started hold keeps holding; disks
        have no minimum period)."""
        young = sum(s.minimum_left_at(now, min_billable_seconds) for s in self.servers)
        return self.available_at(now) - self.held_micro - young


@dataclass(frozen=True)
class PriceBookRecord:
    version: int
    created_at: datetime
    created_by: str
    source: str
    book: PriceBook


@dataclass(frozen=True)
class LedgerProblem:
    what: str
    detail: str

    def __str__(self) -> str:
        return f"{self.what}: {self.detail}"
