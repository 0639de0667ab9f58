"""A run's resolved scope and the note filters built from it: the store filter of
injection, the read cache's filter without the clock, and the cache cells a scope is
held in."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memory_pipelines.errors import ConfigError
from memory_pipelines.injection.cache import ScopeView, read_cache
from memory_pipelines.notes import AgentConfig, Example, ExampleStatus, Note, RunContext
from memory_pipelines.scoping import (
    SecondaryScopeConfig,
    example_scope_filter,
    in_lattice,
    item_matches,
    multi_tenant_prefilter,
    note_scope_filter,
    post_filter_needed,
    resolve_run_scopes,
)
from memory_pipelines.store import Cond, and_, cmp, eq, injectable, is_null, or_


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
        try:
            config = SecondaryScopeConfig.from_value(agent.scope_config)
        except ConfigError as e:  # a row stored before configure_agent checked it: fail closed
            raise ConfigError(
                f"agent {agent.agent_id!r} has a malformed scope_config ({e});"
                " fix it with configure_agent"
            ) from e
        return cls(
            agent_id=ctx.agent_id,
            user_id=None if config.shared_only else ctx.user_id,
            company_id=ctx.company_id,
            primary_entity=ctx.primary_scope_entity_id,
            primary_record=ctx.primary_scope_record_id,
            secondary=resolve_run_scopes(ctx.secondary_scopes, config),
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

    @property
    def needs_post_filter(self) -> bool:
        return post_filter_needed(self.primary_record, self.secondary)

    def keep(self, item: Note | Example) -> bool:
        if not self.needs_post_filter:
            return True
        return item_matches(
            item, self.primary_entity, self.primary_record, self.secondary, self.config
        )

    def prefilter(self) -> Cond:
        return multi_tenant_prefilter(self.primary_record, self.secondary)


def visible(note: Note, scope: RunScope) -> bool:
    """Whether the run scope may see the note: the lattice and the multi-tenant matcher,
    the rules injection applies (whatever the note's status)."""
    return in_lattice(
        note.agent_id,
        note.user_id,
        note.company_id,
        scope.agent_id,
        scope.user_id,
        scope.company_id,
        companyless_users=scope.companyless_users,
    ) and item_matches(
        note, scope.primary_entity, scope.primary_record, scope.secondary, scope.config
    )


def not_expired(now: datetime) -> Cond:
    """Rows without ``expires_at`` or expiring after ``now``."""
    return or_(is_null("expires_at"), cmp("expires_at", ">", now))


def note_filter(scope: RunScope, now: datetime) -> Cond:
    """Injectable, unexpired notes inside the run's lattice and multi-tenant prefilter."""
    return and_(
        injectable(),
        not_expired(now),
        scope.lattice(),
        scope.prefilter(),
    )


def injectable_in_scope(scope: RunScope) -> Cond:
    """:func:`note_filter` without the clock: what the read cache holds for a scope."""
    return and_(
        injectable(),
        scope.lattice(),
        scope.prefilter(),
    )


def scope_cells(scope: RunScope) -> list[Cond]:
    """Disjoint filters whose rows together are :func:`injectable_in_scope`'s: for a run
    with a user, the user's own notes and the notes without a user (the latter the very
    filter of the same run without a user, so every user of an agent shares one cached
    entry of them); otherwise the one filter. The read cache holds each cell on its own
    (:func:`cached_scope`), so a million notes over a thousand users cost one small entry
    per user plus the shared ones, not a copy of the shared notes per user."""
    if scope.user_id is None:
        return [injectable_in_scope(scope)]
    shared = and_(
        injectable(),
        scope.lattice(user=False),
        scope.prefilter(),
    )
    own = and_(
        injectable(),
        scope.lattice(),
        eq("user_id", scope.user_id),
        scope.prefilter(),
    )
    return [own, shared]


def cached_scope(table: Any, scope: RunScope) -> list[ScopeView] | None:
    """The read cache's views of the scope's cells (:func:`scope_cells`), or None when
    the cache is off or a cell is too large to cache."""
    cache = read_cache(table)
    views = []
    for where in scope_cells(scope):
        view = cache.rows(where)
        if view is None:
            return None
        views.append(view)
    return views


def example_filter(scope: RunScope, now: datetime) -> Cond:
    """Active, unexpired examples of the run's agent inside its user/company scope."""
    return and_(
        eq("status", ExampleStatus.ACTIVE.value),
        not_expired(now),
        example_scope_filter(scope.agent_id, scope.user_id, scope.company_id),
        scope.prefilter(),
    )
