"""Billing tables.

Double entry: every movement of credit is a ``LedgerTransaction`` whose ``Posting`` rows sum
to zero over ``LedgerAccount`` rows (a user's funding pools and the system counter-accounts).
A user's balance is the sum of their pools' balances.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Engine,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    create_engine,
    event,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from .domain.pricing import ON_DEMAND

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
    #: every time column is UTCDateTime (nullable when the annotation is ``datetime | None``)
    type_annotation_map = {datetime: UTCDateTime}


class IntegerKey:
    """The surrogate primary key ``id`` of the tables whose rows no other system names."""

    id: Mapped[int] = mapped_column(Integer, primary_key=True, sort_order=-1)


class Account(IntegerKey, Base):
    __tablename__ = "accounts"

    username: Mapped[str] = mapped_column(String(255), unique=True)
    created_at: Mapped[datetime]


class LedgerAccount(IntegerKey, Base):
    """One side of double entry: a user's funding pool, or a system counter-account.

    Codes: ``user:{username}:trial``, ``user:{username}:paid``,
    ``user:{username}:allowance:{course}`` (pools of the customer ``account_id``), and
    ``system:{name}`` (``account_id`` null): where grants come from and charges go to.
    ``balance_micro`` is kept in the same transaction as every posting; the ledger check
    proves it equals the sum of the account's postings.
    """

    __tablename__ = "ledger_accounts"

    code: Mapped[str] = mapped_column(String(255), unique=True)
    account_id: Mapped[int | None] = mapped_column(
        ForeignKey("accounts.id"), nullable=True, index=True
    )
    pool: Mapped[str] = mapped_column(String(32))  # trial | paid | allowance | system
    course: Mapped[str] = mapped_column(String(255), default="")
    balance_micro: Mapped[int] = mapped_column(BigInteger, default=0)


class BillingSession(Base):
    """One metered server run, or one run of a worker of a server's group (``worker``
    ``wK``; "" for the server itself). The price is fixed here when it starts.

    ``charged_micro`` is what its charge transactions have taken so far (interval charges
    while it runs, the final one at stop); ``last_seen_at`` is the last time billing saw its
    server running (the end of a session whose server vanished unseen).
    """

    __tablename__ = "sessions"
    __table_args__ = (
        # the open sessions in id order: what every charge batch reads, without walking the
        # ended ones or sorting all open ones
        Index(
            "ix_sessions_open",
            "id",
            postgresql_where=text("ended_at IS NULL"),
            sqlite_where=text("ended_at IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(255), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    username: Mapped[str] = mapped_column(String(255), index=True)
    server_name: Mapped[str] = mapped_column(String(255), default="")
    sku: Mapped[str] = mapped_column(String(255))
    count: Mapped[int] = mapped_column(Integer)
    price_per_hour_micro: Mapped[int] = mapped_column(BigInteger)
    price_class: Mapped[str] = mapped_column(String(32), default=ON_DEMAND)
    started_at: Mapped[datetime]
    ended_at: Mapped[datetime | None] = mapped_column(index=True)
    billed_seconds: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cost_micro: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    charged_micro: Mapped[int] = mapped_column(BigInteger, default=0)
    last_seen_at: Mapped[datetime | None]
    course: Mapped[str] = mapped_column(String(255), default="")
    #: a course session may go on on the student's own credit when course hours run out
    fallback: Mapped[bool] = mapped_column(Boolean, default=False)
    price_book_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: the environment its server ran (the spawner's key, or ``image:`` and a free-text image)
    environment: Mapped[str] = mapped_column(String(300), default="", server_default="")
    #: the scale-out worker (``wK``) of ``server_name`` this session meters, "" for the server
    worker: Mapped[str] = mapped_column(String(8), default="", server_default="")


class LedgerTransaction(IntegerKey, Base):
    """One movement of credit: postings that sum to zero, written once per idempotency key.

    Kinds: ``trial``, ``topup``, ``allowance``, ``refund``, ``adjustment`` (funding) and
    ``charge`` (a session's interval ``charge:{session}:{k}`` or its final
    ``charge:{session}:final``).
    """

    __tablename__ = "ledger_transactions"

    idempotency_key: Mapped[str] = mapped_column(String(255), unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    account_id: Mapped[int | None] = mapped_column(
        ForeignKey("accounts.id"), nullable=True, index=True
    )
    session_id: Mapped[str | None] = mapped_column(
        ForeignKey("sessions.id"), nullable=True, index=True
    )
    memo: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[datetime] = mapped_column(index=True)


class Posting(IntegerKey, Base):
    """A signed amount on one ledger account, part of one transaction."""

    __tablename__ = "ledger_postings"

    transaction_id: Mapped[int] = mapped_column(ForeignKey("ledger_transactions.id"), index=True)
    ledger_account_id: Mapped[int] = mapped_column(ForeignKey("ledger_accounts.id"), index=True)
    amount_micro: Mapped[int] = mapped_column(BigInteger)


class Hold(Base):
    """Credit set aside by an admission until its server starts, fails, or the hold expires."""

    __tablename__ = "holds"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    account_id: Mapped[int] = mapped_column(ForeignKey("accounts.id"), index=True)
    sku: Mapped[str] = mapped_column(String(255))
    count: Mapped[int] = mapped_column(Integer)
    price_class: Mapped[str] = mapped_column(String(32))
    amount_micro: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    released_at: Mapped[datetime | None] = mapped_column(index=True)
    release_reason: Mapped[str] = mapped_column(String(32), default="")
    session_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    course: Mapped[str] = mapped_column(String(255), default="")


class PriceBookVersion(Base):
    """A published price book; a session is priced by the newest one not younger than it."""

    __tablename__ = "price_books"

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    created_at: Mapped[datetime]
    created_by: Mapped[str] = mapped_column(String(255))
    source: Mapped[str] = mapped_column(String(32))  # settings | admin
    book: Mapped[str] = mapped_column(Text)  # JSON: prices, spot_discount_percent, shared_percent


class Course(Base):
    """A course's rules (see courses.py); ``allowed`` is a JSON list of offering keys."""

    __tablename__ = "courses"

    slug: Mapped[str] = mapped_column(String(63), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    weekly_seconds: Mapped[int] = mapped_column(Integer)
    allowed: Mapped[str] = mapped_column(Text)
    max_concurrent_gpus: Mapped[int] = mapped_column(Integer)
    budget_cap_micro: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    github_team: Mapped[str | None] = mapped_column(String(140), nullable=True, index=True)
    join_code: Mapped[str | None] = mapped_column(String(64), nullable=True, unique=True)
    reset_weekday: Mapped[int] = mapped_column(Integer)
    reset_time: Mapped[str] = mapped_column(String(5))
    timezone: Mapped[str] = mapped_column(String(64))
    #: the environment its students' servers run (the hub's key), "" for none pinned
    environment: Mapped[str] = mapped_column(String(63), default="", server_default="")
    #: workers a student's server may scale out to (per server); 0 forbids scale-out
    max_workers: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_by: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime]
    archived_at: Mapped[datetime | None]


class CourseInstructor(Base):
    __tablename__ = "course_instructors"

    course: Mapped[str] = mapped_column(ForeignKey("courses.slug"), primary_key=True)
    username: Mapped[str] = mapped_column(String(255), primary_key=True)


class Enrollment(Base):
    """A student of a course; ``fallback``: their own credit pays when course hours run out."""

    __tablename__ = "enrollments"

    course: Mapped[str] = mapped_column(ForeignKey("courses.slug"), primary_key=True)
    username: Mapped[str] = mapped_column(String(255), primary_key=True)
    source: Mapped[str] = mapped_column(String(32))  # team | code | instructor
    fallback: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime]


class Instructor(Base):
    """A user an admin made an instructor (instructors by GitHub team come from the hub)."""

    __tablename__ = "instructors"

    username: Mapped[str] = mapped_column(String(255), primary_key=True)
    granted_by: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime]


class JoinAttempt(IntegerKey, Base):
    """A join-code attempt that failed; too many in a window and joining is refused a while."""

    __tablename__ = "join_attempts"

    username: Mapped[str] = mapped_column(String(255), index=True)
    created_at: Mapped[datetime]


class SessionPod(Base):
    """The Kubernetes pod a metered session runs in, recorded by the pod meter (kube_meter).

    Written when the meter first sees the pod's container started, before it starts the
    session, so a session the meter started always names its pod. No foreign key on
    ``session_id``: the row may be written an instant before its session (a crash in between
    leaves a row without a session, which nothing reads). The pod's uid tells, after a
    restart, whether the pod still exists, and finds its ``Killing`` event when it does not.
    """

    __tablename__ = "session_pods"

    session_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(253))
    pod_name: Mapped[str] = mapped_column(String(253))
    pod_uid: Mapped[str] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime]


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
