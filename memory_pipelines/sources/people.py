"""Agents, users and companies. (SQL queries as named methods)"""

from __future__ import annotations

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
