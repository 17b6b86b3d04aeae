"""Double-entry ledger, holds, versioned price books, metered sessions.

``ledger_entries`` (one signed row per movement) becomes ``ledger_transactions`` with
``ledger_postings`` that sum to zero over ``ledger_accounts`` (users' pools and system
counter-accounts). Every v1 entry is carried over under its idempotency key: a trial grant
credits the trial pool from ``system:trial-grants``, an adjustment the paid pool from
``system:adjustments``, and a charge (now ``charge:{session}:final``) takes from the trial pool,
then the paid pool, into ``system:revenue``. Adjustment keys ``adjustment:K`` become
``grant:K``, the one namespace of client keys for every kind of grant.

Revision ID: 49dfbfe8619e
Revises: 4f2a9c1d7e30
Create Date: 2026-11-29 20:56:06
"""

import sqlalchemy as sa
from alembic import op

from billing_service.orm import UTCDateTime

# revision identifiers, used by Alembic.
revision = "49dfbfe8619e"
down_revision = "4f2a9c1d7e30"
branch_labels = None
depends_on = None

SYSTEM = {"trial": "system:trial-grants", "adjustment": "system:adjustments"}
REVENUE = "system:revenue"


def upgrade() -> None:
    op.create_table(
        "price_books",
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("created_by", sa.String(length=255), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("book", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("version", name=op.f("pk_price_books")),
    )
    op.create_table(
        "holds",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("sku", sa.String(length=255), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("price_class", sa.String(length=32), nullable=False),
        sa.Column("amount_micro", sa.BigInteger(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("released_at", UTCDateTime(), nullable=True),
        sa.Column("release_reason", sa.String(length=32), nullable=False),
        sa.Column("session_id", sa.String(length=255), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_holds_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_holds")),
    )
    op.create_index(op.f("ix_holds_account_id"), "holds", ["account_id"])
    op.create_index(op.f("ix_holds_released_at"), "holds", ["released_at"])
    op.create_table(
        "ledger_accounts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("code", sa.String(length=255), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=True),
        sa.Column("pool", sa.String(length=32), nullable=False),
        sa.Column("course", sa.String(length=255), nullable=False),
        sa.Column("balance_micro", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name=op.f("fk_ledger_accounts_account_id_accounts")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_accounts")),
        sa.UniqueConstraint("code", name=op.f("uq_ledger_accounts_code")),
    )
    op.create_index(op.f("ix_ledger_accounts_account_id"), "ledger_accounts", ["account_id"])
    op.create_table(
        "ledger_transactions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=True),
        sa.Column("session_id", sa.String(length=255), nullable=True),
        sa.Column("memo", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(length=255), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name=op.f("fk_ledger_transactions_account_id_accounts"),
        ),
        sa.ForeignKeyConstraint(
            ["session_id"],
            ["sessions.id"],
            name=op.f("fk_ledger_transactions_session_id_sessions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_transactions")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_ledger_transactions_idempotency_key")),
    )
    for column in ("account_id", "created_at", "session_id"):
        op.create_index(op.f(f"ix_ledger_transactions_{column}"), "ledger_transactions", [column])
    op.create_table(
        "ledger_postings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("transaction_id", sa.Integer(), nullable=False),
        sa.Column("ledger_account_id", sa.Integer(), nullable=False),
        sa.Column("amount_micro", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["ledger_account_id"],
            ["ledger_accounts.id"],
            name=op.f("fk_ledger_postings_ledger_account_id_ledger_accounts"),
        ),
        sa.ForeignKeyConstraint(
            ["transaction_id"],
            ["ledger_transactions.id"],
            name=op.f("fk_ledger_postings_transaction_id_ledger_transactions"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_ledger_postings")),
    )
    op.create_index(
        op.f("ix_ledger_postings_ledger_account_id"), "ledger_postings", ["ledger_account_id"]
    )
    op.create_index(
        op.f("ix_ledger_postings_transaction_id"), "ledger_postings", ["transaction_id"]
    )
    with op.batch_alter_table("sessions") as batch_op:
        batch_op.add_column(
            sa.Column("charged_micro", sa.BigInteger(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("last_seen_at", UTCDateTime(), nullable=True))
        batch_op.add_column(
            sa.Column("course", sa.String(length=255), nullable=False, server_default="")
        )
        batch_op.add_column(sa.Column("price_book_version", sa.Integer(), nullable=True))
    _carry_entries_over(op.get_bind())
    op.drop_index("ix_ledger_entries_account_id", table_name="ledger_entries")
    op.drop_table("ledger_entries")


def _carry_entries_over(bind: sa.Connection) -> None:
    """Every v1 entry as a balanced transaction (see the module docstring)."""
    meta = sa.MetaData()
    meta.reflect(bind, only=("accounts", "ledger_entries", "sessions"))
    accounts = {row.id: row.username for row in bind.execute(sa.select(meta.tables["accounts"]))}
    ledger = sa.table(
        "ledger_accounts",
        sa.column("id"),
        sa.column("code"),
        sa.column("account_id"),
        sa.column("pool"),
        sa.column("course"),
        sa.column("balance_micro"),
    )
    balances: dict[str, int] = {}
    ids: dict[str, int] = {}

    def ledger_id(code: str, account_id: int | None, pool: str) -> int:
        if code not in ids:
            result = bind.execute(
                ledger.insert()
                .values(code=code, account_id=account_id, pool=pool, course="", balance_micro=0)
                .returning(ledger.c.id)
            )
            ids[code] = result.scalar_one()
            balances[code] = 0
        return ids[code]

    txs = sa.table(
        "ledger_transactions",
        sa.column("id"),
        sa.column("idempotency_key"),
        sa.column("kind"),
        sa.column("account_id"),
        sa.column("session_id"),
        sa.column("memo"),
        sa.column("created_by"),
        sa.column("created_at"),
    )
    postings = sa.table(
        "ledger_postings",
        sa.column("transaction_id"),
        sa.column("ledger_account_id"),
        sa.column("amount_micro"),
    )
    entries = meta.tables["ledger_entries"]
    sessions = meta.tables["sessions"]
    for entry in bind.execute(sa.select(entries).order_by(entries.c.id)).all():
        # as ledger.pool_code escapes names (frozen here, like the rest of the migration)
        user = accounts[entry.account_id].replace("%", "%25").replace(":", "%3A")
        key = entry.idempotency_key
        moves: list[tuple[str, int | None, str, int]] = []
        if entry.kind == "charge":
            key = f"{key}:final"
            cost = -entry.amount_micro
            trial = f"user:{user}:trial"
            ledger_id(trial, entry.account_id, "trial")
            from_trial = min(cost, max(balances[trial], 0))
            moves = [
                (trial, entry.account_id, "trial", -from_trial),
                (f"user:{user}:paid", entry.account_id, "paid", -(cost - from_trial)),
                (REVENUE, None, "system", cost),
            ]
        else:
            if entry.kind == "adjustment":  # client keys share one namespace with other grants
                key = "grant:" + key.removeprefix("adjustment:")
            pool = "trial" if entry.kind == "trial" else "paid"
            moves = [
                (f"user:{user}:{pool}", entry.account_id, pool, entry.amount_micro),
                (SYSTEM.get(entry.kind, SYSTEM["adjustment"]), None, "system", -entry.amount_micro),
            ]
        result = bind.execute(
            txs.insert()
            .values(
                idempotency_key=key,
                kind=entry.kind,
                account_id=entry.account_id,
                session_id=entry.session_id,
                memo=entry.memo,
                created_by="",
                created_at=entry.created_at,
            )
            .returning(txs.c.id)
        )
        tx_id = result.scalar_one()
        for code, account_id, pool, amount in moves:
            bind.execute(
                postings.insert().values(
                    transaction_id=tx_id,
                    ledger_account_id=ledger_id(code, account_id, pool),
                    amount_micro=amount,
                )
            )
            balances[code] += amount
    for code, balance in balances.items():
        bind.execute(ledger.update().where(ledger.c.code == code).values(balance_micro=balance))
    bind.execute(
        sessions.update()
        .where(sessions.c.cost_micro.is_not(None))
        .values(charged_micro=sessions.c.cost_micro)
    )


def downgrade() -> None:
    op.create_table(
        "ledger_entries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("amount_micro", sa.BigInteger(), nullable=False),
        sa.Column("session_id", sa.String(length=255), nullable=True),
        sa.Column("idempotency_key", sa.String(length=255), nullable=False),
        sa.Column("memo", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["account_id"], ["accounts.id"], name="fk_ledger_entries_account_id_accounts"
        ),
        sa.ForeignKeyConstraint(
            ["session_id"], ["sessions.id"], name="fk_ledger_entries_session_id_sessions"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_ledger_entries"),
        sa.UniqueConstraint("idempotency_key", name="uq_ledger_entries_idempotency_key"),
    )
    op.create_index("ix_ledger_entries_account_id", "ledger_entries", ["account_id"])
    # one entry per funding transaction, one per session for all its charges (v1's shape)
    op.execute(
        """
        INSERT INTO ledger_entries (account_id, kind, amount_micro, session_id,
                                    idempotency_key, memo, created_at)
        SELECT t.account_id, CASE WHEN t.kind = 'trial' THEN 'trial' ELSE 'adjustment' END,
               SUM(p.amount_micro), NULL,
               CASE WHEN t.kind = 'trial' THEN t.idempotency_key
                    ELSE 'adjustment:' || substr(t.idempotency_key, 7) END,
               t.memo, t.created_at
        FROM ledger_transactions t
        JOIN ledger_postings p ON p.transaction_id = t.id
        JOIN ledger_accounts a ON a.id = p.ledger_account_id AND a.account_id IS NOT NULL
        WHERE t.kind <> 'charge'
        GROUP BY t.id, t.account_id, t.kind, t.idempotency_key, t.memo, t.created_at
        """
    )
    op.execute(
        """
        INSERT INTO ledger_entries (account_id, kind, amount_micro, session_id,
                                    idempotency_key, memo, created_at)
        SELECT t.account_id, 'charge', SUM(p.amount_micro), t.session_id,
               'charge:' || t.session_id, '', MAX(t.created_at)
        FROM ledger_transactions t
        JOIN ledger_postings p ON p.transaction_id = t.id
        JOIN ledger_accounts a ON a.id = p.ledger_account_id AND a.account_id IS NOT NULL
        WHERE t.kind = 'charge'
        GROUP BY t.account_id, t.session_id
        """
    )
    with op.batch_alter_table("sessions") as batch_op:
        batch_op.drop_column("price_book_version")
        batch_op.drop_column("course")
        batch_op.drop_column("last_seen_at")
        batch_op.drop_column("charged_micro")
    op.drop_index(op.f("ix_ledger_postings_transaction_id"), table_name="ledger_postings")
    op.drop_index(op.f("ix_ledger_postings_ledger_account_id"), table_name="ledger_postings")
    op.drop_table("ledger_postings")
    for column in ("account_id", "created_at", "session_id"):
        op.drop_index(op.f(f"ix_ledger_transactions_{column}"), table_name="ledger_transactions")
    op.drop_table("ledger_transactions")
    op.drop_index(op.f("ix_ledger_accounts_account_id"), table_name="ledger_accounts")
    op.drop_table("ledger_accounts")
    op.drop_index(op.f("ix_holds_released_at"), table_name="holds")
    op.drop_index(op.f("ix_holds_account_id"), table_name="holds")
    op.drop_table("holds")
    op.drop_table("price_books")
