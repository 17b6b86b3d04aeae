"""JSON views of billing records, the shapes the REST API answers with."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .money import format_credits, seconds_covered
from .store import AccountState, EntryRecord, SessionRecord


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def session_view(session: SessionRecord, now: datetime) -> dict[str, Any]:
    """A session; a running one shows its seconds and cost so far."""
    cost = session.cost_at(now)
    return {
        "id": session.id,
        "username": session.username,
        "server_name": session.server_name,
        "sku": session.sku,
        "count": session.count,
        "price_per_hour_micro": session.price_per_hour_micro,
        "price_per_hour": format_credits(session.price_per_hour_micro),
        "price_class": session.price_class,
        "started_at": _iso(session.started_at),
        "ended_at": _iso(session.ended_at),
        "billed_seconds": session.seconds_at(now),
        "cost_micro": cost,
        "cost": format_credits(cost),
        "state": "ended" if session.ended_at is not None else "running",
    }


def account_view(state: AccountState, now: datetime, currency: str) -> dict[str, Any]:
    """Balance, what running servers cost so far, and how long the rest lasts."""
    running_cost = state.running_cost_at(now)
    available = state.balance_micro - running_cost
    rate = state.rate_per_hour_micro
    return {
        "username": state.username,
        "currency": currency,
        "created_at": _iso(state.created_at),
        "balance_micro": state.balance_micro,
        "balance": format_credits(state.balance_micro),
        "running_cost_micro": running_cost,
        "running_cost": format_credits(running_cost),
        "available_micro": available,
        "available": format_credits(available),
        "rate_per_hour_micro": rate,
        "rate_per_hour": format_credits(rate),
        "seconds_left": seconds_covered(available, rate),
        "running": [session_view(s, now) for s in state.running],
        "as_of": now.isoformat(),
    }


def entry_view(entry: EntryRecord) -> dict[str, Any]:
    return {
        "id": entry.id,
        "username": entry.username,
        "kind": entry.kind,
        "amount_micro": entry.amount_micro,
        "amount": format_credits(entry.amount_micro),
        "session_id": entry.session_id,
        "idempotency_key": entry.idempotency_key.removeprefix("adjustment:"),
        "memo": entry.memo,
        "created_at": _iso(entry.created_at),
    }
