"""Course GitHub teams in lower case, as the hub's groups are.

A course's ``github_team`` was stored as typed; the hub's groups (one per GitHub team) are
lower-case ``org:team-slug``, so a course bound to ``Acme:DL-2025`` never matched anyone. New
courses are stored normalised (gputap_common.github_names); this brings the stored ones in line.
Downgrade leaves them in lower case (the case typed is not kept anywhere, and is not needed).

Revision ID: d2a8f4c61b07
Revises: b5e1c7d93a02
Create Date: 2026-12-01 17:00:00
"""

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision = "d2a8f4c61b07"
down_revision = "b5e1c7d93a02"
branch_labels = None
depends_on = None

courses = sa.table("courses", sa.column("github_team", sa.String))


def upgrade() -> None:
    op.execute(
        courses.update()
        .where(courses.c.github_team.is_not(None))
        .values(github_team=sa.func.lower(sa.func.trim(courses.c.github_team)))
    )


def downgrade() -> None:
    pass
