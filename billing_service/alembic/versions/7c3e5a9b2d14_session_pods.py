"""The pod of each session metered on Kubernetes (``session_pods``).

Revision ID: 7c3e5a9b2d14
Revises: 415e5083f416
Create Date: 2026-11-30 09:00:00
"""

import sqlalchemy as sa
from alembic import op

from billing_service.orm import UTCDateTime

# revision identifiers, used by Alembic.
revision = "7c3e5a9b2d14"
down_revision = "415e5083f416"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "session_pods",
        sa.Column("session_id", sa.String(length=255), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("pod_name", sa.String(length=253), nullable=False),
        sa.Column("pod_uid", sa.String(length=64), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", name=op.f("pk_session_pods")),
    )
    op.create_index(op.f("ix_session_pods_pod_uid"), "session_pods", ["pod_uid"])


def downgrade() -> None:
    op.drop_index(op.f("ix_session_pods_pod_uid"), table_name="session_pods")
    op.drop_table("session_pods")
