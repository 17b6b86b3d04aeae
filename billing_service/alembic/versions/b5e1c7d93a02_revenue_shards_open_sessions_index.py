"""Revenue in shards (``system:revenue:0`` to ``:7``) and an index of the open sessions.

Every charge batch used to update the one ``system:revenue`` row, so concurrent batches
queued on its lock. The old account becomes shard 0 (its postings stay with it) and the other
seven are created empty; revenue is the sum of the shards. Downgrade moves every shard's
postings and balance back onto one ``system:revenue``.

``ix_sessions_open`` indexes the ids of open sessions (partial: ``ended_at IS NULL``), the
order charge batches take them in.

Revision ID: b5e1c7d93a02
Revises: 7c3e5a9b2d14
Create Date: 2026-11-30 12:00:00
"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "b5e1c7d93a02"
down_revision = "7c3e5a9b2d14"
branch_labels = None
depends_on = None

REVENUE = "system:revenue"
#: as in ledger.REVENUE_SHARDS when this migration was written (a migration never follows code)
SHARDS = 8

accounts = sa.table(
    "ledger_accounts",
    sa.column("id", sa.Integer),
    sa.column("code", sa.String),
    sa.column("account_id", sa.Integer),
    sa.column("pool", sa.String),
    sa.column("course", sa.String),
    sa.column("balance_micro", sa.BigInteger),
)
postings = sa.table(
    "ledger_postings",
    sa.column("ledger_account_id", sa.Integer),
    sa.column("amount_micro", sa.BigInteger),
)


def shard(k: int) -> str:
    return f"{REVENUE}:{k}"


def upgrade() -> None:
    op.create_index(
        "ix_sessions_open",
        "sessions",
        ["id"],
        postgresql_where=sa.text("ended_at IS NULL"),
        sqlite_where=sa.text("ended_at IS NULL"),
    )
    op.execute(accounts.update().where(accounts.c.code == REVENUE).values(code=shard(0)))
    bind = op.get_bind()
    present = set(
        bind.execute(
            sa.select(accounts.c.code).where(accounts.c.code.in_([shard(k) for k in range(SHARDS)]))
        ).scalars()
    )
    missing = [
        {"code": shard(k), "account_id": None, "pool": "system", "course": "", "balance_micro": 0}
        for k in range(SHARDS)
        if shard(k) not in present
    ]
    if missing:
        op.bulk_insert(accounts, missing)


def downgrade() -> None:
    bind = op.get_bind()
    shards = dict(
        bind.execute(
            sa.select(accounts.c.code, accounts.c.id).where(accounts.c.code.like(f"{REVENUE}:%"))
        ).all()
    )
    if shards:
        keep = shards.get(shard(0)) or min(shards.values())
        others = [i for i in shards.values() if i != keep]
        total = bind.execute(
            sa.select(sa.func.coalesce(sa.func.sum(accounts.c.balance_micro), 0)).where(
                accounts.c.id.in_(shards.values())
            )
        ).scalar_one()
        if others:
            op.execute(
                postings.update()
                .where(postings.c.ledger_account_id.in_(others))
                .values(ledger_account_id=keep)
            )
            op.execute(accounts.delete().where(accounts.c.id.in_(others)))
        op.execute(
            accounts.update().where(accounts.c.id == keep).values(code=REVENUE, balance_micro=total)
        )
    op.drop_index("ix_sessions_open", table_name="sessions")
