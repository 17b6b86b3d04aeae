"""Environments: the one each session's server ran (``sessions.environment``) and the one a
course pins its students' servers to (``courses.environment``).

Revision ID: e6b3d9a1c254
Revises: d2a8f4c61b07
Create Date: 2026-12-01 23:00:00
"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "e6b3d9a1c254"
down_revision = "d2a8f4c61b07"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # sessions started before environments existed ran gputap's own: "" (shown as such)
    op.add_column(
        "sessions",
        sa.Column("environment", sa.String(length=300), nullable=False, server_default=""),
    )
    # courses made before pins pin none
    op.add_column(
        "courses",
        sa.Column("environment", sa.String(length=63), nullable=False, server_default=""),
    )


def downgrade() -> None:
    # not batch_alter_table: its copy of sessions would break the ledger's foreign keys
    # (SQLite drops a column itself since 3.35)
    op.drop_column("courses", "environment")
    op.drop_column("sessions", "environment")
