"""The ``billing:`` settings section, checked once at start-up."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hub_config.settings import load_settings

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
    charge_interval_seconds: int = 30
    charge_batch_size: int = 50
    charge_workers: int = 1
    hold_seconds: int = 900
    #: thresholds of the "credit runs out soon" warnings, in seconds, largest first
    warning_seconds: tuple[int, ...] = (900, 300)
    max_overrun_seconds: int = 30
    kubeconfig: str = ""
    meter_seen_interval_seconds: float = 10.0
    meter_start_grace_seconds: float = 30.0


def _positive_int(
    section: Mapping[str, object], key: str, minimum: int, default: int | None = None
) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"billing.{key} must be an integer >= {minimum}, not {value!r}")
    return value


def _seconds(section: Mapping[str, object], key: str, default: float) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"billing.{key} must be a number of seconds >= 0, not {value!r}")
    return float(value)


def _positive_number(section: Mapping[str, object], key: str, default: float) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"billing.{key} must be a positive number, not {value!r}")
    return float(value)


def _charge_workers(section: Mapping[str, object], url: object) -> int:
    workers = _positive_int(section, "charge_workers", 1, default=1)
    if workers > 1 and isinstance(url, str) and url.startswith("sqlite"):
        raise ValueError(
            "billing.charge_workers above 1 needs PostgreSQL: SQLite takes one writer at a time"
        )
    return workers


def billing_config(section: Mapping[str, object]) -> BillingConfig:
    """Validate ``billing:`` settings; ``ValueError`` names the key and what it needs."""
    trial = parse_credits(section.get("trial_credit", "0"), "billing.trial_credit")
    if trial < 0:
        raise ValueError("billing.trial_credit must not be negative")
    interval = section.get("enforce_interval_seconds")
    if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
        raise ValueError(
            f"billing.enforce_interval_seconds must be a positive number, not {interval!r}"
        )
    charge_interval = _positive_int(section, "charge_interval_seconds", 1, default=30)
    if charge_interval > 60:
        raise ValueError(
            f"billing.charge_interval_seconds must be at most 60, not {charge_interval}: "
            "balances must never be more than a minute behind"
        )
    warnings = section.get("warning_minutes", [15, 5])
    if not isinstance(warnings, list) or not all(
        isinstance(m, int | float) and not isinstance(m, bool) and m > 0 for m in warnings
    ):
        raise ValueError(
            f"billing.warning_minutes must be a list of positive minutes, not {warnings!r}"
        )
    overrun = _positive_int(section, "max_overrun_seconds", 1, default=30)
    if float(interval) >= overrun:
        raise ValueError(
            f"billing.enforce_interval_seconds ({interval}) must be shorter than "
            f"billing.max_overrun_seconds ({overrun}): a stop is decided once per interval"
        )
    kubeconfig = section.get("kubeconfig") or ""
    if not isinstance(kubeconfig, str):
        raise ValueError(f"billing.kubeconfig must be a file path, not {kubeconfig!r}")
    url = section.get("database_url")
    if not isinstance(url, str) or not url:
        raise ValueError("billing.database_url must be an SQLAlchemy URL")
    return BillingConfig(
        database_url=url,
        currency=str(section.get("currency") or "credits"),
        trial_credit_micro=trial,
        min_billable_seconds=_positive_int(section, "min_billable_seconds", 1),
        enforce_interval_seconds=float(interval),
        reconcile_interval_seconds=_positive_number(section, "reconcile_interval_seconds", 30),
        kubeconfig=kubeconfig,
        meter_seen_interval_seconds=_positive_number(section, "meter_seen_interval_seconds", 10),
        meter_start_grace_seconds=_seconds(section, "meter_start_grace_seconds", 30),
        price_book=make_price_book(
            section.get("prices") or {},
            section.get("spot_discount_percent", 60),
            section.get("shared_percent", 25),
        ),
        charge_interval_seconds=charge_interval,
        charge_batch_size=_positive_int(section, "charge_batch_size", 1, default=50),
        charge_workers=_charge_workers(section, url),
        hold_seconds=_positive_int(section, "hold_seconds", 1, default=900),
        warning_seconds=tuple(sorted({round(m * 60) for m in warnings}, reverse=True)),
        max_overrun_seconds=overrun,
    )


def load_billing_config() -> BillingConfig:
    """The billing configuration from gputap's settings (GPUTAP_SETTINGS, GPUTAP__BILLING__*)."""
    return billing_config(load_settings().billing)
