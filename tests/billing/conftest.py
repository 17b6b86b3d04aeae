import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import psycopg
import pytest
from sqlalchemy.engine import make_url

from billing_service.domain.money import parse_credits
from billing_service.domain.pricing import make_price_book
from billing_service.migrate import open_database
from billing_service.store import Store
from gputap_common.settings import load_settings

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)

# the server the PostgreSQL tests make their databases on; unreachable means failed, not skipped
POSTGRES_URL = os.environ.get(
    "GPUTAP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def _admin_connection() -> psycopg.Connection:
    url = make_url(POSTGRES_URL)
    return psycopg.connect(
        host=url.host,
        port=url.port or 5432,
        user=url.username,
        password=url.password,
        dbname=url.database or "postgres",
        autocommit=True,
        connect_timeout=5,
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    """An empty billing database of each kind: a SQLite file, a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/db/billing.sqlite"
        return
    with fresh_postgres_database("gputap_billing_test") as url:
        yield url


@contextmanager
def fresh_postgres_database(prefix: str) -> Iterator[str]:
    """The URL of a new PostgreSQL database on POSTGRES_URL's server, dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with _admin_connection() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with _admin_connection() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
