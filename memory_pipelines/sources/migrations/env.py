"""Alembic's environment: the revisions run on the connection ``create_schema`` or
``memory-pipelines db upgrade`` passes in, inside that caller's transaction."""

from alembic import context

from memory_pipelines.errors import SourceError
from memory_pipelines.sources.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise SourceError("the schema revisions run on a connection (memory-pipelines db upgrade)")
context.configure(
    connection=connection,
    target_metadata=metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
