"""Scope as a store filter: the LanceDB where-clause that narrows every vector, full-text
and scan read to a run's scope before anything is ranked.

:func:`note_scope_filter` is the lattice (:mod:`.lattice`) with the company-bound rule;
:func:`example_scope_filter` the 4-level example scope; :func:`multi_tenant_prefilter` a
necessary condition of the multi-tenant matcher (:mod:`.match`) that the store can
evaluate, so only its survivors are checked in Python (:func:`post_filter_needed`).

Beside the lattice, the scope filters of maintenance and operators: :func:`exact_scope`
(notes of exactly one scope, NULL matching NULL), :func:`selection_filter` (an operator's
agent / user / company selection, a column not named left open) and :func:`agent_filter`
(the lattice's agent dimension alone, what ``why`` searches before it explains).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memory_pipelines.errors import ValidationError
from memory_pipelines.store import Cond, and_, eq, is_null, or_


def _dimension(column: str, value: str | None) -> Cond:
    """``column = value OR column IS NULL`` when the run has a value, else ``IS NULL``."""
    if value is None:
        return is_null(column)
    return or_(eq(column, value), is_null(column))


def note_scope_filter(
    agent_id: str,
    user_id: str | None,
    company_id: str | None,
    *,
    shared_only: bool = False,
    companyless_users: bool = True,
) -> Cond:
    """The lattice as a store filter: the 8 levels OR-ed, with absent meaning NULL.

    ``shared_only`` keeps only notes without a user (agent-wide, company-wide and global
    notes), whatever the run's user is. ``companyless_users`` False (a caller bound to
    the run's company, not to its user) drops the notes of the run's user stored without
    a company: such a note belongs to no company, so a company's caller never reads it.
    """
    if not agent_id:
        raise ValidationError("a scope filter needs an agent id")
    user = None if shared_only else user_id
    user_dim = _dimension("user_id", user)
    if user is not None and company_id is not None and not companyless_users:
        user_dim = or_(is_null("user_id"), and_(eq("user_id", user), eq("company_id", company_id)))
    return and_(
        _dimension("agent_id", agent_id),
        user_dim,
        _dimension("company_id", company_id),
    )


def agent_filter(agent_id: str) -> Cond:
    """The agent's notes and the notes without an agent: the lattice's agent dimension."""
    return _dimension("agent_id", agent_id)


def exact_scope(agent_id: str | None, user_id: str | None, company_id: str | None) -> Cond:
    """Notes of exactly this (agent, user, company) scope (NULL matches NULL)."""
    return and_(eq("agent_id", agent_id), eq("user_id", user_id), eq("company_id", company_id))


def selection_filter(
    agent_id: str | None = None, user_id: str | None = None, company_id: str | None = None
) -> Cond:
    """Rows whose agent, user and company equal the ones named (an operator's listing or
    export selection); a column given as None is not filtered."""
    chosen = {"agent_id": agent_id, "user_id": user_id, "company_id": company_id}
    return and_(*(eq(name, value) for name, value in chosen.items() if value is not None))


def example_scope_filter(
    agent_id: str, user_id: str | None, company_id: str | None, *, shared_only: bool = False
) -> Cond:
    """The 4-level example scope (reference §3.2): the agent must be equal; user and
    company follow the lattice rule (equal or NULL; NULL when the run has none)."""
    if not agent_id:
        raise ValidationError("a scope filter needs an agent id")
    return and_(
        eq("agent_id", agent_id),
        _dimension("user_id", None if shared_only else user_id),
        _dimension("company_id", company_id),
    )


def primary_prefilter(run_primary_record: str | None) -> Cond:
    """Notes of the run's primary scope record or of none (only none without one)."""
    if not run_primary_record:
        return is_null("primary_scope_record_id")
    return or_(
        eq("primary_scope_record_id", run_primary_record), is_null("primary_scope_record_id")
    )


def multi_tenant_prefilter(
    run_primary_record: str | None, run_secondary: Mapping[str, Any] | None
) -> Cond:
    """A store filter every note accepted by :func:`~.match.matches_multi_tenant` satisfies.

    It narrows a search before the exact post-filter: without a run primary, only notes
    without a primary can match; with one, only notes of that primary or none; without run
    secondary scopes, only notes without secondary scopes can match.
    """
    secondary = None
    if not run_secondary:
        secondary = or_(
            is_null("secondary_scopes"), eq("secondary_scopes", "{}"), eq("secondary_scopes", "")
        )
    return and_(primary_prefilter(run_primary_record), secondary)


def post_filter_needed(
    run_primary_record: str | None, run_secondary: Mapping[str, Any] | None
) -> bool:
    """True when :func:`multi_tenant_prefilter` is not already exact, so candidates must be
    checked in Python (the run has secondary scopes or a primary scope)."""
    return bool(run_secondary) or bool(run_primary_record)
