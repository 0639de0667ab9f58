"""Scope in memory: the same rules as :mod:`.prefilter`, evaluated in Python for one note.

:func:`in_lattice` is the lattice (:mod:`.lattice`) with the company-bound rule.
:func:`matches_multi_tenant` is the multi-tenant layer of reference §3.3: a note with
neither a primary scope nor secondary scopes is global and always matches; a run without a
primary scope sees only global notes (or, with ``allowSecondaryOnly`` and run secondary
scopes, notes without a primary whose secondary scopes pass the per-dimension rule); a run
with a primary scope sees notes of the same primary (org-level when they have no secondary
scopes, otherwise the per-dimension rule). The layer applies to every run: a run that
carries no multi-tenant scope sees only notes that carry none either (absent means NULL
here too). Malformed note JSON never matches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memory_pipelines.scope.tenancy import STRICT, SecondaryScopeConfig, parse_scopes


def _dim_ok(note_value: str | None, run_value: str | None) -> bool:
    return note_value is None or (run_value is not None and note_value == run_value)


def in_lattice(
    note_agent: str | None,
    note_user: str | None,
    note_company: str | None,
    agent_id: str,
    user_id: str | None,
    company_id: str | None,
    *,
    shared_only: bool = False,
    companyless_users: bool = True,
) -> bool:
    """The rule of :func:`~.prefilter.note_scope_filter` evaluated in Python for one note."""
    if (
        not companyless_users
        and note_user is not None
        and note_company is None
        and company_id is not None
    ):
        return False
    return (
        _dim_ok(note_agent, agent_id)
        and _dim_ok(note_user, None if shared_only else user_id)
        and _dim_ok(note_company, company_id)
    )


def _value_matches(note_value: Any, run_value: Any) -> bool:
    if isinstance(run_value, (list, tuple, set, frozenset)):
        return str(note_value) in {str(v) for v in run_value}
    return str(note_value) == str(run_value)


def dimensions_match(
    note_scopes: Mapping[str, Any], run_scopes: Mapping[str, Any], config: SecondaryScopeConfig
) -> bool:
    """The per-dimension rule: strict dimensions need the same run value (and a strict run
    dimension must be on the note); cascading ones fail only on a different run value."""
    for name, note_value in note_scopes.items():
        run_value = run_scopes.get(name)
        if config.mode_for(name) == STRICT:
            if run_value is None or not _value_matches(note_value, run_value):
                return False
        elif run_value is not None and not _value_matches(note_value, run_value):
            return False
    return all(name in note_scopes for name in run_scopes if config.mode_for(name) == STRICT)


def matches_multi_tenant(
    note_primary_entity: str | None,
    note_primary_record: str | None,
    note_secondary: Any,
    run_primary_entity: str | None,
    run_primary_record: str | None,
    run_secondary: Mapping[str, Any] | None,
    config: SecondaryScopeConfig,
) -> bool:
    """Whether a note passes the multi-tenant layer for a run (reference §3.3).

    ``note_secondary`` may be a dict or its JSON text; malformed JSON never matches.
    ``run_secondary`` should come from :func:`~.tenancy.resolve_run_scopes`.
    """
    try:
        note_scopes = parse_scopes(note_secondary)
    except ValueError:
        return False
    if not note_primary_record and not note_scopes:
        return True  # global
    if not run_primary_record:
        if config.allow_secondary_only and run_secondary and not note_primary_record:
            return dimensions_match(note_scopes or {}, run_secondary, config)
        return False
    if note_primary_record != run_primary_record:
        return False
    if note_primary_entity and run_primary_entity and note_primary_entity != run_primary_entity:
        return False
    if not note_scopes:
        return True  # org-level
    if not run_secondary:
        return False
    return dimensions_match(note_scopes, run_secondary, config)


def item_matches(
    item: Any,
    run_primary_entity: str | None,
    run_primary_record: str | None,
    run_secondary: Mapping[str, Any] | None,
    config: SecondaryScopeConfig,
) -> bool:
    """:func:`matches_multi_tenant` for a ``Note``/``Example`` (or any object with the columns)."""
    return matches_multi_tenant(
        getattr(item, "primary_scope_entity_id", None),
        getattr(item, "primary_scope_record_id", None),
        getattr(item, "secondary_scopes", None),
        run_primary_entity,
        run_primary_record,
        run_secondary,
        config,
    )
