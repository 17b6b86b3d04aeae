from datetime import UTC, datetime

import pytest

from billing_service.domain.money import parse_credits
from billing_service.domain.pricing import make_price_book
from billing_service.migrate import open_database
from billing_service.store import Store
from gputap_common.settings import load_settings
from tests.postgres import fresh_postgres_database

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


# the server the PostgreSQL tests make their databases on; unreachable means failed, not skipped
@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    """An empty billing database of each kind: a SQLite file, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/db/billing.sqlite"
        return
    with fresh_postgres_database("gputap_billing_test") as url:
        yield url


def make_store(database_url, prices=None, trial="10.00", min_billable_seconds=300) -> Store:
    prices = prices or load_settings(environ={}).billing["prices"]
    return Store(
        open_database(database_url),
        make_price_book(prices),
        trial_credit_micro=parse_credits(trial),
        min_billable_seconds=min_billable_seconds,
    )


@pytest.fixture
def store(database_url):
    store = make_store(database_url)
    yield store
    store.engine.dispose()
