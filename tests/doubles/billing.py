"""An in-process billing as the hub's client sees it (spawner/lifecycle/billing_client.py:
BillingClient's admit, release_hold, start_session, stop_session), as strict as the service:
a session opens only on a hold of the same id, a hold is released once (then 404), a session
stops only if it opened (else 404). ``down`` makes every call BillingUnavailable; ``refuse``
makes admission say no with that status. Prices are the shipped settings' price book, as the
service answers them (a SKU without a price is left out)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from billing_service.domain.pricing import PRICE_CLASSES, make_price_book
from gputap_common.settings import load_settings
from spawner.core.record import ServerRecord
from spawner.lifecycle.billing_client import BillingRefused, BillingUnavailable


class BillingDouble:
    def __init__(self) -> None:
        self.holds: set[str] = set()
        self.sessions: dict[str, datetime | None] = {}  # id -> ended_at (None: open)
        self.down = False
        self.refuse: int | None = None
        billing = load_settings(environ={}).billing
        self.book = make_price_book(
            billing["prices"], billing["spot_discount_percent"], billing["shared_percent"]
        )

    def _up(self) -> None:
        if self.down:
            raise BillingUnavailable("billing unreachable: Connection refused")

    async def price_book(
        self, skus: list[str], price_class: str = "on-demand"
    ) -> tuple[dict[str, int], int]:
        self._up()
        if price_class not in PRICE_CLASSES:
            raise BillingRefused(400, f"price_class must be one of {PRICE_CLASSES}")
        prices, _unpriced = self.book.lookup(skus, price_class)
        return prices, self.book.spot_discount_percent

    async def admit(self, username: str, record: ServerRecord) -> dict[str, Any]:
        self._up()
        if self.refuse is not None:
            raise BillingRefused(self.refuse, "Your credit does not cover the first minutes.")
        self.holds.add(record.session_id)
        return {"hold_id": record.session_id}

    async def release_hold(self, hold_id: str) -> dict[str, Any]:
        self._up()
        if hold_id not in self.holds:
            raise BillingRefused(404, f"no hold {hold_id}")
        self.holds.discard(hold_id)
        return {"released": hold_id}

    async def start_session(self, user: str, server: str, record: ServerRecord) -> dict:
        self._up()
        if record.session_id not in self.holds:
            raise BillingRefused(409, "a session opens only on its admission's hold")
        self.holds.discard(record.session_id)
        self.sessions[record.session_id] = None
        return {"id": record.session_id}

    async def stop_session(self, session_id: str, ended_at: datetime) -> dict[str, Any]:
        self._up()
        if session_id not in self.sessions:
            raise BillingRefused(404, f"no session {session_id}")
        self.sessions[session_id] = self.sessions[session_id] or ended_at
        return {"billed_seconds": 0}
