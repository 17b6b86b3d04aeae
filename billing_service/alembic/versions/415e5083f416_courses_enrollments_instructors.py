"""Courses, their instructors and students, admin-made instructors, failed join attempts;
sessions.fallback and holds.course.

Revision ID: 415e5083f416
Revises: 49dfbfe8619e
Create Date: 2026-11-29 21:33:47.530686
"""

import sqlalchemy as sa
from alembic import op

from billing_service.orm import UTCDateTime

# revision identifiers, used by Alembic.
revision = "415e5083f416"
down_revision = "49dfbfe8619e"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "courses",
        sa.Column("slug", sa.String(length=63), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("weekly_seconds", sa.Integer(), nullable=False),
        sa.Column("allowed", sa.Text(), nullable=False),
        sa.Column("max_concurrent_gpus", sa.Integer(), nullable=False),
        sa.Column("budget_cap_micro", sa.BigInteger(), nullable=True),
        sa.Column("github_team", sa.String(length=140), nullable=True),
        sa.Column("join_code", sa.String(length=64), nullable=True),
        sa.Column("reset_weekday", sa.Integer(), nullable=False),
        sa.Column("reset_time", sa.String(length=5), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=False),
        sa.Column("created_by", sa.String(length=255), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("archived_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("slug", name=op.f("pk_courses")),
        sa.UniqueConstraint("join_code", name=op.f("uq_courses_join_code")),
    )
    with op.batch_alter_table("courses", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_courses_github_team"), ["github_team"], unique=False)

    op.create_table(
        "instructors",
        sa.Column("username", sa.String(length=255), nullable=False),
        sa.Column("granted_by", sa.String(length=255), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("username", name=op.f("pk_instructors")),
    )
    op.create_table(
        "join_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("username", sa.String(length=255), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_join_attempts")),
    )
    with op.batch_alter_table("join_attempts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_join_attempts_username"), ["username"], unique=False)

    op.create_table(
        "course_instructors",
        sa.Column("course", sa.String(length=63), nullable=False),
        sa.Column("username", sa.String(length=255), nullable=False),
        sa.ForeignKeyConstraint(
            ["course"], ["courses.slug"], name=op.f("fk_course_instructors_course_courses")
        ),
        sa.PrimaryKeyConstraint("course", "username", name=op.f("pk_course_instructors")),
    )
    op.create_table(
        "enrollments",
        sa.Column("course", sa.String(length=63), nullable=False),
        sa.Column("username", sa.String(length=255), nullable=False),
        sa.Column("source", sa.String(length=32), nullable=False),
        sa.Column("fallback", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["course"], ["courses.slug"], name=op.f("fk_enrollments_course_courses")
        ),
        sa.PrimaryKeyConstraint("course", "username", name=op.f("pk_enrollments")),
    )
    # plain ADD COLUMN (SQLite supports it): a batch copy of sessions would have to drop a
    # table that ledger_transactions refers to
    op.add_column(
        "holds", sa.Column("course", sa.String(length=255), nullable=False, server_default="")
    )
    op.add_column(
        "sessions",
        sa.Column("fallback", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    # DROP COLUMN: native on PostgreSQL and on SQLite >= 3.35 (no table copy)
    op.execute("ALTER TABLE sessions DROP COLUMN fallback")
    op.execute("ALTER TABLE holds DROP COLUMN course")

    op.drop_table("enrollments")
    op.drop_table("course_instructors")
    with op.batch_alter_table("join_attempts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_join_attempts_username"))

    op.drop_table("join_attempts")
    op.drop_table("instructors")
    with op.batch_alter_table("courses", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_courses_github_team"))

    op.drop_table("courses")
