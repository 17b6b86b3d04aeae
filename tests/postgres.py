"""Throwaway PostgreSQL databases on the test server (127.0.0.1:5432, user postgres, trust),
for the billing store's tests and the billing benchmark."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy.engine import make_url

POSTGRES_URL = os.environ.get(
    "GPUTAP_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def admin_connection() -> psycopg.Connection:
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


@contextmanager
def fresh_postgres_database(prefix: str) -> Iterator[str]:
    """The URL of a new PostgreSQL database on POSTGRES_URL's server, dropped afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with admin_connection() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin_connection() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
