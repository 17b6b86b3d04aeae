"""Schema migrations of the billing database (Alembic, configured here, no alembic.ini).

At start-up ``open_database`` creates an empty database by running every migration and
refuses any database whose schema is not at the newest revision; ``upgrade_database`` (behind
``python -m billing_service upgrade-db``) is the one thing that changes an existing schema.
``python -m billing_service.migrate ARGS`` runs the ``alembic`` command line on the configured
database, e.g. ``revision --autogenerate -m "add holds"``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from alembic import command
from alembic.config import CommandLine, Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect

from .orm import Base, make_engine

log = logging.getLogger("billing")

SCRIPT_LOCATION = Path(__file__).with_name("alembic")
UPGRADE_COMMAND = "python -m billing_service upgrade-db"
# the revision whose tables are those v1 made with create_all (before there were migrations)
BASELINE = "4f2a9c1d7e30"


class SchemaMismatch(RuntimeError):
    """The database schema is not the one this billing_service needs; the message says why."""


def alembic_config(url: str, connection: Connection | None = None) -> Config:
    """Alembic configuration for the database at ``url``, optionally on an open connection."""
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    # configparser interpolates %, which URL-quoted passwords contain
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision among the migrations shipped with this package."""
    return ScriptDirectory(str(SCRIPT_LOCATION)).get_current_head()


def _config(connection: Connection) -> Config:
    url = connection.engine.url.render_as_string(hide_password=False)
    return alembic_config(url, connection)


def _display(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def _state(connection: Connection) -> tuple[str | None, bool]:
    """(stored revision, whether any billing table exists)."""
    tables = set(inspect(connection).get_table_names())
    revision = MigrationContext.configure(connection).get_current_revision()
    return revision, bool(tables & set(Base.metadata.tables))


def _known(revision: str) -> bool:
    try:
        return ScriptDirectory(str(SCRIPT_LOCATION)).get_revision(revision) is not None
    except Exception:  # alembic raises its own errors for unknown or ambiguous ids
        return False


def check_schema(engine: Engine) -> str:
    """Migrate an empty database to head; return head when the schema is there.

    ``SchemaMismatch`` for any other state, naming the database (without password), the
    revision found and needed, and what to do.
    """
    head = head_revision()
    with engine.begin() as connection:
        found, has_tables = _state(connection)
        if not has_tables and found is None:
            command.upgrade(_config(connection), "head")
            log.info("Created billing database %s at revision %s", _display(engine), head)
            return head
    if found == head:
        return head
    where = f"Billing database {_display(engine)}"
    if found is not None and not _known(found):
        raise SchemaMismatch(
            f"{where} is at schema revision {found}, which this billing_service does not know "
            f"(it expects {head}); it was probably written by a newer gputap. Run that version, "
            f"or restore a backup; `{UPGRADE_COMMAND}` cannot downgrade it."
        )
    shown = found or "none (billing tables without an alembic_version table)"
    raise SchemaMismatch(
        f"{where} is at schema revision {shown}, this billing_service expects {head}. "
        f"Back up the database, then run: {UPGRADE_COMMAND}"
    )


#: the tables and columns of the baseline revision (frozen, like the migration that made them)
BASELINE_COLUMNS = {
    "accounts": ("id", "username", "created_at"),
    "sessions": (
        "id",
        "account_id",
        "username",
        "server_name",
        "sku",
        "count",
        "price_per_hour_micro",
        "price_class",
        "started_at",
        "ended_at",
        "billed_seconds",
        "cost_micro",
    ),
    "ledger_entries": (
        "id",
        "account_id",
        "kind",
        "amount_micro",
        "session_id",
        "idempotency_key",
        "memo",
        "created_at",
    ),
}


def _missing_baseline_columns(connection: Connection) -> list[str]:
    inspector = inspect(connection)
    missing = []
    for name, columns in BASELINE_COLUMNS.items():
        present = set()
        if inspector.has_table(name):
            present = {column["name"] for column in inspector.get_columns(name)}
        missing += [f"{name}.{c}" for c in columns if c not in present]
    return missing


def upgrade_database(engine: Engine) -> str:
    """Bring the schema to head, keeping every row; a sentence saying what was done.

    A database without an ``alembic_version`` table but with billing tables was made by v1's
    create_all: it is stamped at the baseline revision first, if its columns are the baseline's.
    """
    head = head_revision()
    where = f"billing database {_display(engine)}"
    done = []
    with engine.begin() as connection:
        found, has_tables = _state(connection)
        config = _config(connection)
        if found == head:
            return f"The {where} is already at revision {head}; nothing to do."
        if found is not None and not _known(found):
            raise SchemaMismatch(
                f"The {where} is at revision {found}, unknown to this billing_service "
                f"(its newest is {head}); it cannot be upgraded by this version."
            )
        if found is None and has_tables:
            missing = _missing_baseline_columns(connection)
            if missing:
                raise SchemaMismatch(
                    f"The {where} has billing tables but no alembic_version, and lacks "
                    f"{', '.join(missing)}; add them by hand as in migration {BASELINE}, "
                    "then run this again."
                )
            command.stamp(config, BASELINE)
            found = BASELINE
            done.append(f"Recorded the {where} (made before migrations) at revision {BASELINE}.")
        if found != head:
            command.upgrade(config, "head")
            done.append(f"Upgraded the {where} from revision {found or 'empty'} to {head}.")
    for line in done:
        log.info("%s", line)
    return " ".join(done)


def open_database(url: str) -> Engine:
    """Engine for the billing database at ``url`` with its schema at head (see check_schema)."""
    engine = make_engine(url)
    try:
        check_schema(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


def main(argv: list[str] | None = None) -> None:
    """``python -m billing_service.migrate ARGS``: the alembic command line on our database."""
    from .config import load_billing_config

    cli = CommandLine(prog="python -m billing_service.migrate")
    options = cli.parser.parse_args(argv if argv is not None else sys.argv[1:])
    if not hasattr(options, "cmd"):
        cli.parser.error("too few arguments")
    config = alembic_config(load_billing_config().database_url)
    config.cmd_opts = options
    cli.run_cmd(config, options)


if __name__ == "__main__":
    main()
