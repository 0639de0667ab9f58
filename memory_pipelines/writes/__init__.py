"""The in-flight write path: the guard pipeline, the gate, audit and feedback (reference §2).

An agent's ``memoryWrites`` reach :func:`execute_writes` through ``MemoryService.write``.
Each request goes, strictly in order, through validation (the "type guard"), the scope
clamp, within-run idempotency, the per-run cap and the near-duplicate guard before it is
saved, and gets exactly one :class:`WriteResult` and one ``Memory Write`` audit step.

What it reads and writes:

* reads the agent (gate), the run's ``write_ledger`` rows (within-run state) and the
  notes table (vector shortlist of near-duplicates);
* writes notes (new ``written`` notes, ``superseded-own`` rewrites, ``deduped``
  reinforcements), ledger rows, ``run_steps`` audit rows and the lifecycle event of each
  note it changes (``note_events``: ``created``, ``superseded``, ``reinforced``; see
  :mod:`memory_pipelines.writes.disposition_events`).

Guarantees and decisions (beyond the reference, or where it is silent):

* ``type`` and ``scopeHint`` are exact, case-sensitive matches, as in the reference:
  ``'Preference'``/``'Context'`` and ``'user'``/``'agent'`` (``"preference"`` is rejected).
  A mapping without ``type`` is a ``'Preference'`` (the default of :class:`MemoryWrite`);
  keys a mapping holds besides ``note``/``type``/``scopeHint`` are ignored.
* Within-run state lives in the ``write_ledger`` table keyed by (agent, run id), never in
  process memory: a restarted service, or a second process continuing the run, gets the
  same dispositions. A run id another agent also uses has its own state: that agent's
  writes never consume this agent's cap or match its idempotency keys. Within one agent
  a run belongs to the company and user that first used it: another context naming the
  run id is refused (``RunConflictError``, see :mod:`.ownership`). Ledger keys are ``scope_key|sha256(normalised text)`` (``written``,
  ``superseded-own`` and ``deduped`` rows) plus one ``cap-slot`` row per created note.
* A new note's id is ``stable_id(run_id, scope_key, normalised_text)``; the note is saved
  before its ledger rows are inserted (the commit point), so a crash in between followed
  by a retry rewrites the same row instead of adding a second one.
* Two writers of the same run: the ledger's primary key admits one commit per key and
  one note per cap slot; the loser re-reads the ledger and reports ``skipped-duplicate``
  or ``skipped-cap`` (removing the note it had saved when the cap was full).
* Agent-wide writes (``agentWideWrites`` in the agent's ``scope_config``): a write that
  would land without a user is seen by every context of the agent. "allow" is the
  guide's behaviour; "company" lets it land only within the context's company; "deny"
  never lets it land without a user. Where the setting does not allow it, the write is
  clamped to the context's user (its reason says so) or, without a user, rejected
  (``rejected-type``, nothing saved). The default is "company" for an agent that serves
  companies (a conversation, run, injection or note of it names a company, or its
  ``scope_config`` has secondary-scope dimensions) and "allow" otherwise, so a
  single-tenant agent keeps the guide's behaviour.
* The near-duplicate shortlist is restricted to the clamped scope's lattice; an absent
  user or company means notes with a NULL user or company, never another user's or
  company's note (reference §6.2 item 3). When the run carries a primary scope record,
  notes of another primary scope record are left out as well.
* The cap stops only writes that would create a note (§6.2 item 14): at the cap an exact
  restatement is still ``deduped`` and a rewrite of the run's own note still
  ``superseded-own``. A ``deduped`` key is registered, so repeating it in the same run is
  ``skipped-duplicate`` and reinforces the note once (§6.2 item 15).
* Concurrent reinforcements of one pre-existing note by different runs may lose an
  ``access_count`` increment (read-modify-write); notes are never lost or duplicated.
"""

from memory_pipelines.scope import scope_key
from memory_pipelines.scope.placement import (
    AgentWidePolicy,
    WriteScope,
    agent_wide_policy,
    clamp_scope,
    near_dup_filter,
    serves_companies,
)
from memory_pipelines.writes.execute import execute_writes
from memory_pipelines.writes.feedback import format_write_feedback, write_instructions
from memory_pipelines.writes.ledger import (
    SLOT_DISPOSITION,
    SLOT_KEY_PREFIX,
    RunLedger,
    ledger_key,
)
from memory_pipelines.writes.models import (
    ALLOWED_SCOPE_HINTS,
    ALLOWED_TYPES,
    DISPOSITIONS,
    FAILED_DISPOSITIONS,
    FEEDBACK_TEXT_LIMIT,
    GATE_FEEDBACK,
    GATE_STEP_NAME,
    NEAR_DUP_TOP_K,
    REASON_AGENT_WIDE_CLAMPED,
    REASON_AGENT_WIDE_REJECTED,
    REASON_DEDUPED,
    REASON_DISABLED,
    REASON_DUPLICATE,
    REASON_EMPTY,
    REASON_INSTRUCTION,
    REASON_SUPERSEDED,
    REASON_WRITTEN,
    STEP_NAME,
    STEP_TYPE,
    Disposition,
    MemoryWrite,
    WriteResult,
    cap_reason,
    length_reason,
    type_reason,
)

__all__ = [
    "ALLOWED_SCOPE_HINTS",
    "ALLOWED_TYPES",
    "DISPOSITIONS",
    "FAILED_DISPOSITIONS",
    "FEEDBACK_TEXT_LIMIT",
    "GATE_FEEDBACK",
    "GATE_STEP_NAME",
    "NEAR_DUP_TOP_K",
    "REASON_AGENT_WIDE_CLAMPED",
    "REASON_AGENT_WIDE_REJECTED",
    "REASON_DEDUPED",
    "REASON_DISABLED",
    "REASON_DUPLICATE",
    "REASON_EMPTY",
    "REASON_INSTRUCTION",
    "REASON_SUPERSEDED",
    "REASON_WRITTEN",
    "SLOT_DISPOSITION",
    "SLOT_KEY_PREFIX",
    "STEP_NAME",
    "STEP_TYPE",
    "AgentWidePolicy",
    "Disposition",
    "MemoryWrite",
    "RunLedger",
    "WriteResult",
    "WriteScope",
    "agent_wide_policy",
    "cap_reason",
    "clamp_scope",
    "execute_writes",
    "format_write_feedback",
    "ledger_key",
    "length_reason",
    "near_dup_filter",
    "scope_key",
    "serves_companies",
    "type_reason",
    "write_instructions",
]
