"""The SQL schema of a memory home: every table, its migrations and the SQLite settings."""

from __future__ import annotations

import json
from datetime import UTC
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    event,
    insert,
    inspect,
    text,
)
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool
from sqlalchemy.types import TypeDecorator

from memory_pipelines.errors import ValidationError
from memory_pipelines.notes import AgentConfig
from memory_pipelines.retries import SQL_SCHEMA_RACE
from memory_pipelines.sources import migrations


class UTCDateTime(TypeDecorator):
    """Stores aware datetimes as UTC and always returns them aware (SQLite drops tzinfo)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValidationError("datetimes must be timezone-aware (UTC)")
        return value.astimezone(UTC)

    def process_result_value(self, value, dialect):
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


metadata = MetaData()

agents = Table(
    "agents",
    metadata,
    Column("agent_id", String(200), primary_key=True),
    Column("name", String(400)),
    Column("status", String(20), nullable=False, default="Active"),
    Column("inject_notes", Boolean, nullable=False, default=True),
    Column("max_notes_to_inject", Integer, nullable=False, default=5),
    Column("note_injection_strategy", String(20), nullable=False, default="Relevant"),
    Column("inject_examples", Boolean, nullable=False, default=False),
    Column("max_examples_to_inject", Integer, nullable=False, default=3),
    Column("example_injection_strategy", String(20), nullable=False, default="Semantic"),
    Column("allow_memory_write", Boolean, nullable=False, default=True),
    Column("auto_archive_enabled", Boolean, nullable=False, default=True),
    Column("scope_config", JSON),
    Column("reranker_config", JSON),
    Column("note_retention_days", Integer),
    Column("example_retention_days", Integer),
    Column("created_at", UTCDateTime),
    Column("updated_at", UTCDateTime),
)

companies = Table(
    "companies",
    metadata,
    Column("company_id", String(200), primary_key=True),
    Column("name", String(400)),
    Column("created_at", UTCDateTime),
)

users = Table(
    "users",
    metadata,
    Column("user_id", String(200), primary_key=True),
    Column("company_id", String(200)),
    Column("name", String(400)),
    Column("created_at", UTCDateTime),
)

conversations = Table(
    "conversations",
    metadata,
    Column("conversation_id", String(200), primary_key=True),
    Column("agent_id", String(200), nullable=False),
    Column("user_id", String(200)),
    Column("company_id", String(200)),
    Column("created_at", UTCDateTime),
    Column("last_activity_at", UTCDateTime),
)

messages = Table(
    "messages",
    metadata,
    Column("message_id", String(200), primary_key=True),
    Column("conversation_id", String(200), nullable=False, index=True),
    Column("role", String(20), nullable=False),
    Column("text", Text, nullable=False),
    Column("rating", Integer),
    Column("rating_comment", Text),
    Column("created_at", UTCDateTime, nullable=False),
    Column("seq", Integer, nullable=False, default=0),
)

agent_runs = Table(
    "agent_runs",
    metadata,
    Column("run_id", String(200), primary_key=True),
    Column("agent_id", String(200), nullable=False, index=True),
    Column("user_id", String(200)),
    Column("company_id", String(200)),
    Column("conversation_id", String(200)),
    Column("status", String(20), nullable=False, default="Completed"),
    Column("success", Boolean),
    Column("error_message", Text),
    Column("artifact_count", Integer, nullable=False, default=0),
    Column("artifact_share_count", Integer, nullable=False, default=0),
    Column("primary_scope_entity_id", String(200)),
    Column("primary_scope_record_id", String(200)),
    Column("secondary_scopes", JSON),
    Column("summary", Text),
    Column("created_at", UTCDateTime, nullable=False),
    Column("finished_at", UTCDateTime),
)

run_steps = Table(
    "run_steps",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(200), nullable=False, index=True),
    Column("agent_id", String(200)),
    Column("user_id", String(200)),
    Column("step_type", String(40), nullable=False),
    Column("step_name", String(200), nullable=False),
    Column("input_json", JSON),
    Column("output_json", JSON),
    Column("status", String(20), nullable=False),
    Column("error_message", Text),
    Column("started_at", UTCDateTime, nullable=False),
    Column("finished_at", UTCDateTime),
)

#: Within-run write state of one run of one agent (CONTRACT §2.8): a run id another agent
#: uses has its own rows. Homes created before ``agent_id`` are migrated on open
#: (:func:`_migrate_write_ledger`).
write_ledger = Table(
    "write_ledger",
    metadata,
    Column("agent_id", String(200), primary_key=True),
    Column("run_id", String(200), primary_key=True),
    Column("key", Text, primary_key=True),
    Column("note_id", String(200), nullable=False),
    Column("scope_key", Text, nullable=False),
    Column("disposition", String(30), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)

#: Who a run belongs to, per agent: the (company, user) of the context that first used
#: the run id (in a write, or a turn of the proxy). Another context's use is refused.
run_owners = Table(
    "run_owners",
    metadata,
    Column("agent_id", String(200), primary_key=True),
    Column("run_id", String(200), primary_key=True),
    Column("company_id", String(200)),
    Column("user_id", String(200), index=True),
    Column("claimed_at", UTCDateTime, nullable=False),
)

injection_events = Table(
    "injection_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(200)),
    Column("agent_id", String(200), nullable=False),
    Column("user_id", String(200)),
    Column("company_id", String(200)),
    Column("item_kind", String(10), nullable=False),  # "note" | "example"
    Column("item_id", String(200), nullable=False, index=True),
    Column("rank", Integer, nullable=False),
    Column("injected_at", UTCDateTime, nullable=False),
    Index("ix_injection_events_id_kind", "item_kind", "id"),
)

manager_state = Table(
    "manager_state",
    metadata,
    Column("key", String(400), primary_key=True),
    Column("value", JSON),
    Column("updated_at", UTCDateTime),
)

manager_runs = Table(
    "manager_runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(40), nullable=False),  # "cycle" | "maintenance"
    Column("status", String(20), nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("finished_at", UTCDateTime),
    Column("counts", JSON),
)

#: Who runs the Memory Manager on a home right now (:mod:`memory_pipelines.sources.leases`):
#: one row per lease, taken by one conditional statement, renewed before ``expires_at``.
manager_leases = Table(
    "manager_leases",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("owner", String(200), nullable=False),
    Column("acquired_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Column("details", JSON),
)

#: Append-only lifecycle events of notes (:mod:`memory_pipelines.note_events`): one row per
#: change of one note, written in the same step as the change. ``id`` orders them.
note_events = Table(
    "note_events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("note_id", String(200), nullable=False),
    Column("event", String(40), nullable=False),
    Column("at", UTCDateTime, nullable=False),
    Column("actor", String(40), nullable=False),
    Column("phase", String(40)),
    Column("run_id", String(200)),
    Column("related_note_ids", JSON),
    Column("status_before", String(20)),
    Column("status_after", String(20)),
    Column("text_after", Text),
    Column("agent_id", String(200)),
    Column("user_id", String(200), index=True),
    Column("company_id", String(200)),
    Column("details", JSON),
    Index("ix_note_events_note_id", "note_id", "id"),
    Index("ix_note_events_at", "at"),
)

#: Users, companies, conversations and agent runs that were registered and then deleted
#: (``kind`` is "user", "company", "conversation" or "run"): stale-reference pruning
#: archives only notes naming one of these, never a note naming an id never registered.
deleted_entities = Table(
    "deleted_entities",
    metadata,
    Column("kind", String(20), primary_key=True),
    Column("id", String(200), primary_key=True),
    Column("deleted_at", UTCDateTime, primary_key=True),
)

#: What ``purge_user`` leaves in ``api_keys.user_id`` of the keys it revoked.
PURGED_USER = "(purged)"

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", String(40), primary_key=True),
    Column("secret_hash", String(100), nullable=False),  # "sha256:<hex>"; never the secret
    Column("company_id", String(200)),
    Column("agent_id", String(200)),
    Column("user_id", String(200)),
    Column("admin", Boolean, nullable=False, default=False),
    # "agent" | "analyst" | "admin" (memory_pipelines.keys.ROLES); added by
    # _migrate_api_key_roles to keys stored before roles, with the default rule
    Column("role", String(20)),
    Column("primary_scope_entity_id", String(200)),
    Column("primary_scope_record_id", String(200)),
    Column("secondary_scopes", JSON),
    Column("created_at", UTCDateTime, nullable=False),
    Column("revoked_at", UTCDateTime),
)

AGENT_FIELDS = tuple(f for f in AgentConfig.model_fields if f != "agent_id")


def sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


#: Alembic's table of the stored schema revision, as Alembic creates it (kept apart from
#: :data:`metadata`, which holds the memory's own tables)
schema_version = Table(
    migrations.VERSION_TABLE,
    MetaData(),
    Column("version_num", String(32), primary_key=True),
)

#: Key of the PostgreSQL advisory lock held while the schema is created.
_SCHEMA_LOCK_KEY = 0x6D656D6F7279  # "memory"


def create_schema(engine: Engine) -> None:
    """Bring the database to today's schema (:data:`.migrations.SCHEMA_HEAD`); safe when
    several processes open a database at once.

    A fresh database gets every table and is stamped at the head; one stamped at the head
    only gets the tables it lacks; any other (an older revision, or a home from before the
    schema revisions) is upgraded by Alembic (:mod:`.migrations`). PostgreSQL: one
    transaction holding an advisory lock (its DDL is transactional), so concurrent
    openers queue and the later ones find the head. SQLite: the upgrade runs in one
    ``BEGIN IMMEDIATE`` transaction, so two processes opening an old home at once upgrade
    it once. A creator that loses a race ("table already exists") tries again
    (:data:`~memory_pipelines.retries.SQL_SCHEMA_RACE`).
    """
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK_KEY})
            if not _create_missing(conn):
                migrations.upgrade(conn)
        return
    SQL_SCHEMA_RACE.call(_create_and_migrate, engine)


def _create_and_migrate(engine: Engine) -> None:
    with engine.begin() as conn:
        if _create_missing(conn):
            return
    if engine.dialect.name != "sqlite":
        with engine.begin() as conn:
            migrations.upgrade(conn)
        return
    # pysqlite does not wrap DDL in a transaction by itself
    migrator = create_engine(engine.url, connect_args={"timeout": 30}, poolclass=NullPool)
    event.listen(migrator, "connect", _manual_transactions)
    event.listen(migrator, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
    try:
        with migrator.begin() as conn:
            migrations.upgrade(conn)
    finally:
        migrator.dispose()


def _create_missing(conn: Any) -> bool:
    """Create the tables the database lacks, at their current shape; a fresh database is
    stamped at the head. True when the database is at the head now (nothing to upgrade)."""
    names = set(inspect(conn).get_table_names())
    stored = migrations.stored_revision(conn)
    fresh = stored is None and not names & set(metadata.tables)
    metadata.create_all(conn)
    if fresh:
        schema_version.create(conn, checkfirst=True)
        conn.execute(insert(schema_version).values(version_num=migrations.SCHEMA_HEAD))
        return True
    return stored == migrations.SCHEMA_HEAD


def ledger_agent(scope_key: str | None) -> str:
    """The agent of a ledger row: the first part of its ``agent|user|company`` scope key."""
    return (scope_key or "").split("|", 1)[0]


def _manual_transactions(dbapi_conn, _record) -> None:
    dbapi_conn.isolation_level = None  # SQLAlchemy's "begin" event emits BEGIN itself


def jsonable(value: Any) -> Any:
    """Round-trip through JSON so stored payloads hold only plain types.

    NaN and ±Infinity become null: they are not JSON, and PostgreSQL rejects them.
    """
    return json.loads(json.dumps(value, default=str), parse_constant=lambda _name: None)
