"""SQL source data and the audit store, through SQLAlchemy 2.

Agents, users, companies, conversations, messages and agent runs are the data the
Memory Manager mines; ``run_steps`` is the append-only audit table every write and every
phase records to; ``write_ledger`` holds within-run write state keyed by (agent, run id);
``injection_events`` records which notes and examples were injected for which run;
``manager_state`` holds cursors; ``api_keys`` holds the HTTP API keys (hashed). SQLite in the home folder by default (WAL, busy
timeout), any SQLAlchemy URL otherwise.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
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
    and_,
    create_engine,
    delete,
    event,
    false,
    func,
    insert,
    inspect,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError, StatementError
from sqlalchemy.pool import NullPool
from sqlalchemy.types import TypeDecorator

from memory_pipelines.errors import NotFoundError, SourceError, ValidationError
from memory_pipelines.notes import AgentConfig


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
    Column("primary_scope_entity_id", String(200)),
    Column("primary_scope_record_id", String(200)),
    Column("secondary_scopes", JSON),
    Column("created_at", UTCDateTime, nullable=False),
    Column("revoked_at", UTCDateTime),
)

AGENT_FIELDS = tuple(f for f in AgentConfig.model_fields if f != "agent_id")


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.close()


#: Key of the PostgreSQL advisory lock held while the schema is created.
_SCHEMA_LOCK_KEY = 0x6D656D6F7279  # "memory"


def _create_schema(engine: Engine) -> None:
    """Create the missing tables; safe when several processes open a fresh database at once.

    PostgreSQL: one transaction holding an advisory lock (its DDL is transactional), so
    concurrent creators queue and the later ones find every table. Other backends: a
    creator that loses the race ("table already exists") retries, and the next pass
    creates only what is still missing.
    """
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK_KEY})
            metadata.create_all(conn)
            _migrate_write_ledger(conn)
        return
    for attempt in range(10):
        try:
            metadata.create_all(engine)
            if engine.dialect.name == "sqlite":
                _migrate_sqlite_write_ledger(engine)
            else:
                with engine.begin() as conn:
                    _migrate_write_ledger(conn)
            return
        except SQLAlchemyError:
            if attempt == 9:
                raise
            time.sleep(0.05 * (attempt + 1))


def ledger_agent(scope_key: str | None) -> str:
    """The agent of a ledger row: the first part of its ``agent|user|company`` scope key."""
    return (scope_key or "").split("|", 1)[0]


def _migrate_write_ledger(conn: Any) -> None:
    """Give a ``write_ledger`` created before the agent column its current shape.

    The old table was keyed by (run id, key); its rows are kept, each attributed to the
    agent of its scope key, in a table keyed by (agent, run id, key). A no-op when the
    column is there. Runs inside the caller's transaction (a schema lock is held).
    """
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


def _migrate_sqlite_write_ledger(engine: Engine) -> None:
    """:func:`_migrate_write_ledger` on SQLite, in one ``BEGIN IMMEDIATE`` transaction so
    two processes opening an old home at once migrate it once (pysqlite does not wrap DDL
    in a transaction by itself)."""
    with engine.connect() as probe:
        columns = {c["name"] for c in inspect(probe).get_columns("write_ledger")}
    if not columns or "agent_id" in columns:
        return
    migrator = create_engine(engine.url, connect_args={"timeout": 30}, poolclass=NullPool)
    event.listen(migrator, "connect", _manual_transactions)
    event.listen(migrator, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
    try:
        with migrator.begin() as conn:
            _migrate_write_ledger(conn)
    finally:
        migrator.dispose()


def _manual_transactions(dbapi_conn, _record) -> None:
    dbapi_conn.isolation_level = None  # SQLAlchemy's "begin" event emits BEGIN itself


def _jsonable(value: Any) -> Any:
    """Round-trip through JSON so stored payloads hold only plain types.

    NaN and ±Infinity become null: they are not JSON, and PostgreSQL rejects them.
    """
    return json.loads(json.dumps(value, default=str), parse_constant=lambda _name: None)


_ERASE_CHUNK = 400


def _chunks(items: Sequence[Any], size: int = 500) -> Iterable[list[Any]]:
    """Slices of ``items`` small enough for one SQL ``IN (...)``."""
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def _sqlite_file(url: str) -> Path | None:
    prefix = "sqlite:///"
    if url.startswith(prefix) and ":memory:" not in url:
        return Path(url[len(prefix) :])
    return None


def _vacuum_sqlite(path: Path) -> None:
    """Rewrite a SQLite file (no free pages keep deleted text) and truncate its WAL."""
    if not path.exists():
        return
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("VACUUM")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


@dataclass(frozen=True)
class UserFootprint:
    """A user's SQL footprint, as ``purge_user`` needs it."""

    #: the user's conversations
    conversation_ids: list[str]
    #: ``(run_id, agent_id)`` of the agent runs of the user or of their conversations
    agent_runs: list[tuple[str, str | None]]
    #: ``(run_id, agent_id)`` named by the user's own audit rows (distinct)
    step_runs: list[tuple[str | None, str | None]]
    #: run ids another user owns
    other_users_runs: set[str]
    #: the texts and rating comments of the messages of the user's conversations
    message_texts: list[str]


class Sources:
    """The SQL side of a memory home: source data, audit and cursors."""

    def __init__(self, url: str, clock: Callable[[], datetime]):
        self.url = url
        self.clock = clock
        try:
            kwargs: dict[str, Any] = {"future": True}
            if url.startswith("sqlite"):
                kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
            else:
                kwargs["pool_pre_ping"] = True
            self.engine: Engine = create_engine(url, **kwargs)
            if url.startswith("sqlite"):
                event.listen(self.engine, "connect", _sqlite_pragmas)
            _create_schema(self.engine)
        except SQLAlchemyError as e:
            raise SourceError(f"cannot open the SQL database {url!r}: {e}") from e

    @contextmanager
    def begin(self):
        try:
            with self.engine.begin() as conn:
                yield conn
        except (IntegrityError, ValidationError):
            raise
        except StatementError as e:
            if isinstance(e.orig, ValidationError):  # raised by a bind processor (naive datetime)
                raise ValidationError(str(e.orig)) from e
            raise SourceError(f"SQL database error: {e}") from e
        except SQLAlchemyError as e:
            raise SourceError(f"SQL database error: {e}") from e

    def close(self) -> None:
        self.engine.dispose()

    # -- agents ---------------------------------------------------------------------

    def upsert_agent(self, config: AgentConfig) -> AgentConfig:
        now = self.clock()
        row = config.model_dump()
        with self.begin() as c:
            exists = c.execute(
                select(agents.c.agent_id).where(agents.c.agent_id == config.agent_id)
            ).first()
            if exists:
                c.execute(
                    update(agents)
                    .where(agents.c.agent_id == config.agent_id)
                    .values(**{k: row[k] for k in AGENT_FIELDS}, updated_at=now)
                )
            else:
                c.execute(insert(agents).values(**row, created_at=now, updated_at=now))
        return config

    def get_agent(self, agent_id: str) -> AgentConfig | None:
        with self.begin() as c:
            r = c.execute(select(agents).where(agents.c.agent_id == agent_id)).mappings().first()
        if r is None:
            return None
        return AgentConfig.model_validate({k: r[k] for k in ("agent_id", *AGENT_FIELDS)})

    def list_agents(self, active_only: bool = False) -> list[AgentConfig]:
        q = select(agents).order_by(agents.c.agent_id)
        if active_only:
            q = q.where(agents.c.status == "Active")
        with self.begin() as c:
            rows = c.execute(q).mappings().all()
        return [AgentConfig.model_validate({k: r[k] for k in ("agent_id", *AGENT_FIELDS)}) for r in rows]

    def set_agent_status(self, agent_id: str, status: str) -> None:
        with self.begin() as c:
            res = c.execute(
                update(agents)
                .where(agents.c.agent_id == agent_id)
                .values(status=status, updated_at=self.clock())
            )
        if res.rowcount == 0:
            raise NotFoundError(f"agent {agent_id!r} does not exist")

    # -- users and companies -------------------------------------------------------

    def add_company(self, company_id: str, name: str | None = None) -> None:
        with self.begin() as c:
            if not c.execute(select(companies.c.company_id).where(companies.c.company_id == company_id)).first():
                c.execute(insert(companies).values(company_id=company_id, name=name, created_at=self.clock()))

    def add_user(self, user_id: str, company_id: str | None = None, name: str | None = None) -> None:
        with self.begin() as c:
            if c.execute(select(users.c.user_id).where(users.c.user_id == user_id)).first():
                c.execute(update(users).where(users.c.user_id == user_id).values(company_id=company_id, name=name))
            else:
                c.execute(
                    insert(users).values(user_id=user_id, company_id=company_id, name=name, created_at=self.clock())
                )

    def delete_user(self, user_id: str) -> int:
        with self.begin() as c:
            return c.execute(delete(users).where(users.c.user_id == user_id)).rowcount

    def delete_company(self, company_id: str) -> int:
        with self.begin() as c:
            return c.execute(delete(companies).where(companies.c.company_id == company_id)).rowcount

    def existing_ids(self, kind: str, ids: Iterable[str]) -> set[str]:
        """Which of ``ids`` exist among agents (active only), users, companies or conversations."""
        table, col = {
            "agent": (agents, agents.c.agent_id),
            "user": (users, users.c.user_id),
            "company": (companies, companies.c.company_id),
            "conversation": (conversations, conversations.c.conversation_id),
        }[kind]
        wanted = list({i for i in ids if i})
        found: set[str] = set()
        with self.begin() as c:
            for start in range(0, len(wanted), 500):
                q = select(col).where(col.in_(wanted[start : start + 500]))
                if kind == "agent":
                    q = q.where(agents.c.status == "Active")
                found.update(r[0] for r in c.execute(q))
        return found

    def user_companies(self, user_ids: Iterable[str]) -> dict[str, str | None]:
        """The company of each of ``user_ids`` that exists."""
        ids = list(user_ids)
        if not ids:
            return {}
        with self.begin() as c:
            return {
                r[0]: r[1]
                for r in c.execute(
                    select(users.c.user_id, users.c.company_id).where(users.c.user_id.in_(ids))
                )
            }

    # -- conversations and messages --------------------------------------------------

    def add_conversation(
        self, conversation_id: str, agent_id: str, user_id: str | None = None, company_id: str | None = None
    ) -> None:
        now = self.clock()
        with self.begin() as c:
            if c.execute(
                select(conversations.c.conversation_id).where(conversations.c.conversation_id == conversation_id)
            ).first():
                c.execute(
                    update(conversations)
                    .where(conversations.c.conversation_id == conversation_id)
                    .values(agent_id=agent_id, user_id=user_id, company_id=company_id)
                )
            else:
                c.execute(
                    insert(conversations).values(
                        conversation_id=conversation_id,
                        agent_id=agent_id,
                        user_id=user_id,
                        company_id=company_id,
                        created_at=now,
                        last_activity_at=now,
                    )
                )

    def get_conversation(self, conversation_id: str) -> dict[str, Any] | None:
        with self.begin() as c:
            r = c.execute(
                select(conversations).where(conversations.c.conversation_id == conversation_id)
            ).mappings().first()
        return dict(r) if r else None

    def add_message(
        self,
        conversation_id: str,
        message_id: str,
        role: str,
        text: str,
        rating: int | None = None,
        rating_comment: str | None = None,
        created_at: datetime | None = None,
    ) -> None:
        if rating is not None:
            try:
                whole = not isinstance(rating, bool) and int(rating) == rating
            except (TypeError, ValueError):
                whole = False
            if not whole or not (1 <= int(rating) <= 10):
                raise ValidationError(f"rating must be between 1 and 10, got {rating!r}")
            rating = int(rating)
        when = created_at or self.clock()
        with self.begin() as c:
            if not c.execute(
                select(conversations.c.conversation_id).where(conversations.c.conversation_id == conversation_id)
            ).first():
                raise NotFoundError(f"conversation {conversation_id!r} does not exist")
            seq = c.execute(
                select(func.coalesce(func.max(messages.c.seq), 0)).where(messages.c.conversation_id == conversation_id)
            ).scalar_one()
            values = dict(
                conversation_id=conversation_id, role=role, text=text, rating=rating,
                rating_comment=rating_comment, created_at=when,
            )
            if c.execute(select(messages.c.message_id).where(messages.c.message_id == message_id)).first():
                c.execute(update(messages).where(messages.c.message_id == message_id).values(**values))
            else:
                c.execute(insert(messages).values(message_id=message_id, seq=seq + 1, **values))
            c.execute(
                update(conversations)
                .where(conversations.c.conversation_id == conversation_id)
                .values(last_activity_at=self.clock())
            )

    def delete_conversation(self, conversation_id: str) -> int:
        with self.begin() as c:
            c.execute(delete(messages).where(messages.c.conversation_id == conversation_id))
            return c.execute(
                delete(conversations).where(conversations.c.conversation_id == conversation_id)
            ).rowcount

    def conversations_with_activity(
        self, since: datetime | None, agent_ids: Sequence[str] | None = None, limit: int = 1000
    ) -> list[dict[str, Any]]:
        q = select(conversations).order_by(conversations.c.last_activity_at, conversations.c.conversation_id)
        if since is not None:
            q = q.where(conversations.c.last_activity_at > since)
        if agent_ids is not None:
            q = q.where(conversations.c.agent_id.in_(list(agent_ids)))
        with self.begin() as c:
            return [dict(r) for r in c.execute(q.limit(limit)).mappings()]

    def messages_of(self, conversation_id: str, after_seq: int = 0) -> list[dict[str, Any]]:
        with self.begin() as c:
            return [
                dict(r)
                for r in c.execute(
                    select(messages)
                    .where(messages.c.conversation_id == conversation_id, messages.c.seq > after_seq)
                    .order_by(messages.c.seq)
                ).mappings()
            ]

    def conversations_by_id(self, conversation_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The conversation rows of ``conversation_ids`` that exist."""
        with self.begin() as c:
            return [
                dict(row)
                for row in c.execute(
                    select(conversations).where(
                        conversations.c.conversation_id.in_(list(conversation_ids))
                    )
                ).mappings()
            ]

    def rated_messages_since(self, after: datetime | None) -> tuple[int, datetime | None]:
        """How many rated messages were created after ``after`` (all when None), and the
        newest one's ``created_at``."""
        with self.begin() as c:
            q = select(func.count(), func.max(messages.c.created_at)).where(
                messages.c.rating.is_not(None)
            )
            if after is not None:
                q = q.where(messages.c.created_at > after)
            count, newest = c.execute(q).one()
        return count, newest

    # -- agent runs -----------------------------------------------------------------------

    def add_agent_run(self, run_id: str, agent_id: str, **fields: Any) -> None:
        allowed = {c.name for c in agent_runs.columns} - {"run_id", "agent_id"}
        unknown = set(fields) - allowed
        if unknown:
            raise ValidationError(f"unknown agent run field(s): {', '.join(sorted(unknown))}")
        fields.setdefault("created_at", self.clock())
        with self.begin() as c:
            owner = c.execute(select(agent_runs.c.agent_id).where(agent_runs.c.run_id == run_id)).first()
            if owner is not None and owner[0] != agent_id:
                raise ValidationError(f"run id {run_id!r} already belongs to another agent")
            if owner is not None:
                c.execute(update(agent_runs).where(agent_runs.c.run_id == run_id).values(agent_id=agent_id, **fields))
            else:
                c.execute(insert(agent_runs).values(run_id=run_id, agent_id=agent_id, **fields))

    def get_agent_run(self, run_id: str) -> dict[str, Any] | None:
        with self.begin() as c:
            r = c.execute(select(agent_runs).where(agent_runs.c.run_id == run_id)).mappings().first()
        return dict(r) if r else None

    def agent_runs_since(self, since: datetime | None, limit: int = 1000) -> list[dict[str, Any]]:
        q = select(agent_runs).order_by(agent_runs.c.created_at, agent_runs.c.run_id)
        if since is not None:
            q = q.where(agent_runs.c.created_at > since)
        with self.begin() as c:
            return [dict(r) for r in c.execute(q.limit(limit)).mappings()]

    def high_value_runs(
        self,
        agent_ids: Sequence[str],
        since: datetime | None,
        min_share_count: int,
        min_artifact_count: int,
        limit: int,
    ) -> list[dict[str, Any]]:
        """The newest runs of ``agent_ids`` (created after ``since``) whose artifacts were
        shared at least ``min_share_count`` times or that made ``min_artifact_count``."""
        with self.begin() as c:
            q = (
                select(agent_runs)
                .where(
                    agent_runs.c.agent_id.in_(list(agent_ids)),
                    or_(
                        agent_runs.c.artifact_share_count >= min_share_count,
                        agent_runs.c.artifact_count >= min_artifact_count,
                    ),
                )
                .order_by(agent_runs.c.created_at.desc())
                .limit(limit)
            )
            if since is not None:
                q = q.where(agent_runs.c.created_at > since)
            return [dict(r) for r in c.execute(q).mappings()]

    def latest_runs_of(self, conversation_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The most recent agent run of each conversation (source run id and scope)."""
        out: dict[str, dict[str, Any]] = {}
        with self.begin() as c:
            for chunk in _chunks(conversation_ids):
                for r in c.execute(
                    select(agent_runs)
                    .where(agent_runs.c.conversation_id.in_(chunk))
                    .order_by(agent_runs.c.created_at, agent_runs.c.run_id)
                ).mappings():
                    out[r["conversation_id"]] = dict(r)
        return out

    def failed_runs(self, agent_ids: Sequence[str], since: datetime | None) -> list[dict[str, Any]]:
        """Runs of ``agent_ids`` (created after ``since``) that failed or were cancelled
        with an error message, or finished unsuccessfully; oldest first."""
        failed = or_(
            and_(
                agent_runs.c.status.in_(["Failed", "Cancelled"]),
                agent_runs.c.error_message.is_not(None),
                agent_runs.c.error_message != "",
            ),
            and_(
                agent_runs.c.success.is_(False), agent_runs.c.status.not_in(["Running", "Paused"])
            ),
        )
        with self.begin() as c:
            q = (
                select(agent_runs)
                .where(agent_runs.c.agent_id.in_(list(agent_ids)), failed)
                .order_by(agent_runs.c.created_at, agent_runs.c.run_id)
            )
            if since is not None:
                q = q.where(agent_runs.c.created_at > since)
            return [dict(r) for r in c.execute(q).mappings()]

    # -- audit -------------------------------------------------------------------------------

    def add_step(
        self,
        run_id: str,
        step_type: str,
        step_name: str,
        input: Any = None,
        output: Any = None,
        status: str = "Completed",
        error_message: str | None = None,
        started_at: datetime | None = None,
        finished_at: datetime | None = None,
        agent_id: str | None = None,
        user_id: str | None = None,
    ) -> int:
        now = self.clock()
        with self.begin() as c:
            res = c.execute(
                insert(run_steps).values(
                    run_id=run_id,
                    agent_id=agent_id,
                    user_id=user_id,
                    step_type=step_type,
                    step_name=step_name,
                    input_json=_jsonable(input),
                    output_json=_jsonable(output),
                    status=status,
                    error_message=error_message,
                    started_at=started_at or now,
                    finished_at=finished_at or now,
                )
            )
            return int(res.inserted_primary_key[0])

    def steps(self, run_id: str | None = None, step_name: str | None = None) -> list[dict[str, Any]]:
        q = select(run_steps).order_by(run_steps.c.id)
        if run_id is not None:
            q = q.where(run_steps.c.run_id == run_id)
        if step_name is not None:
            q = q.where(run_steps.c.step_name == step_name)
        with self.begin() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    def add_steps(self, rows: Sequence[dict[str, Any]]) -> None:
        """Insert prepared ``run_steps`` rows (column values as given) in one transaction."""
        with self.begin() as c:
            c.execute(insert(run_steps), list(rows))

    # -- manager state --------------------------------------------------------------------------

    def get_state(self, key: str, default: Any = None) -> Any:
        with self.begin() as c:
            r = c.execute(select(manager_state.c.value).where(manager_state.c.key == key)).first()
        return default if r is None else r[0]

    def set_state(self, key: str, value: Any) -> None:
        now = self.clock()
        with self.begin() as c:
            if c.execute(select(manager_state.c.key).where(manager_state.c.key == key)).first():
                c.execute(
                    update(manager_state).where(manager_state.c.key == key).values(value=_jsonable(value), updated_at=now)
                )
            else:
                c.execute(insert(manager_state).values(key=key, value=_jsonable(value), updated_at=now))

    def get_states(self, keys: Sequence[str]) -> dict[str, Any]:
        """The values of those of ``keys`` that are set."""
        found: dict[str, Any] = {}
        with self.begin() as c:
            for chunk in _chunks(list(dict.fromkeys(keys))):
                rows = c.execute(
                    select(manager_state.c.key, manager_state.c.value).where(
                        manager_state.c.key.in_(chunk)
                    )
                )
                found.update({k: v for k, v in rows})
        return found

    def set_states(self, values: dict[str, Any]) -> None:
        """Set (or, for a None value, delete) several state keys in one transaction."""
        if not values:
            return
        now = self.clock()
        with self.begin() as c:
            existing = set()
            for chunk in _chunks(list(values)):
                existing.update(
                    r[0]
                    for r in c.execute(
                        select(manager_state.c.key).where(manager_state.c.key.in_(chunk))
                    )
                )
            for key, value in values.items():
                if value is None:
                    c.execute(delete(manager_state).where(manager_state.c.key == key))
                elif key in existing:
                    c.execute(
                        update(manager_state)
                        .where(manager_state.c.key == key)
                        .values(value=value, updated_at=now)
                    )
                else:
                    c.execute(insert(manager_state).values(key=key, value=value, updated_at=now))

    def states_with_prefix(self, prefix: str) -> dict[str, Any]:
        """Every state key that starts with ``prefix`` (SQL ``LIKE``), with its value."""
        with self.begin() as c:
            rows = c.execute(
                select(manager_state.c.key, manager_state.c.value).where(
                    manager_state.c.key.like(prefix + "%")
                )
            ).all()
        return {k: v for k, v in rows}

    # -- Memory Manager runs ------------------------------------------------------------------

    def add_manager_run(
        self,
        kind: str,
        status: str,
        started_at: datetime,
        finished_at: datetime,
        counts: dict[str, Any],
    ) -> None:
        """Append a ``manager_runs`` row (a cycle or a maintenance run)."""
        with self.begin() as c:
            c.execute(
                insert(manager_runs).values(
                    kind=kind,
                    status=status,
                    started_at=started_at,
                    finished_at=finished_at,
                    counts=counts,
                )
            )

    def manager_runs_finished(self, kind: str, status: str) -> list[tuple[datetime, Any]]:
        """``(finished_at, counts)`` of the ``kind`` runs with ``status``, newest first."""
        q = (
            select(manager_runs.c.finished_at, manager_runs.c.counts)
            .where(manager_runs.c.kind == kind, manager_runs.c.status == status)
            .order_by(manager_runs.c.finished_at.desc())
        )
        with self.begin() as c:
            return [(finished, counts) for finished, counts in c.execute(q)]

    def manager_run_counts(
        self, kind: str, status: str, started_after: datetime | None = None
    ) -> list[Any]:
        """The ``counts`` of the ``kind`` runs with ``status`` started after
        ``started_after`` (all when None)."""
        q = select(manager_runs.c.counts).where(
            manager_runs.c.kind == kind, manager_runs.c.status == status
        )
        if started_after is not None:
            q = q.where(manager_runs.c.started_at > started_after)
        with self.begin() as c:
            return list(c.execute(q).scalars().all())

    def injection_events_after(self, after_id: int, limit: int) -> list[tuple[Any, ...]]:
        """Up to ``limit`` ``(id, item_kind, item_id, injected_at)`` injection events with
        an id above ``after_id``, in id order (what the Memory Manager folds next)."""
        with self.begin() as c:
            return [
                tuple(r)
                for r in c.execute(
                    select(
                        injection_events.c.id,
                        injection_events.c.item_kind,
                        injection_events.c.item_id,
                        injection_events.c.injected_at,
                    )
                    .where(injection_events.c.id > after_id)
                    .order_by(injection_events.c.id)
                    .limit(limit)
                ).all()
            ]

    def note_injection_stats(self) -> dict[str, tuple[int, datetime]]:
        """Per injected note id: how many injection events it has and the latest time."""
        ev = injection_events
        q = (
            select(ev.c.item_id, func.count(), func.max(ev.c.injected_at))
            .where(ev.c.item_kind == "note")
            .group_by(ev.c.item_id)
        )
        with self.begin() as c:
            return {row[0]: (int(row[1]), row[2]) for row in c.execute(q)}

    # -- write ledger ---------------------------------------------------------------------------

    def ledger_rows(self, run_id: str, agent_id: str | None = None) -> list[dict[str, Any]]:
        """Every ``write_ledger`` row of a run of ``agent_id`` (the run's within-run write
        state); of every agent that used the run id when ``agent_id`` is None."""
        q = select(write_ledger).where(write_ledger.c.run_id == run_id)
        if agent_id is not None:
            q = q.where(write_ledger.c.agent_id == agent_id)
        with self.begin() as c:
            return [
                dict(r)
                for r in c.execute(
                    q.order_by(write_ledger.c.created_at, write_ledger.c.key)
                ).mappings()
            ]

    def ledger_claim(self, rows: Sequence[dict[str, Any]]) -> bool:
        """Insert ledger rows in one transaction: the commit point of a write.

        Returns False, having inserted nothing, when any ``(agent_id, run_id, key)`` already
        exists (another writer of the same run got there first); ``created_at`` defaults to
        now, ``agent_id`` to the agent of the row's scope key.
        """
        if not rows:
            return True
        now = self.clock()
        values = [
            {"created_at": now, **r, "agent_id": r.get("agent_id") or ledger_agent(r["scope_key"])}
            for r in rows
        ]
        try:
            with self.begin() as c:
                c.execute(insert(write_ledger), values)
        except IntegrityError:
            return False
        return True

    def ledger_release(self, run_id: str, keys: Sequence[str], agent_id: str | None = None) -> int:
        """Delete ledger rows of a run (undoes a claim whose action then failed); only the
        rows of ``agent_id`` when given."""
        if not keys:
            return 0
        cond = [write_ledger.c.run_id == run_id, write_ledger.c.key.in_(list(keys))]
        if agent_id is not None:
            cond.append(write_ledger.c.agent_id == agent_id)
        with self.begin() as c:
            return c.execute(delete(write_ledger).where(*cond)).rowcount

    # -- injection events -------------------------------------------------------------------------

    def record_injection(
        self, events: Sequence[dict[str, Any]], step: dict[str, Any] | None = None
    ) -> None:
        """Append ``injection_events`` rows and, when given, one audit step, in one transaction.

        Each event holds run_id, agent_id, user_id, company_id, item_kind ('note' or
        'example'), item_id, rank and injected_at; ``step`` holds the keyword arguments of
        :meth:`add_step` (run_id, step_type, step_name, input, output, agent_id, user_id).
        Append-only: nothing is updated.
        """
        if not events and step is None:
            return
        with self.begin() as c:
            if events:
                c.execute(insert(injection_events), [dict(e) for e in events])
            if step is not None:
                now = self.clock()
                c.execute(
                    insert(run_steps).values(
                        run_id=step["run_id"],
                        agent_id=step.get("agent_id"),
                        user_id=step.get("user_id"),
                        step_type=step["step_type"],
                        step_name=step["step_name"],
                        input_json=_jsonable(step.get("input")),
                        output_json=_jsonable(step.get("output")),
                        status=step.get("status", "Completed"),
                        error_message=step.get("error_message"),
                        started_at=step.get("started_at") or now,
                        finished_at=step.get("finished_at") or now,
                    )
                )

    def injection_events_of(
        self, run_id: str | None = None, item_kind: str | None = None
    ) -> list[dict[str, Any]]:
        """``injection_events`` rows in insertion order, optionally for one run or item kind."""
        q = select(injection_events).order_by(injection_events.c.id)
        if run_id is not None:
            q = q.where(injection_events.c.run_id == run_id)
        if item_kind is not None:
            q = q.where(injection_events.c.item_kind == item_kind)
        with self.begin() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    def injection_counts(
        self, item_ids: Sequence[str], item_kind: str = "note"
    ) -> dict[str, tuple[int, datetime | None]]:
        """How often each of ``item_ids`` was injected, and when last (items never injected
        are absent)."""
        if not item_ids:
            return {}
        t = injection_events
        q = (
            select(t.c.item_id, func.count(), func.max(t.c.injected_at))
            .where(t.c.item_kind == item_kind, t.c.item_id.in_(list(item_ids)))
            .group_by(t.c.item_id)
        )
        with self.begin() as c:
            return {item: (int(n), last) for item, n, last in c.execute(q)}

    # -- note history ------------------------------------------------------------------------------

    def steps_naming_notes(self, step_name: str, note_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The ``step_name`` audit steps whose output ``noteId`` is one of ``note_ids``, oldest
        first: their run_id, output_json, status, finished_at and the note_id they name."""
        if not note_ids:
            return []
        note_col = run_steps.c.output_json["noteId"].as_string()
        q = (
            select(
                run_steps.c.run_id,
                run_steps.c.output_json,
                run_steps.c.status,
                run_steps.c.finished_at,
                note_col,
            )
            .where(run_steps.c.step_name == step_name, note_col.in_(list(note_ids)))
            .order_by(run_steps.c.id)
        )
        with self.begin() as c:
            return [
                {
                    "run_id": run_id,
                    "output_json": output,
                    "status": status,
                    "finished_at": at,
                    "note_id": note_id,
                }
                for run_id, output, status, at, note_id in c.execute(q)
            ]

    # -- tenancy -------------------------------------------------------------------------------------

    def agent_names_company(self, agent_id: str) -> bool:
        """Whether an agent run, conversation or injection event of the agent names a company."""
        with self.begin() as c:
            for t in (agent_runs, conversations, injection_events):
                q = select(t.c.agent_id).where(t.c.agent_id == agent_id, t.c.company_id.is_not(None))
                if c.execute(q.limit(1)).first() is not None:
                    return True
        return False

    # -- home checks -----------------------------------------------------------------------------

    def note_references(self) -> int:
        """Rows that only exist once the note store held notes: write-ledger entries,
        recorded injections of notes and Memory Manager runs (0 for a fresh database)."""
        queries = [
            select(func.count()).select_from(write_ledger),
            select(func.count())
            .select_from(injection_events)
            .where(injection_events.c.item_kind == "note"),
            select(func.count()).select_from(manager_runs),
        ]
        with self.begin() as c:
            return sum(int(c.execute(q).scalar_one()) for q in queries)

    def probe_write(self) -> None:
        """Run a no-op update (it matches no row and is rolled back); the driver's error
        propagates unchanged when the database cannot be written."""
        with self.engine.connect() as c:
            c.execute(update(manager_state).where(false()).values(key=manager_state.c.key))
            c.rollback()

    # -- erasing a user ------------------------------------------------------------------------

    def user_footprint(self, user_id: str) -> UserFootprint:
        """What the SQL side knows of a user, read in one transaction (see :class:`UserFootprint`)."""
        with self.begin() as c:
            conv_ids = [
                r[0]
                for r in c.execute(
                    select(conversations.c.conversation_id).where(conversations.c.user_id == user_id)
                )
            ]
            run_q = select(agent_runs.c.run_id, agent_runs.c.agent_id).where(
                agent_runs.c.user_id == user_id
            )
            if conv_ids:
                run_q = run_q.where(
                    or_(agent_runs.c.user_id == user_id, agent_runs.c.conversation_id.in_(conv_ids))
                )
            run_rows = [(r[0], r[1]) for r in c.execute(run_q)]
            step_runs = [
                (rid, agent)
                for rid, agent in c.execute(
                    select(run_steps.c.run_id, run_steps.c.agent_id)
                    .where(run_steps.c.user_id == user_id)
                    .distinct()
                )
            ]
            others_runs = {
                r[0]
                for r in c.execute(
                    select(agent_runs.c.run_id).where(
                        agent_runs.c.user_id.is_not(None), agent_runs.c.user_id != user_id
                    )
                )
            }
            msg_texts: list[str] = []
            for chunk in _chunks(conv_ids, _ERASE_CHUNK):
                for text_, comment in c.execute(
                    select(messages.c.text, messages.c.rating_comment).where(
                        messages.c.conversation_id.in_(chunk)
                    )
                ):
                    msg_texts.extend(t for t in (text_, comment) if t)
        return UserFootprint(
            conversation_ids=conv_ids,
            agent_runs=run_rows,
            step_runs=step_runs,
            other_users_runs=others_runs,
            message_texts=msg_texts,
        )

    def erase_user_rows(
        self,
        user_id: str,
        *,
        conversation_ids: Sequence[str],
        run_ids: Sequence[str],
        runs: Iterable[tuple[str | None, str]],
        item_ids: Sequence[str],
        doomed_step: Callable[[Mapping[str, Any]], bool],
        doomed_ledger: Callable[[Mapping[str, Any]], bool],
        scrub_state: Callable[[Any], tuple[Any, bool]],
        clock: Callable[[], datetime],
    ) -> dict[str, int]:
        """Delete a user's SQL rows in one transaction and return counts per table.

        Deletes the messages of ``conversation_ids``, the user's conversations, the agent
        runs ``run_ids``, the audit steps ``doomed_step`` picks, the injection events of the
        user, of their ``runs`` (``(agent_id, run_id)``; rows without a user) and of
        ``item_ids``, the ledger rows ``doomed_ledger`` picks and the user row; rewrites each
        manager-state value ``scrub_state`` changes; revokes (at ``clock()``, unless already
        revoked) the API keys bound to the user, which forget whom they were bound to.
        """
        counts: dict[str, int] = {}
        with self.begin() as c:
            n_msgs = 0
            for chunk in _chunks(conversation_ids, _ERASE_CHUNK):
                n_msgs += c.execute(delete(messages).where(messages.c.conversation_id.in_(chunk))).rowcount
            counts["messages"] = n_msgs
            counts["conversations"] = c.execute(
                delete(conversations).where(conversations.c.user_id == user_id)
            ).rowcount
            n_runs = 0
            for chunk in _chunks(run_ids, _ERASE_CHUNK):
                n_runs += c.execute(delete(agent_runs).where(agent_runs.c.run_id.in_(chunk))).rowcount
            counts["agent_runs"] = n_runs

            doomed_steps = set()
            for step in c.execute(
                select(
                    run_steps.c.id,
                    run_steps.c.user_id,
                    run_steps.c.run_id,
                    run_steps.c.agent_id,
                    run_steps.c.input_json,
                    run_steps.c.output_json,
                    run_steps.c.error_message,
                )
            ).mappings():
                if doomed_step(step):
                    doomed_steps.add(step["id"])
            steps_list = sorted(doomed_steps)
            for start in range(0, len(steps_list), _ERASE_CHUNK):
                c.execute(
                    delete(run_steps).where(run_steps.c.id.in_(steps_list[start : start + _ERASE_CHUNK]))
                )
            counts["run_steps"] = len(steps_list)

            n_inj = c.execute(delete(injection_events).where(injection_events.c.user_id == user_id)).rowcount
            for agent_id, rid in sorted(runs, key=lambda r: (r[0] or "", r[1])):
                n_inj += c.execute(
                    delete(injection_events).where(
                        injection_events.c.run_id == rid,
                        injection_events.c.user_id.is_(None),
                        *([injection_events.c.agent_id == agent_id] if agent_id is not None else []),
                    )
                ).rowcount
            for chunk in _chunks(item_ids, _ERASE_CHUNK):
                n_inj += c.execute(
                    delete(injection_events).where(injection_events.c.item_id.in_(chunk))
                ).rowcount
            counts["injection_events"] = n_inj

            doomed_rows = []
            for row in c.execute(
                select(
                    write_ledger.c.agent_id,
                    write_ledger.c.run_id,
                    write_ledger.c.key,
                    write_ledger.c.note_id,
                    write_ledger.c.scope_key,
                )
            ).mappings():
                if doomed_ledger(row):
                    doomed_rows.append((row["agent_id"], row["run_id"], row["key"]))
            for aid, rid, key in doomed_rows:
                c.execute(
                    delete(write_ledger).where(
                        write_ledger.c.agent_id == aid,
                        write_ledger.c.run_id == rid,
                        write_ledger.c.key == key,
                    )
                )
            counts["write_ledger"] = len(doomed_rows)

            n_state = 0
            for key, value in list(c.execute(select(manager_state.c.key, manager_state.c.value))):
                new, changed = scrub_state(value)
                if changed:
                    c.execute(update(manager_state).where(manager_state.c.key == key).values(value=new))
                    n_state += 1
            counts["manager_state"] = n_state
            counts["users"] = c.execute(delete(users).where(users.c.user_id == user_id)).rowcount
            # keys bound to the user stop working and forget whom they were bound to; the rows
            # stay (revoked), so a home whose only key was purged keeps its API locked
            counts["api_keys"] = c.execute(
                update(api_keys)
                .where(api_keys.c.user_id == user_id)
                .values(
                    user_id=PURGED_USER,
                    revoked_at=func.coalesce(api_keys.c.revoked_at, clock()),
                )
            ).rowcount
        return counts

    def vacuum(self) -> None:
        """A SQLite file only: close the pooled connections, rewrite the file (no free page
        keeps deleted text) and truncate its WAL. Nothing for another database."""
        sql_file = _sqlite_file(self.url)
        if sql_file is not None:
            self.engine.dispose()  # pooled connections would keep the WAL from truncating
            _vacuum_sqlite(sql_file)

    # -- API keys -----------------------------------------------------------------------------

    def add_api_key(self, row: dict[str, Any]) -> None:
        """Insert one ``api_keys`` row (``created_at`` defaults to now)."""
        with self.begin() as c:
            c.execute(insert(api_keys).values(**{"created_at": self.clock(), **row}))

    def get_api_key(self, key_id: str) -> dict[str, Any] | None:
        """The ``api_keys`` row of ``key_id`` (hash included), or None."""
        with self.begin() as c:
            r = c.execute(select(api_keys).where(api_keys.c.key_id == key_id)).mappings().first()
        return dict(r) if r else None

    def list_api_keys(self) -> list[dict[str, Any]]:
        """Every ``api_keys`` row, oldest first, without the hash."""
        cols = [c for c in api_keys.columns if c.name != "secret_hash"]
        with self.begin() as c:
            return [
                dict(r)
                for r in c.execute(
                    select(*cols).order_by(api_keys.c.created_at, api_keys.c.key_id)
                ).mappings()
            ]

    def revoke_api_key(self, key_id: str) -> bool:
        """Mark a key revoked now (an already revoked key keeps its time); False if unknown."""
        with self.begin() as c:
            if not c.execute(select(api_keys.c.key_id).where(api_keys.c.key_id == key_id)).first():
                return False
            c.execute(
                update(api_keys)
                .where(api_keys.c.key_id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=self.clock())
            )
        return True

    def any_api_key(self) -> bool:
        """Whether any API key was ever created here (revoked ones included)."""
        with self.begin() as c:
            return c.execute(select(api_keys.c.key_id).limit(1)).first() is not None

    def get_user(self, user_id: str) -> dict[str, Any] | None:
        """The ``users`` row of ``user_id`` (its company), or None if it is not registered."""
        with self.begin() as c:
            r = c.execute(select(users).where(users.c.user_id == user_id)).mappings().first()
        return dict(r) if r else None
