"""``svc.directory``: the agents, users, companies, conversations, messages and agent runs
of a memory home, in its SQL sources. Each method is also ``svc.<name>``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from memory_pipelines import agents
from memory_pipelines.limits import check_fields, check_ids
from memory_pipelines.notes import AgentConfig
from memory_pipelines.service.parts import Host


class Directory:
    """Agents, users, companies, conversations, messages and runs of a memory home."""

    def __init__(self, service: Host):
        self._service = service

    # -- agents -------------------------------------------------------------------------------

    def configure_agent(self, agent_id: str, **fields: Any) -> AgentConfig:
        """Create or update an agent's memory configuration (unknown fields are an error;
        out-of-range values are a ``ValidationError``, see :func:`check_agent_fields`)."""
        return agents.configure_agent(self._service.sources, agent_id, **fields)

    def get_agent(self, agent_id: str) -> AgentConfig:
        """The agent's configuration; ``UnknownAgentError`` if it is not configured."""
        return agents.get_agent(self._service.sources, agent_id)

    def deactivate_agent(self, agent_id: str) -> None:
        """Mark a configured agent ``Inactive`` (``UnknownAgentError`` if it is not)."""
        self.get_agent(agent_id)
        self._service.sources.set_agent_status(agent_id, "Inactive")

    def list_agents(self) -> list[AgentConfig]:
        """Every configured agent (active or not), by id."""
        return self._service.sources.list_agents()

    # -- users and companies ----------------------------------------------------------------

    def add_company(self, company_id: str, name: str | None = None) -> None:
        """Register a company (a known one is left as it is)."""
        check_ids({"company_id": company_id})
        check_fields({"name": name})
        self._service.sources.add_company(company_id, name)

    def add_user(
        self, user_id: str, company_id: str | None = None, name: str | None = None
    ) -> None:
        """Register a user, optionally of a company (a known user gets this company and name)."""
        check_ids({"user_id": user_id, "company_id": company_id})
        check_fields({"name": name})
        self._service.sources.add_user(user_id, company_id, name)

    def delete_user(self, user_id: str) -> None:
        """Delete a user's source row (stale-reference pruning then archives its notes)."""
        self._service.sources.delete_user(user_id)
        self._service.registry.forget(user_id=user_id)

    def delete_company(self, company_id: str) -> None:
        """Delete a company's source row (stale-reference pruning then archives its notes)."""
        self._service.sources.delete_company(company_id)
        self._service.registry.forget(company_id=company_id)

    # -- conversations, messages and runs ---------------------------------------------------

    def add_conversation(
        self,
        conversation_id: str,
        agent_id: str,
        user_id: str | None = None,
        company_id: str | None = None,
    ) -> None:
        """Record a conversation of an agent (with a user and company, if any)."""
        check_ids(
            {
                "conversation_id": conversation_id,
                "agent_id": agent_id,
                "user_id": user_id,
                "company_id": company_id,
            }
        )
        self._service.sources.add_conversation(conversation_id, agent_id, user_id, company_id)

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
        """Record a message of a conversation, with its rating if it has one."""
        check_ids({"conversation_id": conversation_id, "message_id": message_id})
        check_fields(
            {
                "role": role,
                "text": text,
                "rating_comment": rating_comment,
            }
        )
        self._service.sources.add_message(
            conversation_id, message_id, role, text, rating, rating_comment, created_at
        )

    def delete_conversation(self, conversation_id: str) -> None:
        """Delete a conversation's source row and its messages."""
        self._service.sources.delete_conversation(conversation_id)

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
        """Record an agent run (what extraction and hardening read)."""
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
        self._service.sources.add_agent_run(
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

    def delete_agent_run(self, run_id: str) -> None:
        """Delete an agent run's source row (stale-reference pruning then archives the
        notes it sourced)."""
        self._service.sources.delete_agent_run(run_id)
