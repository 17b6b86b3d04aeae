"""Money arithmetic: integer micro-credits, never floats.

1 credit = 1_000_000 micro-credits. Amounts enter as decimal strings ("6.666667") or
integers, and are stored as integers; they leave as text through the one exact formatter,
:func:`gputap_common.money.format_credits` ("6.666667").
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from gputap_common.bodies import shown
from gputap_common.money import MICRO

#: a billion credits: beyond any real amount, and far inside a 64-bit column
MAX_MICRO = 10**9 * MICRO
SECONDS_PER_HOUR = 3600

# Bounds on what a session may be, so that whatever the API accepts, its cost fits the
# signed 64-bit (BIGINT) money columns: MAX_PRICE_MICRO x MAX_COUNT x the hours from
# EARLIEST_TIME to LATEST_TIME is 8.77e18 micro-credits, under 2**63 (9.22e18).
#: the most one unit of a SKU may cost per hour: 10,000 credits
MAX_PRICE_MICRO = 10**4 * MICRO
#: the most units (GPUs, slices) one server may hold
MAX_COUNT = 1000
#: the times billing accepts, from callers and in queries
EARLIEST_TIME = datetime(2000, 1, 1, tzinfo=UTC)
LATEST_TIME = datetime(2100, 1, 1, tzinfo=UTC)


#: the one notation of an amount: an optional minus, digits, optionally a point and digits
#: ("12", "12.5", "-3.25"); no exponent, sign "+", spaces, separators, hex, NaN or Infinity
DECIMAL = re.compile(r"-?[0-9]+(\.[0-9]+)?")


def parse_credits(value: object, field: str = "amount") -> int:
    """Micro-credits from a decimal string or a JSON number; ``ValueError`` names ``field``.

    One notation is accepted (:data:`DECIMAL`, docs/security.md), as a string or a number:
    a number goes through its shortest repr (YAML and JSON ``1.5`` mean "1.5", never binary
    math), so ``1e3``, NaN and Infinity are refused as their strings are. At most six
    decimals: anything finer cannot be stored exactly.
    """
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f'{field} must be a decimal string like "9.50", not {shown(value)}')
    text = value if isinstance(value, str) else repr(value)
    if isinstance(value, float) and text.endswith(".0"):
        text = text[:-2]  # 12.0 is "12"
    if not DECIMAL.fullmatch(text):
        raise ValueError(
            f'{field} must be a decimal number like "9.50" or 9.5 (digits, an optional point '
            f"and minus; no exponent, sign +, spaces or separators), not {shown(value)}"
        )
    micro = Decimal(text) * MICRO
    if micro != micro.to_integral_value():
        raise ValueError(f"{field} has more than 6 decimals: {shown(value)}")
    if abs(micro) > MAX_MICRO:
        raise ValueError(
            f"{field} must be at most {MAX_MICRO // MICRO} credits, not {shown(value)}"
        )
    return int(micro)


def billed_seconds(started_at: datetime, ended_at: datetime) -> int:
    """Whole seconds between two aware datetimes; partial seconds are not charged."""
    if ended_at < started_at:
        raise ValueError(f"ended_at {ended_at.isoformat()} is before started_at")
    return (ended_at - started_at) // timedelta(seconds=1)


def cost_micro(price_per_hour_micro: int, count: int, seconds: int) -> int:
    """floor(price x count x seconds / 3600) micro-credits."""
    return price_per_hour_micro * count * seconds // SECONDS_PER_HOUR


def seconds_covered(available_micro: int, rate_per_hour_micro: int) -> int | None:
    """How many whole seconds ``available_micro`` pays at ``rate_per_hour_micro``.

    None when nothing is charged (rate 0); 0 when nothing is available.
    """
    if rate_per_hour_micro <= 0:
        return None
    if available_micro <= 0:
        return 0
    return available_micro * SECONDS_PER_HOUR // rate_per_hour_micro


def format_duration(seconds: int) -> str:
    """Human duration for messages: "5 minutes", "90 seconds", "2 hours"."""
    if seconds % 3600 == 0 and seconds >= 3600:
        hours = seconds // 3600
        return f"{hours} hour{'s' if hours != 1 else ''}"
    if seconds % 60 == 0 and seconds >= 60:
        minutes = seconds // 60
        return f"{minutes} minute{'s' if minutes != 1 else ''}"
    return f"{seconds} second{'s' if seconds != 1 else ''}"
