"""Money as users read it. Amounts are integers of micro-credits everywhere; this is the one
way they become text, exact and never rounded, on every page, form, message and API answer."""

from __future__ import annotations

#: micro-credits in one credit
MICRO = 1_000_000


def format_credits(micro: int) -> str:
    """Exact credits, never rounded: two decimals at least, six at most.

    10_000_000 -> "10.00", 9_998_733 -> "9.998733", 1_142_857 -> "1.142857", -5_000 -> "-0.005".
    """
    sign = "-" if micro < 0 else ""
    whole, fraction = divmod(abs(micro), MICRO)
    digits = f"{fraction:06d}".rstrip("0").ljust(2, "0")
    return f"{sign}{whole}.{digits}"
