"""Alembic environment of the billing database; configured by billing_service.migrate."""

from alembic import context

from billing_service.orm import Base, make_engine

config = context.config
target_metadata = Base.metadata


def run_migrations(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most constraints; batch mode rebuilds the table instead
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Print the SQL (``--sql``) instead of running it."""
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    # migrate.py passes its open connection, so a check and an upgrade share one transaction
    connection = config.attributes.get("connection")
    if connection is not None:
        run_migrations(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url"))
    try:
        with engine.begin() as connection:
            run_migrations(connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
