"""Billing tables.

The balance of an account is the sum of its ledger entries; there is no mutable balance
column, so a later double-entry ledger (counter-accounts, holds) only adds rows and tables.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import (
    BigInteger,
    DateTime,
    Engine,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    create_engine,
    event,
)
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Stable constraint names, so migrations can address them (as in jupyterhub/orm.py).
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator):
    """Stores UTC without tzinfo and returns aware UTC datetimes.

    SQLite has no timezone type; on PostgreSQL the column is ``timestamp without time zone``
    too, holding naive UTC, so both databases store the same values and one migration fits
    both (a ``timestamptz`` would also depend on the connection's TimeZone when read raw).
    """

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: billing times must be timezone-aware")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Account(Base):
    __tablename__ = "accounts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    username: Mapped[str] = mapped_column(String(255), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class LedgerEntry(Base):
    """One signed movement of credit. ``idempotency_key`` makes every write replay-safe."""

    __tablename__ = "ledger_entries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    kind: Mapped[str] = mapped_column(String(32))  # trial | adjustment | charge
    amount_micro: Mapped[int] = mapped_column(BigInteger)
    session_id: Mapped[str | None] = mapped_column(ForeignKey("sessions.id"), nullable=True)
    idempotency_key: Mapped[str] = mapped_column(String(255), unique=True)
    memo: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class BillingSession(Base):
    """One metered server run. The price is fixed here when it starts."""

    __tablename__ = "sessions"

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    username: Mapped[str] = mapped_column(String(255), index=True)
    server_name: Mapped[str] = mapped_column(String(255), default="")
    sku: Mapped[str] = mapped_column(String(255))
    count: Mapped[int] = mapped_column(Integer)
    price_per_hour_micro: Mapped[int] = mapped_column(BigInteger)
    price_class: Mapped[str] = mapped_column(String(32), default="on-demand")
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True, index=True)
    billed_seconds: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cost_micro: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


def make_engine(url: str) -> Engine:
    """Engine for ``url``; a SQLite file's folder is created too.

    It creates no tables: ``migrate.open_database`` brings the schema to the migrations' head
    or refuses a database at another revision.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(url)

        @event.listens_for(engine, "connect")
        def _foreign_keys(dbapi_connection, _record):
            dbapi_connection.execute("PRAGMA foreign_keys=ON")

    else:
        # a database server may close idle connections (restarts, proxies); test before use
        engine = create_engine(url, pool_pre_ping=True)
    return engine
