"""Faults a test can inject into the simulated cluster: 5xx answers, dropped watches, watches
and requests that go silent, watch events delivered twice, slow binds.

All randomness comes from one seeded RNG, so a run with the same seed and the same sequence of
requests fails the same requests. Thread-safe: the thread form of the cluster lets a test change
knobs from outside the server's loop.
"""

from __future__ import annotations

import random
import re
import threading
from dataclasses import dataclass, field

_REASONS = {
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
    429: "TooManyRequests",
}


@dataclass
class ErrorRule:
    """Answer `rate` of the matching requests with `code` instead of serving them."""

    rate: float
    code: int = 500
    verbs: frozenset[str] | None = None  # HTTP methods, upper case; None = all
    path: re.Pattern[str] | None = None  # searched in the request path; None = all
    watches: bool = True  # whether watch requests count
    users: frozenset[str] | None = None  # who made it (RBAC's user name); None = anyone

    def applies(self, verb: str, path: str, is_watch: bool, user: str = "") -> bool:
        if is_watch and not self.watches:
            return False
        if self.users is not None and user not in self.users:
            return False
        if self.verbs is not None and verb.upper() not in self.verbs:
            return False
        return self.path is None or bool(self.path.search(path))


@dataclass
class Faults:
    """Knobs; everything off by default.

    >>> cluster.faults.fail_requests(0.3, code=500, verbs=["GET"], path=r"/pods")
    >>> cluster.faults.drop_watches(after_events=3)
    >>> cluster.faults.silence_watches(after_events=1, requests=True)
    >>> cluster.faults.duplicate_watch_events()
    >>> cluster.faults.bind_delay = 2.0
    """

    seed: int = 0
    bind_delay: float = 0.0  # seconds the scheduler waits before each bind
    watch_max_events: int | None = None  # close each watch stream after this many events
    watch_max_seconds: float | None = None  # ... or after this many seconds
    watch_duplicates: bool = False  # send every watch event twice in a row
    silence_after_events: int | None = None  # a watch goes silent after this many events
    silence_after_seconds: float | None = None  # ... or after this many seconds
    silence_requests: bool = False  # plain requests get no answer at all
    silence_users: frozenset[str] | None = None  # whose requests go silent; None = anyone's
    rules: list[ErrorRule] = field(default_factory=list)
    injected: int = 0  # how many requests were answered with an injected error
    duplicated: int = 0  # how many watch events were sent a second time

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()

    def fail_requests(
        self,
        rate: float,
        code: int = 500,
        verbs: list[str] | None = None,
        path: str | None = None,
        watches: bool = True,
        users: list[str] | None = None,
    ) -> ErrorRule:
        """Answer a fraction of matching requests with a 5xx Status; returns the rule.
        ``users`` (RBAC user names, such as ``system:serviceaccount:gputap:hub``) limits it
        to their requests."""
        if not 0 <= rate <= 1:
            raise ValueError(f"rate must be within [0, 1], got {rate}")
        rule = ErrorRule(
            rate=rate,
            code=code,
            verbs=frozenset(v.upper() for v in verbs) if verbs else None,
            path=re.compile(path) if path else None,
            watches=watches,
            users=frozenset(users) if users is not None else None,
        )
        with self._lock:
            self.rules.append(rule)
        return rule

    def drop_watches(
        self, after_events: int | None = None, after_seconds: float | None = None
    ) -> None:
        """Close every watch stream after N events or T seconds, whichever comes first."""
        self.watch_max_events = after_events
        self.watch_max_seconds = after_seconds

    def silence_watches(
        self,
        after_events: int | None = None,
        after_seconds: float | None = None,
        requests: bool = False,
        users: list[str] | None = None,
    ) -> None:
        """Let every watch stream go silent after N events or T seconds (whichever comes
        first; neither given: at once), streams already open included: the connection stays
        open, nothing more is sent and nothing closes, as when a NAT or load balancer between
        client and server forgot the connection without a reset. With ``requests`` every
        plain request is left unanswered too. Only the client giving up ends such a request
        (or the server shutting down); :meth:`clear` lets new requests through again.
        ``users`` (RBAC user names) limits the silence to their streams and requests, as when
        only one client's connection broke."""
        if after_events is None and after_seconds is None:
            after_events = 0
        self.silence_after_events = after_events
        self.silence_after_seconds = after_seconds
        self.silence_requests = requests
        self.silence_users = frozenset(users) if users is not None else None

    def silences(self, user: str) -> bool:
        """Whether a silence set by :meth:`silence_watches` is ``user``'s."""
        return self.silence_users is None or user in self.silence_users

    def watch_silent(self, sent: int, elapsed: float, user: str = "") -> bool:
        """Whether a watch stream of ``user`` that has sent ``sent`` events over ``elapsed``
        seconds has gone silent."""
        events, seconds = self.silence_after_events, self.silence_after_seconds
        if not self.silences(user):
            return False
        return (events is not None and sent >= events) or (
            seconds is not None and elapsed >= seconds
        )

    def duplicate_watch_events(self, enabled: bool = True) -> None:
        """Send every watch event twice in a row, as an at-least-once delivery would: a
        watcher must apply each event idempotently."""
        self.watch_duplicates = enabled

    def count_duplicate(self) -> None:
        with self._lock:
            self.duplicated += 1

    def reseed(self, seed: int) -> None:
        with self._lock:
            self.seed = seed
            self._rng = random.Random(seed)

    def clear(self) -> None:
        """Turn every fault off."""
        with self._lock:
            self.rules.clear()
        self.bind_delay = 0.0
        self.watch_max_events = None
        self.watch_max_seconds = None
        self.watch_duplicates = False
        self.silence_after_events = None
        self.silence_after_seconds = None
        self.silence_requests = False
        self.silence_users = None

    def decide(self, verb: str, path: str, is_watch: bool = False, user: str = "") -> int | None:
        """The status code to fail this request of ``user`` with, or None to serve it."""
        with self._lock:
            for rule in self.rules:
                if rule.applies(verb, path, is_watch, user) and self._rng.random() < rule.rate:
                    self.injected += 1
                    return rule.code
        return None

    @staticmethod
    def status_body(code: int) -> dict:
        """The Status body sent with an injected error, shaped like the real server's."""
        reason = _REASONS.get(code, "InternalError")
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"an error on the server (simulated fault, {reason}) has prevented the "
            "request from succeeding",
            "reason": reason,
            "details": {"retryAfterSeconds": 1, "causes": [{"reason": "SimulatedFault"}]},
            "code": code,
        }
