"""What the store's writes need beyond the database and the caller's arguments."""

from __future__ import annotations

from dataclasses import dataclass

from ..domain.pricing import PriceBook
from .postings import RevenueShards


@dataclass(frozen=True)
class Terms:
    """The settings a :class:`~billing_service.store.Store` was made with, and the ids of the
    revenue shards it has looked up (shared by every transaction of that store)."""

    #: the settings' price book, in force until a version is recorded
    price_book: PriceBook
    #: credit a new account opens with
    trial_credit_micro: int
    #: the period a spawn must be able to pay for, and a young server keeps claiming
    min_billable_seconds: int
    #: how long an admission's hold claims credit unless its server starts
    hold_seconds: int
    revenue: RevenueShards
