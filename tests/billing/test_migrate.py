"""The billing schema under Alembic: created at start-up, refused when stale, upgraded on demand."""

import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url

from billing_service.domain.courses import course_rules
from billing_service.migrate import (
    BASELINE,
    SchemaMismatch,
    _config,
    head_revision,
    open_database,
    upgrade_database,
)
from billing_service.orm import Base, make_engine

from .conftest import T0, make_store, store_on

ROOT = Path(__file__).resolve().parents[2]
HEAD = head_revision()


def schema_diff(engine) -> list:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return compare_metadata(context, Base.metadata)


def revision(engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def with_password(url: str) -> str:
    """The URL with a password: PostgreSQL's trust auth ignores it, so it must never be shown."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return url
    return parsed.set(password="s3cret").render_as_string(hide_password=False)


def v1_database(url: str) -> None:
    """A database as v1 made it: v1's tables (those of the baseline revision), no
    alembic_version."""
    engine = make_engine(url)
    with engine.begin() as connection:
        command.upgrade(_config(connection), BASELINE)
        connection.execute(text("DROP TABLE alembic_version"))
    engine.dispose()


def run_module(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    settings = tmp_path / "settings.yaml"
    body = {"data_dir": str(tmp_path), "billing": {"database_url": url}}
    settings.write_text(yaml.safe_dump(body))
    return subprocess.run(
        [sys.executable, "-m", "billing_service", *args],
        cwd=ROOT,
        env={"GPUTAP_SETTINGS": str(settings), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_empty_database_is_migrated_to_head_and_usable(database_url):
    store = make_store(database_url)
    try:
        assert revision(store.engine) == HEAD
        assert schema_diff(store.engine) == []
        state, created = store.open_account("ada", T0)
        assert created and state.balance_micro == 10_000_000
    finally:
        store.engine.dispose()
    # a second start finds it at head and keeps the rows
    store = make_store(database_url)
    assert store.account("ada", T0).balance_micro == 10_000_000
    store.engine.dispose()


def test_v1_database_is_refused_with_the_command(database_url):
    v1_database(database_url)
    url = with_password(database_url)
    with pytest.raises(SchemaMismatch) as refused:
        open_database(url)
    shown = make_url(url).render_as_string(hide_password=True)
    assert str(refused.value) == (
        f"Billing database {shown} is at schema revision none (billing tables without an "
        f"alembic_version table), this billing_service expects {HEAD}. "
        "Back up the database, then run: python -m billing_service upgrade-db"
    )
    assert "s3cret" not in str(refused.value)


def test_unknown_revision_is_refused(database_url):
    make_store(database_url).engine.dispose()
    engine = make_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = 'ffffffffffff'"))
    with pytest.raises(SchemaMismatch, match="ffffffffffff, which this billing_service does not"):
        open_database(database_url)
    with pytest.raises(SchemaMismatch, match="cannot be upgraded by this version"):
        upgrade_database(engine)
    engine.dispose()


def test_upgrade_db_carries_v1_rows_into_the_double_entry_ledger(database_url):
    v1_database(database_url)
    engine = make_engine(database_url)
    naive = T0.replace(tzinfo=None)
    with engine.begin() as connection:
        connection.execute(
            text("INSERT INTO accounts (id, username, created_at) VALUES (1, 'ada', :t)"),
            {"t": naive},
        )
        connection.execute(
            text(
                "INSERT INTO sessions (id, account_id, username, server_name, sku, count, "
                "price_per_hour_micro, price_class, started_at, ended_at, billed_seconds, "
                "cost_micro) VALUES ('s1', 1, 'ada', '', 'RTX-4090', 1, 5000000, 'on-demand', "
                ":t, :t, 10800, 15000000), ('s2', 1, 'ada', 'x', 'T4', 1, 1500000, "
                "'on-demand', :t, NULL, NULL, NULL)"
            ),
            {"t": naive},
        )
        connection.execute(
            text(
                "INSERT INTO ledger_entries (account_id, kind, amount_micro, session_id, "
                "idempotency_key, memo, created_at) VALUES "
                "(1, 'trial', 10000000, NULL, 'trial:ada', 'trial credit', :t), "
                "(1, 'adjustment', 7000000, NULL, 'adjustment:k1', 'top up', :t), "
                "(1, 'charge', -15000000, 's1', 'charge:s1', '', :t)"
            ),
            {"t": naive},
        )
    with pytest.raises(SchemaMismatch, match="upgrade-db"):
        open_database(database_url)

    said = upgrade_database(engine)
    assert said.startswith("Recorded the billing database") and HEAD in said
    assert upgrade_database(engine).endswith(f"already at revision {HEAD}; nothing to do.")
    engine.dispose()
    store = make_store(database_url)
    state = store.account("ada", T0)
    assert state.balance_micro == 2_000_000
    # the charge took the trial credit first, then 5.00 of the paid credit
    assert state.pools == {"user:ada:trial": 0, "user:ada:paid": 2_000_000}
    txs = store.transactions("ada")
    assert [(t.kind, t.idempotency_key) for t in txs] == [
        ("trial", "trial:ada"),
        ("adjustment", "grant:k1"),
        ("charge", "charge:s1:final"),
    ]
    assert [s.charged_micro for s in store.sessions("ada")] == [0, 15_000_000]
    assert store.check_ledger() == []
    # a replayed client key still answers with the carried-over grant
    assert store.adjust("ada", 7_000_000, "top up", "k1", T0)[1] is False
    store.engine.dispose()


def test_v1_database_without_price_class_is_not_stamped(database_url):
    v1_database(database_url)
    engine = make_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("ALTER TABLE sessions DROP COLUMN price_class"))
    with pytest.raises(SchemaMismatch, match="lacks sessions.price_class"):
        upgrade_database(engine)
    assert "alembic_version" not in inspect(engine).get_table_names()
    engine.dispose()


def test_upgrade_db_command_and_refused_start(database_url, tmp_path):
    v1_database(database_url)
    engine = make_engine(database_url)
    with engine.begin() as connection:
        connection.execute(
            text("INSERT INTO accounts (username, created_at) VALUES ('ada', :t)"),
            {"t": T0.replace(tzinfo=None)},
        )
    engine.dispose()

    started = run_module(database_url, tmp_path)
    assert started.returncode == 1
    assert "Back up the database, then run: python -m billing_service upgrade-db" in started.stderr

    upgraded = run_module(database_url, tmp_path, "upgrade-db")
    assert upgraded.returncode == 0, upgraded.stderr
    assert upgraded.stdout.strip() == (
        f"Recorded the billing database {make_url(database_url).render_as_string()} "
        f"(made before migrations) at revision {BASELINE}. Upgraded the billing database "
        f"{make_url(database_url).render_as_string()} from revision {BASELINE} to {HEAD}."
    )
    store = make_store(database_url)
    assert store.account("ada", T0).balance_micro == 0
    store.engine.dispose()


def test_migrations_round_trip(database_url):
    engine = open_database(database_url)
    with engine.begin() as connection:
        command.downgrade(_config(connection), "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    assert revision(engine) is None
    with engine.begin() as connection:
        command.upgrade(_config(connection), "head")
    assert revision(engine) == HEAD and schema_diff(engine) == []
    engine.dispose()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_concurrent_start_and_stop_settle_once(database_url):
    stores = [make_store(database_url) for _ in range(2)]
    rounds = 20
    try:
        for n in range(rounds):
            start_and_stop_at_once(stores, f"s{n}", f"user{n}")
        assert len(stores[0].sessions(None)) == rounds
    finally:
        for store in stores:
            store.engine.dispose()


def start_and_stop_at_once(stores, session_id: str, user: str) -> None:
    """Both stores start a new user's session, then stop it, each pair at the same instant."""
    started = race(
        stores, lambda s, _: s.start_session(session_id, user, "", "RTX-4090", 1, T0, T0)
    )
    assert sorted(created for _, created in started) == [False, True]
    assert started[0][0] == started[1][0]
    # different end times: whichever settles first is the answer both get
    stopped = race(stores, lambda s, i: s.stop_session(session_id, T0 + timedelta(hours=1 + i), T0))
    assert stopped[0] == stopped[1]
    assert len(stores[1].sessions(user)) == 1
    txs = stores[0].transactions(user)
    assert [t.kind for t in txs] == ["trial", "charge"]
    assert txs[1].amount_micro == -stopped[0].cost_micro
    assert stores[0].check_ledger() == []


def race(stores, call):
    """``call(store, i)`` for each store on its own thread, released together; their results."""
    barrier = threading.Barrier(len(stores))
    results: list = [None] * len(stores)
    errors: list = []

    def run(i):
        barrier.wait()
        try:
            results[i] = call(stores[i], i)
        except Exception as e:  # the assertion below shows it
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    return results


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_two_replicas_charging_at_once_never_double_charge(database_url):
    """Both replicas run every charge pass at the same instant, then both stop every
    session at once: each session is charged exactly its cost, once per key."""
    stores = [make_store(database_url) for _ in range(2)]
    try:
        for n in range(40):
            stores[n % 2].start_session(f"r{n}", f"u{n % 7}", f"s{n}", "RTX-4090", 1, T0, T0)
        for k in range(1, 4):
            now = T0 + timedelta(seconds=30 * k + 5)
            posted = race(stores, lambda s, _, now=now: s.post_interval_charges(now, 30, 7))
            assert sum(posted) == 40  # each session charged once per pass, by one replica
        # and one replica with three worker threads: each session once more, by one of them
        assert stores[0].post_interval_charges(T0 + timedelta(seconds=125), 30, 3, workers=3) == 40
        end = T0 + timedelta(seconds=130)
        race(stores, lambda s, _: [s.stop_session(f"r{n}", end, end) for n in range(40)])
        sessions = stores[0].sessions(None)
        assert {(s.billed_seconds, s.cost_micro, s.charged_micro) for s in sessions} == {
            (130, 180_555, 180_555)
        }
        with stores[0].engine.connect() as db:
            keys = db.exec_driver_sql(
                "SELECT idempotency_key FROM ledger_transactions WHERE kind = 'charge'"
            ).scalars()
            assert sorted(keys) == sorted(
                f"charge:r{n}:{k}" for n in range(40) for k in (1, 2, 3, 4, "final")
            )
        assert stores[0].check_ledger() == []
    finally:
        for store in stores:
            store.engine.dispose()


#: the columns revisions e6b3d9a1c254 and a7d4c2e9f153 add to sessions and courses, which
#: the store writes
SESSION_ENVIRONMENT = "ALTER TABLE sessions ADD COLUMN environment VARCHAR(300) NOT NULL DEFAULT ''"
COURSE_ENVIRONMENT = "ALTER TABLE courses ADD COLUMN environment VARCHAR(63) NOT NULL DEFAULT ''"
SESSION_WORKER = "ALTER TABLE sessions ADD COLUMN worker VARCHAR(8) NOT NULL DEFAULT ''"
COURSE_MAX_WORKERS = "ALTER TABLE courses ADD COLUMN max_workers INTEGER NOT NULL DEFAULT 0"


def test_revenue_moves_into_shards_and_back_with_its_postings(database_url):
    """The revision before revenue shards wrote every charge to ``system:revenue``: upgrading
    makes it shard 0 beside seven empty ones, downgrading puts every shard's postings and
    balance back onto one account; the books balance throughout."""
    before = "7c3e5a9b2d14"
    engine = make_engine(database_url)
    with engine.begin() as connection:
        command.upgrade(_config(connection), before)
        # this code writes the column a later revision adds to sessions: here for it alone
        connection.execute(text(SESSION_ENVIRONMENT))
        connection.execute(text(SESSION_WORKER))
    # this code on that revision's tables: open_database would refuse them, rightly
    store = store_on(engine)
    store.start_session("s1", "ada", "", "RTX-4090", 1, T0, T0)
    store.stop_session("s1", T0 + timedelta(hours=1), T0)  # 5.00 of revenue
    with store.engine.begin() as db:  # as that revision wrote it: one revenue account
        db.execute(
            text(
                "UPDATE ledger_accounts SET code = 'system:revenue' "
                "WHERE code LIKE 'system:revenue:%' AND balance_micro <> 0"
            )
        )
        db.execute(text("DELETE FROM ledger_accounts WHERE code LIKE 'system:revenue:%'"))
        db.execute(text("ALTER TABLE sessions DROP COLUMN environment"))
        db.execute(text("ALTER TABLE sessions DROP COLUMN worker"))

    upgrade_database(engine)
    engine.dispose()
    store = make_store(database_url)
    assert store.revenue_micro() == 5_000_000 and store.check_ledger() == []
    with store.engine.connect() as db:
        codes = db.execute(
            text("SELECT code, balance_micro FROM ledger_accounts WHERE code LIKE 'system:rev%'")
        ).all()
    assert sorted(codes) == [("system:revenue:0", 5_000_000)] + [
        (f"system:revenue:{k}", 0) for k in range(1, 8)
    ]
    # charges land in several shards; revenue is their sum
    for n in range(2, 10):
        store.start_session(f"s{n}", "ada", f"n{n}", "cpu", 1, T0, T0)
        store.stop_session(f"s{n}", T0 + timedelta(hours=1), T0)
    with store.engine.connect() as db:
        used = db.scalar(
            text(
                "SELECT COUNT(*) FROM ledger_accounts "
                "WHERE code LIKE 'system:revenue:%' AND balance_micro <> 0"
            )
        )
    assert used > 1
    assert store.revenue_micro() == 5_000_000 + 8 * 100_000 and store.check_ledger() == []
    store.engine.dispose()

    with engine.begin() as connection:
        command.downgrade(_config(connection), before)
    with engine.connect() as db:
        [(balance, posted)] = db.execute(
            text(
                "SELECT a.balance_micro, SUM(p.amount_micro) FROM ledger_accounts a "
                "JOIN ledger_postings p ON p.ledger_account_id = a.id "
                "WHERE a.code = 'system:revenue' GROUP BY a.id, a.balance_micro"
            )
        ).all()
        shards = db.scalar(
            text("SELECT COUNT(*) FROM ledger_accounts WHERE code LIKE 'system:revenue:%'")
        )
    assert balance == posted == 5_800_000 and shards == 0
    upgrade_database(engine)
    assert schema_diff(engine) == []
    engine.dispose()


def test_course_teams_stored_as_typed_come_out_in_lower_case(database_url):
    """Before d2a8f4c61b07 a course's github_team was stored as typed, and a mixed-case one
    never matched the hub's lower-case groups."""
    engine = make_engine(database_url)
    with engine.begin() as connection:
        command.upgrade(_config(connection), "b5e1c7d93a02")
        connection.execute(text(COURSE_ENVIRONMENT))  # what this code writes, for it alone
        connection.execute(text(COURSE_MAX_WORKERS))
    store = store_on(engine)
    skus = {"T4"}
    bound = course_rules({"name": "DL", "allowed": ["T4"], "github_team": "acme:dl"}, skus)
    store.create_course("prof", bound, "dl", T0, join_code=False)
    store.create_course("prof", course_rules({"name": "X", "allowed": ["T4"]}, skus), "x", T0,
                        join_code=False)  # fmt: skip
    with store.engine.begin() as db:  # as that revision let it be written
        db.execute(text("UPDATE courses SET github_team = 'Acme:DL-2025' WHERE slug = 'dl'"))
        db.execute(text("ALTER TABLE courses DROP COLUMN environment"))
        db.execute(text("ALTER TABLE courses DROP COLUMN max_workers"))
    upgrade_database(engine)
    with engine.connect() as db:
        teams = dict(db.execute(text("SELECT slug, github_team FROM courses")).all())
    assert teams == {"dl": "acme:dl-2025", "x": None}


def test_sessions_and_courses_before_scale_out_are_servers_and_forbid_it(database_url):
    """Before a7d4c2e9f153 every session was a server's own and no course let its servers
    scale out: upgrading gives them worker "" and max_workers 0; downgrading drops both."""
    engine = make_engine(database_url)
    with engine.begin() as connection:
        command.upgrade(_config(connection), "e6b3d9a1c254")
        connection.execute(text(SESSION_WORKER))  # what this code writes, for it alone
        connection.execute(text(COURSE_MAX_WORKERS))
    store = store_on(engine)
    store.start_session("s1", "ada", "", "RTX-4090", 1, T0, T0)
    store.create_course("prof", course_rules({"name": "DL", "allowed": ["T4"]}, {"T4"}), "dl", T0,
                        join_code=False)  # fmt: skip
    with store.engine.begin() as db:  # as that revision wrote them
        db.execute(text("ALTER TABLE sessions DROP COLUMN worker"))
        db.execute(text("ALTER TABLE courses DROP COLUMN max_workers"))
    upgrade_database(engine)
    assert schema_diff(engine) == []
    with engine.connect() as db:
        assert db.execute(text("SELECT id, worker FROM sessions")).all() == [("s1", "")]
        assert db.execute(text("SELECT slug, max_workers FROM courses")).all() == [("dl", 0)]
    with engine.begin() as connection:
        command.downgrade(_config(connection), "e6b3d9a1c254")
    columns = {c["name"] for c in inspect(engine).get_columns("sessions")}
    assert "worker" not in columns and "environment" in columns
    engine.dispose()
