"""A run's resolved scope (:class:`RunScope`): what inject, explain, history, export, the
memory browser and the proxy read through. It holds the run's lattice values and
multi-tenant scopes and hands out the store prefilter (:mod:`.prefilter`) and the exact
in-memory matcher (:mod:`.match`), so no path builds scope on its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memory_pipelines.errors import ConfigError
from memory_pipelines.notes import AgentConfig, Example, Note, RunContext
from memory_pipelines.scope.match import in_lattice, item_matches
from memory_pipelines.scope.prefilter import (
    example_scope_filter,
    multi_tenant_prefilter,
    note_scope_filter,
    post_filter_needed,
)
from memory_pipelines.scope.tenancy import SecondaryScopeConfig, resolve_run_scopes
from memory_pipelines.store import Cond, eq


def agent_scope_config(agent: AgentConfig) -> SecondaryScopeConfig:
    """The agent's multi-tenant settings; a malformed row (stored before
    ``configure_agent`` checked it) fails closed with a ``ConfigError`` naming the agent."""
    try:
        return SecondaryScopeConfig.from_value(agent.scope_config)
    except ConfigError as e:
        raise ConfigError(
            f"agent {agent.agent_id!r} has a malformed scope_config ({e});"
            " fix it with configure_agent"
        ) from e


@dataclass(frozen=True)
class RunScope:
    """A run's resolved scope: the store prefilter and the exact multi-tenant post-filter."""

    agent_id: str
    user_id: str | None
    company_id: str | None
    primary_entity: str | None
    primary_record: str | None
    secondary: dict[str, Any] | None
    config: SecondaryScopeConfig
    #: False for a caller bound to the company only: the user's notes stored without a
    #: company are out of scope (``RunContext.reads_companyless_user_notes``).
    companyless_users: bool = True

    @classmethod
    def of(cls, ctx: RunContext, agent: AgentConfig) -> RunScope:
        """The context resolved against the agent's dimensions (``ScopeValidationError``
        when it fails the agent's ``strictValidation``)."""
        config = agent_scope_config(agent)
        return cls._build(ctx, config, resolve_run_scopes(ctx.secondary_scopes, config))

    @classmethod
    def as_given(cls, ctx: RunContext, agent: AgentConfig) -> RunScope:
        """The context's secondary scopes as sent, neither validated nor given defaults
        (explain shows a context that fails validation against what it would see)."""
        config = SecondaryScopeConfig.from_value(agent.scope_config)
        return cls._build(ctx, config, dict(ctx.secondary_scopes or {}) or None)

    @classmethod
    def _build(
        cls, ctx: RunContext, config: SecondaryScopeConfig, secondary: dict[str, Any] | None
    ) -> RunScope:
        return cls(
            agent_id=ctx.agent_id,
            user_id=None if config.shared_only else ctx.user_id,
            company_id=ctx.company_id,
            primary_entity=ctx.primary_scope_entity_id,
            primary_record=ctx.primary_scope_record_id,
            secondary=secondary,
            config=config,
            companyless_users=ctx.reads_companyless_user_notes,
        )

    def lattice(self, *, user: bool = True) -> Cond:
        """The scope lattice as a store filter (:func:`note_scope_filter`); ``user`` False:
        the run without its user (the notes every user of the agent shares)."""
        return note_scope_filter(
            self.agent_id,
            self.user_id if user else None,
            self.company_id,
            companyless_users=self.companyless_users,
        )

    def own_user(self) -> Cond:
        """The notes of the run's own user (with :meth:`lattice`, the user's cell of the
        read cache; the notes without a user are the other)."""
        return eq("user_id", self.user_id)

    def example_lattice(self) -> Cond:
        """The 4-level example scope of the run (:func:`example_scope_filter`)."""
        return example_scope_filter(self.agent_id, self.user_id, self.company_id)

    @property
    def needs_post_filter(self) -> bool:
        return post_filter_needed(self.primary_record, self.secondary)

    def matches_tenancy(self, item: Any) -> bool:
        """Whether the item passes the multi-tenant matcher for this run (any item: the
        store prefilter need not have run)."""
        return item_matches(
            item, self.primary_entity, self.primary_record, self.secondary, self.config
        )

    def keep(self, item: Any) -> bool:
        """Whether a row the prefilter let through passes the exact multi-tenant matcher."""
        return not self.needs_post_filter or self.matches_tenancy(item)

    def prefilter(self) -> Cond:
        return multi_tenant_prefilter(self.primary_record, self.secondary)

    def in_lattice(self, note: Note | Example | Any) -> bool:
        """The lattice of :meth:`lattice`, in Python, for one note (or anything with its
        ``agent_id``, ``user_id`` and ``company_id``, such as a lifecycle event)."""
        return in_lattice(
            note.agent_id,
            note.user_id,
            note.company_id,
            self.agent_id,
            self.user_id,
            self.company_id,
            companyless_users=self.companyless_users,
        )


def visible(note: Note, scope: RunScope) -> bool:
    """Whether the run scope may see the note: the lattice and the multi-tenant matcher,
    the rules injection applies (whatever the note's status)."""
    return scope.in_lattice(note) and scope.matches_tenancy(note)
