from datetime import UTC, datetime, timedelta

import pytest

from billing_service.domain.money import (
    EARLIEST_TIME,
    LATEST_TIME,
    MAX_COUNT,
    MAX_PRICE_MICRO,
    billed_seconds,
    cost_micro,
    format_duration,
    parse_credits,
    seconds_covered,
)
from gputap_common.money import format_credits

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    "value, micro",
    [
        ("6.666667", 6_666_667),
        ("10.00", 10_000_000),
        ("-9.99", -9_990_000),
        (5, 5_000_000),
        (1.5, 1_500_000),
        ("0.1", 100_000),
        (12.0, 12_000_000),
    ],
)
def test_parse_credits(value, micro):
    assert parse_credits(value) == micro


@pytest.mark.parametrize(
    "value",
    # one notation (docs/security.md): no exponent, hex, spaces, separators, sign + or
    # non-finite numbers, as strings or as numbers
    ["abc", "1.0000001", "NaN", "inf", None, True, [1], "", " 0.1 ", "1e3", "0x10", "12,5"]
    + ["+1", "1_0", ".5", "5.", "Infinity", float("nan"), float("inf"), 1e-07, 1e30],
)
def test_parse_credits_refuses_with_field_name(value):
    with pytest.raises(ValueError, match="amount"):
        parse_credits(value, "amount")


@pytest.mark.parametrize(
    "micro, text",
    [
        (6_666_667, "6.666667"),
        (1_142_857, "1.142857"),
        (-9_990_000, "-9.99"),
        (5_000, "0.005"),
        (0, "0.00"),
        (10_000_000, "10.00"),
        (-1, "-0.000001"),
    ],
)
def test_format_credits(micro, text):
    assert format_credits(micro) == text


def test_rtx4090_two_hours_cost_exactly_ten():
    price = parse_credits("5.00")
    seconds = billed_seconds(T0, T0 + timedelta(seconds=7200))
    assert cost_micro(price, 1, seconds) == 10_000_000


def test_a100_40gb_ninety_minutes_cost_ten_floored():
    price = parse_credits("6.666667")
    # 6_666_667 * 5400 / 3600 = 10_000_000.5 -> floor
    assert cost_micro(price, 1, 5400) == 10_000_000


def test_partial_seconds_are_not_charged():
    assert billed_seconds(T0, T0 + timedelta(seconds=59, milliseconds=999)) == 59
    assert cost_micro(3_600_000, 2, 59) == 118_000


def test_billed_seconds_refuses_end_before_start():
    with pytest.raises(ValueError, match="before"):
        billed_seconds(T0, T0 - timedelta(seconds=1))


def test_seconds_covered():
    assert seconds_covered(1_000_000, 3_600_000) == 1000
    assert seconds_covered(-5, 3_600_000) == 0
    assert seconds_covered(5, 0) is None


def test_format_duration():
    assert format_duration(300) == "5 minutes"
    assert format_duration(60) == "1 minute"
    assert format_duration(7200) == "2 hours"
    assert format_duration(90) == "90 seconds"


def test_absurd_amounts_are_refused():
    with pytest.raises(ValueError, match="at most 1000000000 credits"):
        parse_credits("1000000000.000001")


def test_the_dearest_session_billing_accepts_fits_a_bigint():
    # what the API lets through: the top price, the most units, from the first to the last time
    seconds = billed_seconds(EARLIEST_TIME, LATEST_TIME)
    assert cost_micro(MAX_PRICE_MICRO, MAX_COUNT, seconds) < 2**63
