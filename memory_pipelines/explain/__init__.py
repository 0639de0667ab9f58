"""Explain "why does (or doesn't) my agent remember X?", one note about the topic at a time.

:func:`explain` follows the guide's troubleshooting order (memory-guide §6) for every
note about the topic, in any status, that the run context may see: the notes inside its
scope lattice and multi-tenant scopes (:mod:`memory_pipelines.scope`, the visibility
injection uses). Other users', companies' and tenants' notes are not searched, so their
text, ids and existence never reach an agent-facing caller (HTTP, MCP). The operator
view ``all_scopes`` (``memory-pipelines why --all-scopes``) searches every note of the
agent and the cross-agent ones (every agent's with ``all_agents`` too) and names the
rule that excludes each out-of-scope note:

1. the status, and whether it is injectable (``INJECTABLE_STATUSES``) and unexpired;
2. whether it is in scope for the run context, at which lattice level and label, or
   which rule of :mod:`memory_pipelines.scope` excludes it;
3. its rank under the agent's strategy, from the very retrieval the injection path runs
   (:func:`memory_pipelines.injection.select_notes`, with ``current_input`` or the topic
   as input), and whether that rank is within ``max_notes_to_inject``;
4. how it got there (author, source run/conversation/turn, the ``Memory Write`` audit
   steps naming it, the Memory Manager phase that created it) and what merged, revoked
   or archived it (its ``note_events``, ``consolidated_into_note_id`` followed to the
   survivor, ``derived_from_note_ids`` and absorbed notes followed back to the sources);
5. when its TTL or Ebbinghaus decay (:mod:`memory_pipelines.phases.ebbinghaus`) retires it.

It reads the note store, the audit tables and the clock and writes nothing: no
attribution row, no access bump. The result is a pydantic :class:`Explanation`
(JSON-serialisable); ``memory-pipelines why`` renders it as a table
(:mod:`memory_pipelines.apps.why_table`).
"""

from memory_pipelines.explain.find import (
    SUBSTRING_BONUS,
    find_notes,
    visible,
)
from memory_pipelines.explain.lineage import (
    WRITE_STEP_NAME,
    lifecycle_events,
)
from memory_pipelines.explain.models import (
    AgentSummary,
    Explanation,
    LifecycleEvent,
    Lineage,
    MatchInfo,
    NoteExplanation,
    Provenance,
    RankCheck,
    Retirement,
    ScopeCheck,
    WriteRecord,
)
from memory_pipelines.explain.rank import (
    EXTENDED_RANK,
    check_rank,
)
from memory_pipelines.explain.retirement import (
    check_retirement,
    days_to_floor,
)
from memory_pipelines.explain.scope_check import (
    check_scope,
)
from memory_pipelines.explain.why import (
    DEFAULT_LIMIT,
    explain,
)

__all__ = [
    "DEFAULT_LIMIT",
    "EXTENDED_RANK",
    "SUBSTRING_BONUS",
    "WRITE_STEP_NAME",
    "AgentSummary",
    "Explanation",
    "LifecycleEvent",
    "Lineage",
    "MatchInfo",
    "NoteExplanation",
    "Provenance",
    "RankCheck",
    "Retirement",
    "ScopeCheck",
    "WriteRecord",
    "check_rank",
    "check_retirement",
    "check_scope",
    "days_to_floor",
    "explain",
    "find_notes",
    "lifecycle_events",
    "visible",
]
