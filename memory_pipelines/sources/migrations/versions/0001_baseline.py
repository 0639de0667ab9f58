"""baseline: every table of a memory home's SQL database

Revision ID: 0001_baseline
Revises:
"""

from alembic import op

from memory_pipelines.sources.tables import metadata

revision = "0001_baseline"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    # the tables a database lacks, at their current shape (a home from before the
    # revisions is stamped here instead: its tables are there)
    metadata.create_all(op.get_bind())


def downgrade() -> None:
    raise NotImplementedError("the schema is not downgraded: restore a backup instead")
