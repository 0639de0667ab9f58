"""The 8-level scope lattice (agent / user / company, reference §3.3): which level a note's
scope columns sit at, its label, and the ``agent|user|company`` key a write is ledgered
under.

The lattice rule itself, one for every strategy and every dimension: when the run has a
value, a note's value must equal it or be NULL; when the run has no value, the note's value
must be NULL. An absent user therefore never means "anyone's". :mod:`.prefilter` renders
the rule as a store filter, :mod:`.match` evaluates it in Python.
"""

from __future__ import annotations

from typing import Any

from memory_pipelines.scope.tenancy import parse_scopes

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


def scope_key(agent_id: str | None, user_id: str | None, company_id: str | None) -> str:
    """``agent|user|company`` with empty strings for nulls (same as ``Note.scope_key``)."""
    return "|".join(v or "" for v in (agent_id, user_id, company_id))
