"""Agents, users and companies. (SQL queries as named methods)"""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from memory_pipelines.errors import NotFoundError
from memory_pipelines.notes import AgentConfig
from memory_pipelines.sources.base import SourcesBase, chunks
from memory_pipelines.sources.tables import (
    AGENT_FIELDS,
    agent_runs,
    agents,
    companies,
    conversations,
    deleted_entities,
    injection_events,
    users,
)


def insert_missing(conn: Any, table: Any, values: Mapping[str, Any]) -> None:
    """Insert one row unless its primary key exists; never fails when another process
    inserts the same key at the same moment (``ON CONFLICT DO NOTHING`` on SQLite and
    PostgreSQL, a savepoint elsewhere)."""
    name = conn.dialect.name
    if name in ("sqlite", "postgresql"):
        dialect_insert = sqlite.insert if name == "sqlite" else postgresql.insert
        conn.execute(dialect_insert(table).values(**values).on_conflict_do_nothing())
        return
    try:
        with conn.begin_nested():
            conn.execute(insert(table).values(**values))
    except IntegrityError:
        pass


#: creates the per-Sources agent cache exactly once
_CACHE_GUARD = threading.Lock()
_MISS = object()


def _own_copy(config: AgentConfig) -> AgentConfig:
    """A copy of a cached configuration the caller may change: the model copied, and its
    containers (scope and reranker settings) deeply; the other fields are immutable."""
    out = config.model_copy()
    for name, value in config.__dict__.items():
        if isinstance(value, (dict, list, set)):
            out.__dict__[name] = copy.deepcopy(value)
    return out


class _AgentCache:
    """Agent configurations read in this process, valid while the SQLite database is
    unchanged: ``PRAGMA data_version`` on a connection kept for this alone changes with
    every commit of any other connection, this process's own pool and other processes
    alike (any table, so any commit empties the cache; an unchanged database keeps it).
    Not used for in-memory or non-SQLite databases (:meth:`stamp` is None there)."""

    def __init__(self, engine: Any, url: str):
        self.engine = engine
        self.usable = url.startswith("sqlite") and ":memory:" not in url and "mode=memory" not in url
        self.lock = threading.Lock()
        self.conn: Any = None
        self.pid = 0
        self.version: int | None = None
        self.configs: dict[str, AgentConfig | None] = {}

    def stamp(self) -> int | None:
        """The database's data version now (None: no cache)."""
        if not self.usable:
            return None
        with self.lock:
            try:
                if self.conn is None or self.pid != os.getpid():  # a forked child opens its own
                    self.conn, self.pid = self.engine.raw_connection(), os.getpid()
                    self.version = None  # data versions of another connection do not compare
                    self.configs.clear()
                cur = self.conn.cursor()
                try:
                    cur.execute("PRAGMA data_version")
                    return int(cur.fetchone()[0])
                finally:
                    cur.close()
            except Exception:  # no cache rather than a failed read
                return None

    def get(self, agent_id: str, stamp: int) -> Any:
        with self.lock:
            if stamp != self.version:
                self.configs.clear()
                self.version = stamp
            return self.configs.get(agent_id, _MISS)

    def put(self, agent_id: str, stamp: int, config: AgentConfig | None) -> None:
        with self.lock:
            if stamp == self.version:
                self.configs[agent_id] = config

    def close(self) -> None:
        with self.lock:
            if self.conn is not None and self.pid == os.getpid():
                self.conn.close()  # back to the pool, which the engine then disposes
            self.conn, self.version = None, None
            self.configs.clear()


class PeopleQueries(SourcesBase):
    """Agents, users and companies."""

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
        """The agent's stored configuration (None when unknown). On a SQLite file it comes
        from this process's copy while the database is unchanged since it was read
        (:class:`_AgentCache`); elsewhere it is read each time."""
        cache = self._agent_cache()
        stamp = cache.stamp()
        if stamp is not None:
            found = cache.get(agent_id, stamp)
            if found is not _MISS:
                return _own_copy(found) if found is not None else None
        with self.begin() as c:
            r = c.execute(select(agents).where(agents.c.agent_id == agent_id)).mappings().first()
        config = (
            None
            if r is None
            else AgentConfig.model_validate({k: r[k] for k in ("agent_id", *AGENT_FIELDS)})
        )
        if stamp is not None:  # read after the stamp: at least as new as what it stamps
            cache.put(agent_id, stamp, config)
            return _own_copy(config) if config is not None else None
        return config

    def _agent_cache(self) -> _AgentCache:
        cache = self.__dict__.get("_agents_cache")
        if cache is None:
            with _CACHE_GUARD:
                cache = self.__dict__.setdefault("_agents_cache", _AgentCache(self.engine, self.url))
        return cache

    def close(self) -> None:
        cache = self.__dict__.get("_agents_cache")
        if cache is not None:
            cache.close()
        super().close()

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
            n = c.execute(delete(users).where(users.c.user_id == user_id)).rowcount
            if n:
                self.record_deletion(c, "user", user_id)
            return n

    def delete_company(self, company_id: str) -> int:
        with self.begin() as c:
            n = c.execute(delete(companies).where(companies.c.company_id == company_id)).rowcount
            if n:
                self.record_deletion(c, "company", company_id)
            return n

    def existing_ids(self, kind: str, ids: Iterable[str]) -> set[str]:
        """Which of ``ids`` exist among agents (active only), users, companies, conversations
        or agent runs (kind "run")."""
        table, col = {
            "agent": (agents, agents.c.agent_id),
            "user": (users, users.c.user_id),
            "company": (companies, companies.c.company_id),
            "conversation": (conversations, conversations.c.conversation_id),
            "run": (agent_runs, agent_runs.c.run_id),
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

    # -- registration and deletion records (CONTRACT §2.9) ----------------------------

    def register_people(self, user_id: str | None, company_id: str | None) -> None:
        """Register a company and a user (with that company) unless they exist; an
        existing user keeps its company. Safe when two processes register one id at once."""
        now = self.clock()
        with self.begin() as c:
            if company_id:
                insert_missing(c, companies, {"company_id": company_id, "created_at": now})
            if user_id:
                insert_missing(
                    c, users, {"user_id": user_id, "company_id": company_id, "created_at": now}
                )

    def record_deletion(self, conn: Any, kind: str, entity_id: str) -> None:
        """Record, inside the deleting transaction ``conn``, that ``entity_id`` of ``kind``
        ("user", "company", "conversation", "run") was deleted now."""
        insert_missing(
            conn, deleted_entities, {"kind": kind, "id": entity_id, "deleted_at": self.clock()}
        )

    def deleted_ids(self, kind: str, ids: Iterable[str]) -> dict[str, datetime]:
        """Which of ``ids`` (compared ignoring case, as pruning compares them) were
        registered and later deleted: lower-cased id -> the latest deletion instant."""
        wanted = sorted({i.lower() for i in ids if i})
        out: dict[str, datetime] = {}
        lowered = func.lower(deleted_entities.c.id)
        with self.begin() as c:
            for part in chunks(wanted):
                q = (
                    select(lowered, func.max(deleted_entities.c.deleted_at))
                    .where(deleted_entities.c.kind == kind, lowered.in_(part))
                    .group_by(lowered)
                )
                for entity, at in c.execute(q):
                    at = deleted_entities.c.deleted_at.type.process_result_value(at, None)
                    if entity not in out or at > out[entity]:
                        out[entity] = at
        return out

    def deletions(self, kind: str | None = None) -> list[dict[str, Any]]:
        """The deletion records (of one kind), oldest first."""
        q = select(deleted_entities).order_by(deleted_entities.c.deleted_at, deleted_entities.c.id)
        if kind is not None:
            q = q.where(deleted_entities.c.kind == kind)
        with self.begin() as c:
            return [dict(r) for r in c.execute(q).mappings()]

    def forget_deletions(self, kind: str, entity_id: str) -> int:
        """Remove the deletion records of one id (purging a user leaves no trace of its id)."""
        with self.begin() as c:
            return (
                c.execute(
                    delete(deleted_entities).where(
                        deleted_entities.c.kind == kind, deleted_entities.c.id == entity_id
                    )
                ).rowcount
                or 0
            )

    def delete_agent_run(self, run_id: str) -> int:
        """Delete an agent run's row (recording the deletion); returns rows deleted."""
        with self.begin() as c:
            n = c.execute(delete(agent_runs).where(agent_runs.c.run_id == run_id)).rowcount
            if n:
                self.record_deletion(c, "run", run_id)
            return n

    def delete_note_injections(self, note_ids: Sequence[str]) -> int:
        """Delete the injection rows of these notes (erasing a note); returns the count."""
        deleted = 0
        with self.begin() as c:
            for part in chunks(list(note_ids)):
                deleted += (
                    c.execute(
                        delete(injection_events).where(
                            injection_events.c.item_kind == "note",
                            injection_events.c.item_id.in_(part),
                        )
                    ).rowcount
                    or 0
                )
        return deleted
