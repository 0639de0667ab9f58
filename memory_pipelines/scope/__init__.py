"""Who sees which note: the project's one home for scope, its security boundary.

* :mod:`.lattice`: the 8-level agent / user / company lattice, its levels and labels;
* :mod:`.tenancy`: the multi-tenant rules of an agent (secondary-scope dimensions,
  inheritance modes, ``strictValidation``, ``sharedOnly``, ``agentWideWrites``);
* :mod:`.prefilter`: the lattice and the multi-tenant layer as LanceDB where-clauses, so
  vector, full-text and scan reads are narrowed before anything is ranked;
* :mod:`.match`: the same rules in Python for one note (the exact post-filter);
* :mod:`.run`: :class:`RunScope`, a run's resolved scope, which inject, explain, history,
  export, the memory browser and the proxy read through;
* :mod:`.placement`: where a write lands (the clamped scope, the agent-wide policy, the
  near-duplicate lattice);
* :mod:`.binding`: what an API key may see and act for (its company, agent, user and
  multi-tenant binding) in the operator's listings, history and the memory browser.

Companyless users and company-bound keys: a caller bound to a company, not to a user
(``RunContext.reads_companyless_user_notes`` False), never reads, nor compares a write
with, the user's notes stored without a company; such a note belongs to no company.
"""

from memory_pipelines.scope.lattice import (
    LEVEL_LABELS,
    PRIMARY_LABEL,
    SECONDARY_LABEL,
    lattice_level,
    scope_key,
    scope_label,
)
from memory_pipelines.scope.match import (
    dimensions_match,
    in_lattice,
    item_matches,
    matches_multi_tenant,
)
from memory_pipelines.scope.prefilter import (
    agent_filter,
    exact_scope,
    example_scope_filter,
    multi_tenant_prefilter,
    note_scope_filter,
    post_filter_needed,
    primary_prefilter,
    selection_filter,
)
from memory_pipelines.scope.run import RunScope, agent_scope_config, visible
from memory_pipelines.scope.tenancy import (
    AGENT_WIDE_WRITES,
    CASCADING,
    INHERITANCE_MODES,
    STRICT,
    ScopeDimension,
    ScopeValidationError,
    SecondaryScopeConfig,
    parse_scopes,
    resolve_run_scopes,
)

__all__ = [
    "AGENT_WIDE_WRITES",
    "CASCADING",
    "INHERITANCE_MODES",
    "LEVEL_LABELS",
    "PRIMARY_LABEL",
    "SECONDARY_LABEL",
    "STRICT",
    "RunScope",
    "ScopeDimension",
    "ScopeValidationError",
    "SecondaryScopeConfig",
    "agent_filter",
    "agent_scope_config",
    "dimensions_match",
    "exact_scope",
    "example_scope_filter",
    "in_lattice",
    "item_matches",
    "lattice_level",
    "matches_multi_tenant",
    "multi_tenant_prefilter",
    "note_scope_filter",
    "parse_scopes",
    "post_filter_needed",
    "primary_prefilter",
    "resolve_run_scopes",
    "scope_key",
    "selection_filter",
    "scope_label",
    "visible",
]
