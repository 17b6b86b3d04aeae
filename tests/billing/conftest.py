from datetime import UTC, datetime

import pytest

from billing_service.money import parse_credits
from billing_service.orm import make_engine
from billing_service.pricing import make_price_book
from billing_service.store import Store
from hub_config.settings import load_settings

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


def make_store(tmp_path, prices=None, trial="10.00", min_billable_seconds=300) -> Store:
    prices = prices or load_settings(environ={}).billing["prices"]
    engine = make_engine(f"sqlite:///{tmp_path}/db/billing.sqlite")
    return Store(
        engine,
        make_price_book(prices),
        trial_credit_micro=parse_credits(trial),
        min_billable_seconds=min_billable_seconds,
    )


@pytest.fixture
def store(tmp_path):
    return make_store(tmp_path)
