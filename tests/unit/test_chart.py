"""The GPU-hours chart's arithmetic (billing_service/handlers/chart.py): round ticks that
cover the busiest day, bars to scale, values and dates as the page writes them."""

from datetime import date

import pytest

from billing_service.handlers.chart import axis_ticks, chart_view, day_text, hours_text


@pytest.mark.parametrize(
    ("top", "ticks"),
    [
        (2.0, [0, 0.5, 1, 1.5, 2]),
        (7, [0, 2, 4, 6, 8]),
        (0, [0, 0.25, 0.5, 0.75, 1]),
        (1.1, [0, 0.5, 1, 1.5]),
        (37, [0, 10, 20, 30, 40]),
        (0.3, [0, 0.1, 0.2, 0.3]),
    ],
)
def test_ticks_are_round_and_cover_the_top(top, ticks):
    assert axis_ticks(top) == ticks


@pytest.mark.parametrize("top", [0.004, 0.5, 0.9, 3.3, 12, 99.5, 168, 1234])
def test_ticks_never_exceed_five_and_always_cover(top):
    ticks = axis_ticks(top)
    assert 3 <= len(ticks) <= 5 and ticks[0] == 0 and ticks[-1] >= top


def test_values_and_days_read_as_the_page_shows_them():
    assert hours_text(0) == "0"
    assert hours_text(10) == "< 0.01"
    assert hours_text(5400) == "1.50"
    assert day_text(date(2026, 7, 14)) == "Tue 14 Jul"


def test_bars_share_one_scale_and_the_summary_names_the_busiest_day():
    days = [
        {"day": "2026-07-13", "gpu_seconds": 0},
        {"day": "2026-07-14", "gpu_seconds": 7200},
        {"day": "2026-07-15", "gpu_seconds": 1800},
    ]
    view = chart_view(days)
    assert [r["percent"] for r in view["rows"]] == [0, 100, 25]
    assert [t["text"] for t in view["ticks"]] == ["0", "0.5", "1", "1.5", "2"]
    assert view["summary"] == "2.50 GPU-hours in the last 3 days; most on Tue 14 Jul (2.00)."
    assert chart_view([{"day": "2026-07-13", "gpu_seconds": 0}])["summary"] == "No GPU use today."
