"""Who sees which note: the 8-level scope lattice and the multi-tenant matcher (reference §3.3).

Pure functions, reusable by every module that must respect scope (injection, dedupe,
consolidation, contradiction pairing).

**Lattice (agent / user / company).** One rule for every strategy and every dimension:
when the run has a value, a note's value must equal it or be NULL; when the run has no
value, the note's value must be NULL. An absent user therefore never means "anyone's"
(the reference's semantic path did that, §6.2 item 3). :func:`note_scope_filter` renders
the rule as a LanceDB filter so vector and full-text searches are prefiltered;
:func:`in_lattice` is the same rule in Python.

**Multi-tenant layer (primary + secondary scopes).** :func:`matches_multi_tenant` follows
§3.3: a note with neither a primary scope nor secondary scopes is global and always
matches; a run without a primary scope sees only global notes (or, with
``allowSecondaryOnly`` and run secondary scopes, notes without a primary whose secondary
scopes pass the per-dimension rule); a run with a primary scope sees notes of the same
primary (org-level when they have no secondary scopes, otherwise the per-dimension rule).
The layer applies to every run: a run that carries no multi-tenant scope sees only notes
that carry none either (absent means NULL here too). Malformed note JSON never matches.
:func:`multi_tenant_prefilter` is a necessary condition of the matcher that the store can
evaluate, used to narrow searches before the exact Python post-filter.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memory_pipelines.errors import ConfigError, ValidationError
from memory_pipelines.store import Cond, and_, eq, is_null, or_

CASCADING = "cascading"
STRICT = "strict"
INHERITANCE_MODES: tuple[str, ...] = (CASCADING, STRICT)
#: ``agentWideWrites`` values: "allow" (the guide: a write may land agent-wide, without a
#: user or company), "company" (agent-wide only within the context's company), "deny"
#: (never without a user).
AGENT_WIDE_WRITES: tuple[str, ...] = ("allow", "company", "deny")

#: Labels of the 8 lattice levels, most specific first (reference §3.3), keyed by which of
#: (agent, user, company) the note sets.
LEVEL_LABELS: dict[tuple[bool, bool, bool], tuple[int, str]] = {
    (True, True, True): (1, "Agent + User + Company specific"),
    (True, True, False): (2, "Agent + User specific"),
    (True, False, True): (3, "Agent + Company specific"),
    (False, True, True): (4, "User + Company specific"),
    (True, False, False): (5, "Agent-specific"),
    (False, True, False): (6, "User-specific"),
    (False, False, True): (7, "Company-wide"),
    (False, False, False): (8, "Global"),
}
SECONDARY_LABEL = "User-specific (most specific)"
PRIMARY_LABEL = "Company-level"


class ScopeValidationError(ValidationError):
    """A run's secondary scopes fail the agent's ``strictValidation`` rules."""


# --------------------------------------------------------------------------- lattice


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
    """The rule of :func:`note_scope_filter` evaluated in Python for one note."""
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


def lattice_level(note_agent: str | None, note_user: str | None, note_company: str | None) -> int:
    """The lattice level (1 most specific .. 8 global) of a note's scope columns."""
    return LEVEL_LABELS[(bool(note_agent), bool(note_user), bool(note_company))][0]


def scope_label(item: Any) -> str:
    """The ``Scope:`` label printed under a note (reference §3.4 item 4).

    With a primary scope: 'User-specific (most specific)' when the note also has
    non-empty secondary scopes, else 'Company-level'. Otherwise the lattice label.
    """
    if getattr(item, "primary_scope_record_id", None):
        parsed = parse_scopes(getattr(item, "secondary_scopes", None))
        return SECONDARY_LABEL if parsed else PRIMARY_LABEL
    key = (
        bool(getattr(item, "agent_id", None)),
        bool(getattr(item, "user_id", None)),
        bool(getattr(item, "company_id", None)),
    )
    return LEVEL_LABELS[key][1]


# --------------------------------------------------------------------------- multi-tenant


@dataclass(frozen=True)
class ScopeDimension:
    """One secondary-scope dimension of an agent's ``SecondaryScopeConfig``."""

    name: str
    entity_id: str | None = None
    required: bool = False
    inheritance_mode: str | None = None
    default_value: Any = None
    description: str | None = None


@dataclass(frozen=True)
class SecondaryScopeConfig:
    """An agent's multi-tenant settings, parsed from ``AgentConfig.scope_config``.

    Keys are read in camelCase (as the reference stores them) or snake_case.
    ``shared_only`` (``sharedOnly``) is this project's addition: inject only notes and
    examples without a user. So is ``agent_wide_writes`` (``agentWideWrites``): which
    in-flight writes may land without a user (one of :data:`AGENT_WIDE_WRITES`, None for
    the default; see :mod:`memory_pipelines.writes`).
    """

    dimensions: tuple[ScopeDimension, ...] = ()
    default_inheritance_mode: str = CASCADING
    allow_secondary_only: bool = False
    strict_validation: bool = False
    shared_only: bool = False
    agent_wide_writes: str | None = None
    _modes: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_value(cls, value: Mapping[str, Any] | str | None) -> SecondaryScopeConfig:
        """Parse a config dict (or its JSON text); ``ConfigError`` when it is malformed."""
        if value is None or value == "":
            return cls()
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as e:
                raise ConfigError(f"scope_config is not valid JSON: {e}") from e
        if not isinstance(value, Mapping):
            raise ConfigError("scope_config must be an object")

        def get(camel: str, snake: str, default: Any) -> Any:
            if camel in value:
                return value[camel]
            return value.get(snake, default)

        default_mode = get("defaultInheritanceMode", "default_inheritance_mode", None) or CASCADING
        if default_mode not in INHERITANCE_MODES:
            raise ConfigError(f"unknown defaultInheritanceMode {default_mode!r}")
        raw_dims = get("dimensions", "dimensions", None) or []
        if not isinstance(raw_dims, Sequence) or isinstance(raw_dims, str):
            raise ConfigError("scope_config.dimensions must be a list")
        dims: list[ScopeDimension] = []
        for d in raw_dims:
            if not isinstance(d, Mapping) or not isinstance(d.get("name"), str) or not d["name"]:
                raise ConfigError(f"invalid scope dimension {d!r}: a name is required")
            mode = d.get("inheritanceMode", d.get("inheritance_mode"))
            if mode is not None and mode not in INHERITANCE_MODES:
                raise ConfigError(f"unknown inheritanceMode {mode!r} for dimension {d['name']!r}")
            dims.append(
                ScopeDimension(
                    name=d["name"],
                    entity_id=d.get("entityId", d.get("entity_id")),
                    required=bool(d.get("required", False)),
                    inheritance_mode=mode,
                    default_value=d.get("defaultValue", d.get("default_value")),
                    description=d.get("description"),
                )
            )
        modes = {d.name: d.inheritance_mode or default_mode for d in dims}
        agent_wide = get("agentWideWrites", "agent_wide_writes", None)
        if agent_wide is not None and agent_wide not in AGENT_WIDE_WRITES:
            raise ConfigError(
                f"unknown agentWideWrites {agent_wide!r}: one of {', '.join(AGENT_WIDE_WRITES)}"
            )
        return cls(
            dimensions=tuple(dims),
            default_inheritance_mode=default_mode,
            allow_secondary_only=bool(get("allowSecondaryOnly", "allow_secondary_only", False)),
            strict_validation=bool(get("strictValidation", "strict_validation", False)),
            shared_only=bool(get("sharedOnly", "shared_only", False)),
            agent_wide_writes=agent_wide,
            _modes=modes,
        )

    def mode_for(self, dimension: str) -> str:
        """The dimension's ``inheritanceMode``, else the default, else 'cascading'."""
        return self._modes.get(dimension) or self.default_inheritance_mode or CASCADING


def parse_scopes(value: Any) -> dict[str, Any] | None:
    """A note's secondary scopes as a dict (None when empty); ``ValueError`` if malformed."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        value = json.loads(value)
    if not isinstance(value, Mapping):
        raise ValueError("secondary scopes must be a JSON object")
    for v in value.values():
        if isinstance(v, (Mapping, list, tuple)) or v is None:
            raise ValueError("a secondary scope value must be a scalar")
    return dict(value) or None


def resolve_run_scopes(
    run_secondary: Mapping[str, Any] | None, config: SecondaryScopeConfig
) -> dict[str, Any] | None:
    """The run's secondary scopes with dimension defaults filled in.

    With ``strictValidation``, an unknown dimension or a missing required one (without a
    default) raises :class:`ScopeValidationError`.
    """
    scopes = {k: v for k, v in (run_secondary or {}).items() if v is not None}
    for d in config.dimensions:
        if d.name not in scopes and d.default_value is not None:
            scopes[d.name] = d.default_value
    if config.strict_validation and config.dimensions:
        known = {d.name for d in config.dimensions}
        unknown = sorted(set(scopes) - known)
        if unknown:
            raise ScopeValidationError(
                f"unknown secondary scope dimension(s): {', '.join(unknown)}"
            )
        missing = sorted(d.name for d in config.dimensions if d.required and d.name not in scopes)
        if missing:
            raise ScopeValidationError(f"missing required secondary scope(s): {', '.join(missing)}")
    return scopes or None


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
    ``run_secondary`` should come from :func:`resolve_run_scopes`.
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


def multi_tenant_prefilter(
    run_primary_record: str | None, run_secondary: Mapping[str, Any] | None
) -> Cond:
    """A store filter every note accepted by :func:`matches_multi_tenant` satisfies.

    It narrows a search before the exact post-filter: without a run primary, only notes
    without a primary can match; with one, only notes of that primary or none; without run
    secondary scopes, only notes without secondary scopes can match.
    """
    primary = (
        is_null("primary_scope_record_id")
        if not run_primary_record
        else or_(
            eq("primary_scope_record_id", run_primary_record), is_null("primary_scope_record_id")
        )
    )
    secondary = None
    if not run_secondary:
        secondary = or_(
            is_null("secondary_scopes"), eq("secondary_scopes", "{}"), eq("secondary_scopes", "")
        )
    return and_(primary, secondary)


def post_filter_needed(
    run_primary_record: str | None, run_secondary: Mapping[str, Any] | None
) -> bool:
    """True when :func:`multi_tenant_prefilter` is not already exact, so candidates must be
    checked in Python (the run has secondary scopes or a primary scope)."""
    return bool(run_secondary) or bool(run_primary_record)
