"""Agents, users and companies. (SQL queries as named methods)"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import (
    delete,
    insert,
    select,
    update,
)

from memory_pipelines.errors import NotFoundError
from memory_pipelines.notes import AgentConfig
from memory_pipelines.sources.base import SourcesBase
from memory_pipelines.sources.tables import (
    AGENT_FIELDS,
    agents,
    companies,
    conversations,
    users,
)


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
