"""The service's calls on the SQL sources: agents, users, companies, conversations, messages
and agent runs (a mixin of :class:`~memory_pipelines.service.MemoryService`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from memory_pipelines import agents
from memory_pipelines.limits import (
    check_fields,
    check_ids,
)
from memory_pipelines.notes import (
    AgentConfig,
)


class SourceCalls:
    """Agents, users, companies, conversations and runs of a memory home."""

    # -- agents, users, companies, sources ----------------------------------------------------

    def configure_agent(self, agent_id: str, **fields: Any) -> AgentConfig:
        """Create or update an agent's memory configuration (unknown fields are an error;
        out-of-range values are a ``ValidationError``, see :func:`check_agent_fields`)."""
        return agents.configure_agent(self.sources, agent_id, **fields)

    def get_agent(self, agent_id: str) -> AgentConfig:
        """The agent's configuration; ``UnknownAgentError`` if it is not configured."""
        return agents.get_agent(self.sources, agent_id)

    def deactivate_agent(self, agent_id: str) -> None:
        self.get_agent(agent_id)
        self.sources.set_agent_status(agent_id, "Inactive")

    def add_company(self, company_id: str, name: str | None = None) -> None:
        check_ids({"company_id": company_id})
        check_fields({"name": name})
        self.sources.add_company(company_id, name)

    def add_user(self, user_id: str, company_id: str | None = None, name: str | None = None) -> None:
        check_ids({"user_id": user_id, "company_id": company_id})
        check_fields({"name": name})
        self.sources.add_user(user_id, company_id, name)

    def delete_user(self, user_id: str) -> None:
        self.sources.delete_user(user_id)
        self.registry.forget(user_id=user_id)

    def delete_company(self, company_id: str) -> None:
        self.sources.delete_company(company_id)
        self.registry.forget(company_id=company_id)

    def add_conversation(
        self, conversation_id: str, agent_id: str, user_id: str | None = None, company_id: str | None = None
    ) -> None:
        check_ids(
            {
                "conversation_id": conversation_id,
                "agent_id": agent_id,
                "user_id": user_id,
                "company_id": company_id,
            }
        )
        self.sources.add_conversation(conversation_id, agent_id, user_id, company_id)

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
        check_ids({"conversation_id": conversation_id, "message_id": message_id})
        check_fields(
            {
                "role": role,
                "text": text,
                "rating_comment": rating_comment,
            }
        )
        self.sources.add_message(
            conversation_id, message_id, role, text, rating, rating_comment, created_at
        )

    def delete_conversation(self, conversation_id: str) -> None:
        self.sources.delete_conversation(conversation_id)

    def add_agent_run(
        self,
        run_id: str,
        agent_id: str,
        user_id: str | None = None,
        company_id: str | None = None,
        conversation_id: str | None = None,
        status: str = "Completed",
        success: bool | None = True,
        error_message: str | None = None,
        **fields: Any,
    ) -> None:
        check_ids(
            {
                "run_id": run_id,
                "agent_id": agent_id,
                "user_id": user_id,
                "company_id": company_id,
                "conversation_id": conversation_id,
            }
        )
        check_fields({"error_message": error_message, **fields})
        self.sources.add_agent_run(
            run_id,
            agent_id,
            user_id=user_id,
            company_id=company_id,
            conversation_id=conversation_id,
            status=status,
            success=success,
            error_message=error_message,
            **fields,
        )

