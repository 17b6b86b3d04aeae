"""Prometheus metrics of the billing service, on a registry of its own (``GET metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()

RUNNING_SESSIONS = Gauge(
    "gputap_billing_running_sessions",
    "Open (running) billing sessions at the last charge cycle",
    registry=REGISTRY,
)
CHARGES_POSTED = Counter(
    "gputap_billing_charges_posted",
    "Charge transactions posted: interval charges of running sessions and final settlements",
    ["kind"],
    registry=REGISTRY,
)
ENFORCEMENT_STOPS = Counter(
    "gputap_billing_enforcement_stops",
    "Server stops billing asked the hub for because credit ran out",
    registry=REGISTRY,
)
ERRORS = Counter(
    "gputap_billing_errors",
    "Failed background passes and requests answered with a server error",
    ["where"],
    registry=REGISTRY,
)
CYCLE_SECONDS = Histogram(
    "gputap_billing_cycle_seconds",
    "Duration of one background pass",
    ["loop"],
    registry=REGISTRY,
)
