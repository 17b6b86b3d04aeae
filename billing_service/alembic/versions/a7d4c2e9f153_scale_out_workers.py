"""Scale-out: the worker a session meters (``sessions.worker``, "" for a server's own
session) and how many workers a course's servers may have (``courses.max_workers``, 0: none).

Revision ID: a7d4c2e9f153
Revises: e6b3d9a1c254
Create Date: 2026-12-10 12:00:00
"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "a7d4c2e9f153"
down_revision = "e6b3d9a1c254"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # every session before scale-out was a server's own
    op.add_column(
        "sessions",
        sa.Column("worker", sa.String(length=8), nullable=False, server_default=""),
    )
    # courses made before scale-out forbid it until an instructor allows it
    op.add_column(
        "courses",
        sa.Column("max_workers", sa.Integer(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    # not batch_alter_table: its copy of sessions would break the ledger's foreign keys
    # (SQLite drops a column itself since 3.35)
    op.drop_column("courses", "max_workers")
    op.drop_column("sessions", "worker")
