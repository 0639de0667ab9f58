"""api_keys.role: each key's role (admin, agent, analyst)

Revision ID: 0003_api_key_roles
Revises: 0002_write_ledger_agent
"""

from alembic import op
from sqlalchemy import case, inspect, literal, update

from memory_pipelines.sources.tables import api_keys

revision = "0003_api_key_roles"
down_revision = "0002_write_ledger_agent"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Give an ``api_keys`` table stored before key roles its ``role`` column, each key the
    role it would get today without one: admin for an admin key, agent for a key bound to
    an agent, analyst otherwise. A no-op when the column is there."""
    conn = op.get_bind()
    columns = {c["name"] for c in inspect(conn).get_columns("api_keys")}
    if not columns or "role" in columns:
        return
    conn.exec_driver_sql("ALTER TABLE api_keys ADD COLUMN role VARCHAR(20)")
    role = case(
        (api_keys.c.admin.is_(True), literal("admin")),
        (api_keys.c.agent_id.is_not(None), literal("agent")),
        else_=literal("analyst"),
    )
    conn.execute(update(api_keys).where(api_keys.c.role.is_(None)).values(role=role))


def downgrade() -> None:
    raise NotImplementedError("the schema is not downgraded: restore a backup instead")
