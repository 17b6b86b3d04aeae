"""The ``billing:`` settings section, checked once at start-up.

Keys, types, ranges and defaults are the settings schema's
(``gputap_common/settings/schema.yaml``); here are the conversions billing needs (exact
micro-credits, the price book) and the rules that tie two keys together.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from gputap_common.settings import Settings, load_settings, validated

from .domain.money import parse_credits
from .domain.pricing import PriceBook, make_price_book


@dataclass(frozen=True)
class BillingConfig:
    database_url: str
    currency: str
    trial_credit_micro: int
    min_billable_seconds: int
    enforce_interval_seconds: float
    reconcile_interval_seconds: float
    price_book: PriceBook
    charge_interval_seconds: int
    charge_batch_size: int
    charge_workers: int
    hold_seconds: int
    #: thresholds of the "credit runs out soon" warnings, in seconds, largest first
    warning_seconds: tuple[int, ...]
    max_overrun_seconds: int
    kubeconfig: str
    meter_seen_interval_seconds: float
    meter_start_grace_seconds: float
    #: the hub's environments (the keys of its environments settings) a course may pin
    environments: frozenset[str] = frozenset()


def billing_config(section: Mapping[str, object]) -> BillingConfig:
    """Check ``billing:`` settings; ``ValueError`` (a ``SettingsError``) names the key and
    what it needs."""
    billing = validated("billing", section)
    url = billing["database_url"]
    if billing["charge_workers"] > 1 and url.startswith("sqlite"):
        raise ValueError(
            "billing.charge_workers above 1 needs PostgreSQL: SQLite takes one writer at a time"
        )
    interval, overrun = billing["enforce_interval_seconds"], billing["max_overrun_seconds"]
    if interval >= overrun:
        raise ValueError(
            f"billing.enforce_interval_seconds ({interval}) must be shorter than "
            f"billing.max_overrun_seconds ({overrun}): a stop is decided once per interval"
        )
    return BillingConfig(
        database_url=url,
        currency=billing["currency"],
        trial_credit_micro=parse_credits(billing["trial_credit"], "billing.trial_credit"),
        min_billable_seconds=billing["min_billable_seconds"],
        enforce_interval_seconds=float(interval),
        reconcile_interval_seconds=float(billing["reconcile_interval_seconds"]),
        kubeconfig=billing["kubeconfig"],
        meter_seen_interval_seconds=float(billing["meter_seen_interval_seconds"]),
        meter_start_grace_seconds=float(billing["meter_start_grace_seconds"]),
        price_book=make_price_book(
            billing["prices"], billing["spot_discount_percent"], billing["shared_percent"]
        ),
        charge_interval_seconds=billing["charge_interval_seconds"],
        charge_batch_size=billing["charge_batch_size"],
        charge_workers=billing["charge_workers"],
        hold_seconds=billing["hold_seconds"],
        warning_seconds=tuple(
            sorted({round(m * 60) for m in billing["warning_minutes"]}, reverse=True)
        ),
        max_overrun_seconds=overrun,
    )


def load_billing_settings(
    path: str | os.PathLike[str] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """gputap's settings as billing keeps them: without the ``hub`` section, which billing
    never reads and which holds GitHub's client secret and the hub's service tokens. The
    hub gives a managed billing a file without it; billing run by the operator may be handed
    the whole file and environment, so it drops the section itself."""
    settings = load_settings(path, environ)
    raw = {key: value for key, value in settings.raw.items() if key != "hub"}
    return Settings(raw=raw, source=settings.source)


def load_billing_config() -> BillingConfig:
    """The billing configuration from gputap's settings (GPUTAP_SETTINGS, GPUTAP__BILLING__*)."""
    settings = load_billing_settings()
    config = billing_config(settings.billing)
    return dataclasses.replace(config, environments=frozenset(settings.environments))
