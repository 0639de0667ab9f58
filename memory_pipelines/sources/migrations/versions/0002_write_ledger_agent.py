"""write_ledger keyed by agent: (agent, run id, key) instead of (run id, key)

Revision ID: 0002_write_ledger_agent
Revises: 0001_baseline
"""

from alembic import op
from sqlalchemy import insert, inspect, select

from memory_pipelines.sources.tables import ledger_agent, write_ledger

revision = "0002_write_ledger_agent"
down_revision = "0001_baseline"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Give a ``write_ledger`` created before the agent column its current shape. Its rows
    are kept, each attributed to the agent of its scope key. A no-op when the column is
    there."""
    conn = op.get_bind()
    columns = {c["name"] for c in inspect(conn).get_columns("write_ledger")}
    if not columns or "agent_id" in columns:
        return
    kept = [c for c in write_ledger.columns if c.name != "agent_id"]
    rows = [dict(r) for r in conn.execute(select(*kept)).mappings()]
    write_ledger.drop(conn)
    write_ledger.create(conn)
    if rows:
        conn.execute(
            insert(write_ledger), [{**r, "agent_id": ledger_agent(r["scope_key"])} for r in rows]
        )


def downgrade() -> None:
    raise NotImplementedError("the schema is not downgraded: restore a backup instead")
