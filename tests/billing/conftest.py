from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from billing_service.domain.money import parse_credits
from billing_service.domain.pricing import make_price_book
from billing_service.migrate import open_database
from billing_service.store import Store
from gputap_common.settings import load_settings
from tests.postgres import fresh_postgres_database

from .hub import Caller, Hub, start_hub, stop_hub

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
    """A store on the database at ``database_url``, migrated to this code's schema."""
    return store_on(open_database(database_url), prices, trial, min_billable_seconds)


def store_on(engine: Engine, prices=None, trial="10.00", min_billable_seconds=300) -> Store:
    """A store on ``engine`` as it is (the migration tests' older revisions included), with
    the shipped prices unless given others."""
    prices = prices or load_settings(environ={}).billing["prices"]
    return Store(
        engine,
        make_price_book(prices),
        trial_credit_micro=parse_credits(trial),
        min_billable_seconds=min_billable_seconds,
    )


@pytest.fixture
def store(database_url):
    store = make_store(database_url)
    yield store
    store.engine.dispose()


# -- the billing service inside the real platform (hub.py), one per test module ---------------


@pytest.fixture(scope="module")
def hub_billing() -> dict[str, Any]:
    """Billing settings for the module's ``hub`` over hub.py's; a module overrides this
    fixture to set its own."""
    return {}


@pytest.fixture(scope="module")
def hub(request, tmp_path_factory, hub_billing) -> Iterator[Hub]:
    """The platform with billing, started for the module's tests and stopped after them; its
    log, shutdown included, then holds neither automation token."""
    hub = start_hub(
        tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2]), **hub_billing
    )
    yield hub
    stop_hub(hub)
    assert hub.hub_token not in hub.log() and hub.ops_token not in hub.log()


@pytest.fixture(scope="module")
def as_hub(hub) -> Caller:
    """Calls billing as the hub does (its billing scope)."""
    return Caller(hub.billing, hub.hub_token)


@pytest.fixture(scope="module")
def as_ops(hub) -> Caller:
    """Calls billing as a billing admin."""
    return Caller(hub.billing, hub.ops_token)
