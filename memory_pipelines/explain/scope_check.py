"""Step 2: is a note in scope for the run context, and which rule of
:mod:`memory_pipelines.scope` (lattice or multi-tenant matcher) excludes it."""

from __future__ import annotations

from typing import Any

from memory_pipelines.explain.models import ScopeCheck
from memory_pipelines.notes import AgentConfig, Note, RunContext
from memory_pipelines.scope import (
    STRICT,
    RunScope,
    ScopeValidationError,
    SecondaryScopeConfig,
    dimensions_match,
    lattice_level,
    parse_scopes,
    scope_label,
)


def scope_of(ctx: RunContext, agent: AgentConfig) -> tuple[RunScope, str | None]:
    """The injection path's scope for the context; a context that fails the agent's
    ``strictValidation`` is returned unresolved with the problem."""
    try:
        return RunScope.of(ctx, agent), None
    except ScopeValidationError as e:
        scope = RunScope.as_given(ctx, agent)
        return scope, f"the context fails the agent's secondary-scope validation: {e}"


def _lattice_rule(note: Note, ctx: RunContext, scope: RunScope) -> str | None:
    """Which lattice rule excludes the note (None when the lattice admits it)."""
    if note.agent_id and note.agent_id != ctx.agent_id:
        return f"different agent: belongs to agent {note.agent_id}, context agent is {ctx.agent_id}"
    if note.user_id and note.user_id != scope.user_id:
        if scope.user_id is None and scope.config.shared_only and ctx.user_id:
            return (
                f"user-specific note (user {note.user_id}) but agent {ctx.agent_id} is shared-only: "
                "notes with a user are never injected"
            )
        if scope.user_id is None:
            return f"user-specific note but the context has no user (the note belongs to user {note.user_id})"
        return f"belongs to user {note.user_id}, context user is {scope.user_id}"
    if note.user_id and not note.company_id and scope.company_id and not scope.companyless_users:
        return (
            f"a note of user {note.user_id} stored without a company belongs to no company;"
            f" a key bound to company {scope.company_id} does not read it"
        )
    if note.company_id and note.company_id != scope.company_id:
        if scope.company_id is None:
            return (
                "company-specific note but the context has no company "
                f"(the note belongs to company {note.company_id})"
            )
        return f"belongs to company {note.company_id}, context company is {scope.company_id}"
    return None


def _dimension_rule(
    note_scopes: dict[str, Any], run: dict[str, Any], config: SecondaryScopeConfig
) -> str:
    for name, value in note_scopes.items():
        sub = {name: run[name]} if name in run else {}
        if not dimensions_match({name: value}, sub, config):
            mode = config.mode_for(name)
            if name not in run:
                return f"secondary scope dimension {name} {mode} mismatch: the note has {name}={value}, the context has none"
            return f"secondary scope dimension {name} {mode} mismatch: the note has {name}={value}, the context has {run[name]}"
    for name, value in run.items():
        if config.mode_for(name) == STRICT and name not in note_scopes:
            return f"secondary scope dimension {name} strict mismatch: the context has {name}={value}, the note does not carry it"
    return "secondary scopes do not match"


def _multi_tenant_rule(note: Note, scope: RunScope) -> str:
    """Which branch of the multi-tenant matcher rejects the note (reference §3.3)."""
    try:
        note_scopes = parse_scopes(note.secondary_scopes) or {}
    except ValueError:
        return "the note's secondary scopes are malformed"
    primary = note.primary_scope_record_id
    run_secondary = dict(scope.secondary or {})
    if not scope.primary_record:
        if primary:
            return f"note has primary scope {primary} but the context has no primary scope"
        if not scope.config.allow_secondary_only:
            return (
                f"note has secondary scopes {note_scopes} but the context has no primary scope "
                "(and the agent does not allowSecondaryOnly)"
            )
        if not run_secondary:
            return f"note has secondary scopes {note_scopes} but the context has none"
        return _dimension_rule(note_scopes, run_secondary, scope.config)
    if primary != scope.primary_record:
        if not primary:
            return f"note has secondary scopes but no primary scope; the context's primary scope is {scope.primary_record}"
        return (
            f"belongs to primary scope {primary}, context primary scope is {scope.primary_record}"
        )
    entity = note.primary_scope_entity_id
    if entity and scope.primary_entity and entity != scope.primary_entity:
        return f"primary scope entity {entity} differs from the context's {scope.primary_entity}"
    if not run_secondary:
        return f"note has secondary scopes {note_scopes} but the context has none"
    return _dimension_rule(note_scopes, run_secondary, scope.config)


def check_scope(note: Note, ctx: RunContext, scope: RunScope) -> ScopeCheck:
    """Step 2 for one note: the lattice of :mod:`memory_pipelines.scope`, then its multi-tenant matcher."""
    level = lattice_level(note.agent_id, note.user_id, note.company_id)
    label = scope_label(note)
    if not scope.in_lattice(note):
        rule = _lattice_rule(note, ctx, scope) or "outside the context's scope lattice"
        return ScopeCheck(
            in_scope=False, level=level, label=label, rule=rule, detail=f"out of scope: {rule}"
        )
    if not scope.matches_tenancy(note):
        rule = _multi_tenant_rule(note, scope)
        return ScopeCheck(
            in_scope=False, level=level, label=label, rule=rule, detail=f"out of scope: {rule}"
        )
    return ScopeCheck(
        in_scope=True,
        level=level,
        label=label,
        detail=f"in scope at lattice level {level} ({label})",
    )
