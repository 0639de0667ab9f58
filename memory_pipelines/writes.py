"""The in-flight write path: the guard pipeline, the gate, audit and feedback (reference §2).

An agent's ``memoryWrites`` reach :func:`execute_writes` through ``MemoryService.write``.
Each request goes, strictly in order, through validation (the "type guard"), the scope
clamp, within-run idempotency, the per-run cap and the near-duplicate guard before it is
saved, and gets exactly one :class:`WriteResult` and one ``Memory Write`` audit step.

What it reads and writes:

* reads the agent (gate), the run's ``write_ledger`` rows (within-run state) and the
  notes table (vector shortlist of near-duplicates);
* writes notes (new ``written`` notes, ``superseded-own`` rewrites, ``deduped``
  reinforcements), ledger rows and ``run_steps`` audit rows.

Guarantees and decisions (beyond the reference, or where it is silent):

* ``type`` and ``scopeHint`` are exact, case-sensitive matches, as in the reference:
  ``'Preference'``/``'Context'`` and ``'user'``/``'agent'`` (``"preference"`` is rejected).
  A mapping without ``type`` is a ``'Preference'`` (the default of :class:`MemoryWrite`);
  keys a mapping holds besides ``note``/``type``/``scopeHint`` are ignored.
* Within-run state lives in the ``write_ledger`` table keyed by (agent, run id), never in
  process memory: a restarted service, or a second process continuing the run, gets the
  same dispositions. A run id another agent also uses has its own state: that agent's
  writes never consume this agent's cap or match its idempotency keys (CONTRACT §2.8). Ledger keys are ``scope_key|sha256(normalised text)`` (``written``,
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

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select

from memory_pipelines.agents import get_agent
from memory_pipelines.config import WriteConfig
from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import ValidationError
from memory_pipelines.judge import reads_as_instruction
from memory_pipelines.limits import clip_texts, limits, printable, unencodable_field
from memory_pipelines.notes import (
    IN_FLIGHT_TYPES,
    AgentConfig,
    AuthorType,
    Note,
    NoteStatus,
    ProtectionTier,
    RunContext,
    stable_id,
)
from memory_pipelines.scoping import SecondaryScopeConfig
from memory_pipelines.sources import agent_runs, conversations, injection_events
from memory_pipelines.store import Cond, Hit, and_, eq, injectable, is_null, not_null, or_
from memory_pipelines.text import normalize

log = logging.getLogger(__name__)



class MemoryWrite(BaseModel):
    """One ``memoryWrites`` request from an agent."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    note: str
    type: str = "Preference"
    scope_hint: str | None = Field(default=None, alias="scopeHint")


class WriteResult(BaseModel):
    """The outcome of one write request, in request order."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    disposition: str
    note_id: str | None = None
    reason: str = ""
    final_scope: dict[str, str | None] | None = None
    duration_ms: float = 0.0
    request: Any = None


class Disposition(StrEnum):
    """Every outcome a write request can have (reference §2.3 item 7, plus the gate)."""

    WRITTEN = "written"
    SUPERSEDED_OWN = "superseded-own"
    DEDUPED = "deduped"
    SKIPPED_DUPLICATE = "skipped-duplicate"
    SKIPPED_CAP = "skipped-cap"
    REJECTED_TYPE = "rejected-type"
    SKIPPED_DISABLED = "skipped-disabled"
    ERROR = "error"


DISPOSITIONS: tuple[str, ...] = tuple(d.value for d in Disposition)
#: Dispositions whose audit step is marked 'Failed' (the reason is the error message).
FAILED_DISPOSITIONS: frozenset[str] = frozenset(
    {Disposition.ERROR.value, Disposition.REJECTED_TYPE.value}
)

ALLOWED_TYPES: tuple[str, ...] = tuple(t.value for t in IN_FLIGHT_TYPES)
ALLOWED_SCOPE_HINTS: tuple[str, ...] = ("user", "agent")
NEAR_DUP_TOP_K = 3
FEEDBACK_TEXT_LIMIT = 120

STEP_TYPE = "Tool"
STEP_NAME = "Memory Write"
GATE_STEP_NAME = "Memory Writes: skipped (AllowMemoryWrite=false)"

REASON_WRITTEN = (
    "Memory recorded. It is active immediately and will be reviewed by the Memory Manager."
)
REASON_SUPERSEDED = "Updated the memory you recorded earlier this run (last write wins)."
REASON_DEDUPED = (
    "This memory already exists verbatim — its relevance was reinforced instead of duplicating it."
)
REASON_DUPLICATE = "This exact memory was already recorded this run. Do not re-submit it."
REASON_EMPTY = "Memory note text is empty."
REASON_AGENT_WIDE_CLAMPED = (
    "Saved for the current user only: this agent does not save agent-wide memories from"
    " this run (agentWideWrites={mode}{why})."
)
REASON_AGENT_WIDE_REJECTED = (
    "Agent-wide memories are not saved for this agent from a run without a company"
    " and user (agentWideWrites={mode}{why}): the memory would reach every context of the"
    " agent. Nothing was saved."
)
REASON_INSTRUCTION = (
    "Memory note reads as an instruction to the assistant (steering text, a role prefix or"
    " prompt markup), not a fact — nothing was saved. Record descriptive facts only."
)
REASON_DISABLED = (
    "AllowMemoryWrite=false — this agent does not have durable memory writes enabled;"
    " nothing was saved."
)
GATE_FEEDBACK = (
    "Memory write result: this agent does not have durable memory writes enabled — the"
    " requested memories were NOT saved. Do not emit memoryWrites again."
)

#: Ledger bookkeeping: one 'cap-slot' row per created note makes the cap hold for two
#: writers of one run. A slot key never contains '|', so it cannot collide with a text key.
SLOT_DISPOSITION = "cap-slot"
SLOT_KEY_PREFIX = "#slot:"

_MISSING = object()


def type_reason(note_type: object) -> str:
    """The reference's rejection reason for a type other than Preference/Context."""
    return (
        f"Memory type \"{note_type}\" is not allowed in-flight — only 'Preference' and"
        " 'Context'. Behavioral/constraint memories require Memory Manager or human promotion."
    )


def length_reason(limit: int, length: int) -> str:
    """The reference's rejection reason for a note longer than ``limit`` after trimming."""
    return f"Memory note exceeds the {limit}-character limit ({length}). Record one atomic fact per write."


def cap_reason(cap: int) -> str:
    """The reference's reason for a write skipped because the run's cap is full."""
    return (
        f"Per-run memory write cap ({cap}) reached. Remaining facts will be captured by the"
        " scheduled Memory Manager."
    )


def ledger_key(scope: str, normalised_text: str) -> str:
    """The within-run idempotency key: the scope key, then a digest of the normalised text.

    Equality of keys is equality of (scope, normalised text), as in the reference; the
    digest keeps the key short enough for any SQL primary key (a 2000-character note can
    exceed PostgreSQL's btree row limit).
    """
    digest = hashlib.sha256(normalised_text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{scope}|{digest}"


def scope_key(agent_id: str | None, user_id: str | None, company_id: str | None) -> str:
    """``agent|user|company`` with empty strings for nulls (same as ``Note.scope_key``)."""
    return "|".join(v or "" for v in (agent_id, user_id, company_id))


@dataclass(frozen=True)
class WriteScope:
    """The clamped scope a write lands at: always the running agent, never wider."""

    agent_id: str
    user_id: str | None
    company_id: str | None

    @property
    def key(self) -> str:
        return scope_key(self.agent_id, self.user_id, self.company_id)

    def as_dict(self) -> dict[str, str | None]:
        return {"agent_id": self.agent_id, "user_id": self.user_id, "company_id": self.company_id}


def clamp_scope(ctx: RunContext, scope_hint: str | None) -> WriteScope:
    """Clamp a write to the running agent; ``scopeHint='agent'`` drops the user.

    A hint can narrow the scope but never widen it: without a user in the context,
    ``'user'`` still yields a NULL user; the company always comes from the context.
    """
    user_id = None if scope_hint == "agent" else ctx.user_id
    return WriteScope(agent_id=ctx.agent_id, user_id=user_id, company_id=ctx.company_id)


@dataclass(frozen=True)
class AgentWidePolicy:
    """Which writes may land without a user for one batch: the agent's ``agentWideWrites``
    or its default (``default`` tells which, for the reasons)."""

    mode: str
    default: bool = False

    def allows(self, scope: WriteScope) -> bool:
        if scope.user_id is not None or self.mode == "allow":
            return True
        return self.mode == "company" and scope.company_id is not None

    def reason(self, template: str) -> str:
        why = ", the default for an agent that serves companies" if self.default else ""
        return template.format(mode=self.mode, why=why)


def agent_wide_policy(mem: MemoryContext, agent: AgentConfig, ctx: RunContext) -> AgentWidePolicy:
    """The agent's ``agentWideWrites`` setting, else 'company' when it serves companies
    (see the module notes) and 'allow' otherwise; checked only for a companyless run."""
    config = SecondaryScopeConfig.from_value(agent.scope_config)
    if config.agent_wide_writes:
        return AgentWidePolicy(config.agent_wide_writes)
    if ctx.company_id is None and (config.dimensions or serves_companies(mem, agent.agent_id)):
        return AgentWidePolicy("company", default=True)
    return AgentWidePolicy("allow", default=True)


def serves_companies(mem: MemoryContext, agent_id: str) -> bool:
    """Whether a conversation, run, injection or note of the agent names a company."""
    with mem.sources.begin() as c:
        for t in (agent_runs, conversations, injection_events):
            q = select(t.c.agent_id).where(t.c.agent_id == agent_id, t.c.company_id.is_not(None))
            if c.execute(q.limit(1)).first() is not None:
                return True
    return mem.store.notes.count(and_(eq("agent_id", agent_id), not_null("company_id"))) > 0


def near_dup_filter(scope: WriteScope, ctx: RunContext) -> Cond:
    """The notes a write may be compared with: injectable ones in the scope's lattice.

    Agent: the running agent or NULL. User and company: the clamped value or NULL when
    there is one, NULL only when there is none (no leak to other users or companies).
    With a primary scope record in the run, notes must have none or the same one.
    """
    conds = [injectable(), or_(eq("agent_id", scope.agent_id), is_null("agent_id"))]
    for column, value in (("user_id", scope.user_id), ("company_id", scope.company_id)):
        conds.append(is_null(column) if value is None else or_(eq(column, value), is_null(column)))
    if ctx.primary_scope_record_id is not None:
        conds.append(
            or_(
                is_null("primary_scope_record_id"),
                eq("primary_scope_record_id", ctx.primary_scope_record_id),
            )
        )
    return and_(*conds)


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class _Fields:
    """The raw fields of a request (``note`` is ``_MISSING`` when absent)."""

    shape_ok: bool
    note: Any
    type: Any
    scope_hint: Any

    def audit(self) -> dict[str, Any]:
        note = None if self.note is _MISSING else self.note
        return {"note": note, "type": self.type, "scopeHint": self.scope_hint}


@dataclass(frozen=True)
class _Valid:
    text: str  # trimmed
    type: str
    scope_hint: str | None


def _fields(request: Any) -> _Fields:
    if isinstance(request, MemoryWrite):
        return _Fields(True, request.note, request.type, request.scope_hint)
    if isinstance(request, Mapping):
        hint = request.get("scopeHint", request.get("scope_hint"))
        return _Fields(True, request.get("note", _MISSING), request.get("type", "Preference"), hint)
    return _Fields(False, _MISSING, None, None)


def _validate(request: Any, fields: _Fields, config: WriteConfig) -> _Valid | str:
    """The request's valid form, or the reason it is rejected."""
    if not fields.shape_ok:
        return (
            "Memory write request must be an object with a 'note' string,"
            f" got {type(request).__name__}."
        )
    for name, value in (("note", fields.note), ("type", fields.type), ("scopeHint", fields.scope_hint)):
        if isinstance(value, str) and unencodable_field(value, name):
            return (
                f"Memory write field '{name}' contains text that cannot be encoded as UTF-8"
                " (a lone surrogate); nothing was saved."
            )
    if fields.note is _MISSING:
        return "Memory write request has no 'note' field."
    if not isinstance(fields.note, str):
        return f"Memory note must be a string, got {type(fields.note).__name__}."
    if not isinstance(fields.type, str) or fields.type not in ALLOWED_TYPES:
        return type_reason(fields.type)
    if fields.scope_hint is not None and fields.scope_hint not in ALLOWED_SCOPE_HINTS:
        return (
            f"Memory scopeHint \"{fields.scope_hint}\" is not allowed — only 'user' or"
            " 'agent' (or leave it out)."
        )
    text = fields.note.strip()
    if not text:
        return REASON_EMPTY
    if len(text) > config.max_note_length:
        return length_reason(config.max_note_length, len(text))
    if reads_as_instruction(text):
        return REASON_INSTRUCTION
    return _Valid(text=text, type=fields.type, scope_hint=fields.scope_hint)


# --------------------------------------------------------------------------- ledger


@dataclass(frozen=True)
class RunLedger:
    """A run's within-run write state, read from the ``write_ledger`` table."""

    keys: dict[str, dict[str, Any]]
    own: dict[str, str]  # note id -> scope key, for notes this run created
    written: int

    @classmethod
    def load(cls, mem: MemoryContext, run_id: str, agent_id: str) -> RunLedger:
        keys: dict[str, dict[str, Any]] = {}
        own: dict[str, str] = {}
        written = 0
        for row in mem.sources.ledger_rows(run_id, agent_id):
            if row["disposition"] == SLOT_DISPOSITION:
                continue
            keys[row["key"]] = row
            if row["disposition"] == Disposition.WRITTEN:
                written += 1
                own[row["note_id"]] = row["scope_key"]
        return cls(keys=keys, own=own, written=written)


def _ledger_row(
    run_id: str, key: str, note_id: str, scope: WriteScope, disposition: str
) -> dict[str, Any]:
    return {
        "agent_id": scope.agent_id,
        "run_id": run_id,
        "key": key,
        "note_id": note_id,
        "scope_key": scope.key,
        "disposition": disposition,
    }


# --------------------------------------------------------------------------- pipeline


@dataclass(frozen=True)
class _Outcome:
    disposition: Disposition
    reason: str
    note_id: str | None = None
    final_scope: dict[str, str | None] | None = None


def _error(reason: str) -> _Outcome:
    return _Outcome(Disposition.ERROR, reason)


def _duplicate(note_id: str | None) -> _Outcome:
    return _Outcome(Disposition.SKIPPED_DUPLICATE, REASON_DUPLICATE, note_id)


def execute_writes(mem: MemoryContext, ctx: RunContext, writes: Sequence[Any]) -> list[WriteResult]:
    """Run a batch of in-flight writes through the gate and the guards, one after another.

    Raises ``UnknownAgentError`` for an unknown agent and ``ValidationError`` without a
    run id or when ``writes`` is not a list. A malformed request never raises: it gets
    ``rejected-type``. Returns one result per request, in order; an empty batch does
    nothing. Each processed request gets one audit step; a gated batch gets one in all.
    """
    agent = get_agent(mem.sources, ctx.agent_id)
    if not ctx.run_id:
        raise ValidationError("run_id is required for memory writes (RunContext.run_id)")
    if isinstance(writes, (str, bytes, bytearray, Mapping)) or not isinstance(writes, Sequence):
        raise ValidationError(
            f"writes must be a list of memory write requests, got {type(writes).__name__}"
        )
    requests = list(writes)
    if not requests:
        return []
    bound = limits().max_writes_per_request
    if len(requests) > bound:
        raise ValidationError(
            f"writes: at most {bound} memory writes per request, got {len(requests)};"
            " nothing was saved"
        )
    if not agent.allow_memory_write:
        return _skip_disabled(mem, ctx, requests)
    policy = agent_wide_policy(mem, agent, ctx)
    return [_execute_one(mem, ctx, request, policy) for request in requests]


def _skip_disabled(mem: MemoryContext, ctx: RunContext, requests: list[Any]) -> list[WriteResult]:
    """The execution-layer gate: nothing is saved; one audit step for the whole batch."""
    log.warning(
        "[MemoryWrites] LLM emitted %d memory write(s) but AllowMemoryWrite=false — skipping",
        len(requests),
    )
    results = [
        WriteResult(
            disposition=Disposition.SKIPPED_DISABLED.value, reason=REASON_DISABLED, request=r
        )
        for r in requests
    ]
    mem.sources.add_step(
        ctx.run_id or "",
        STEP_TYPE,
        GATE_STEP_NAME,
        input={"requestedWriteCount": len(requests)},
        output={"skipped": True, "reason": "AllowMemoryWrite=false"},
        status="Completed",
        agent_id=ctx.agent_id,
        user_id=ctx.user_id,
    )
    return results


def _execute_one(
    mem: MemoryContext, ctx: RunContext, request: Any, policy: AgentWidePolicy
) -> WriteResult:
    started_at = mem.now()
    t0 = time.perf_counter()
    fields = _fields(request)
    outcome = _guard(mem, ctx, request, fields, policy)
    failed = outcome.disposition.value in FAILED_DISPOSITIONS
    result = WriteResult(
        disposition=outcome.disposition.value,
        note_id=outcome.note_id,
        reason=outcome.reason,
        final_scope=outcome.final_scope,
        duration_ms=(time.perf_counter() - t0) * 1000.0,
        request=_echo(request, failed),
    )
    audit = printable(fields.audit())
    mem.sources.add_step(
        ctx.run_id or "",
        STEP_TYPE,
        STEP_NAME,
        input=clip_texts(audit) if failed else audit,
        output={
            "disposition": result.disposition,
            "noteId": result.note_id,
            "finalScope": result.final_scope,
            "reason": result.reason,
            "durationMs": round(result.duration_ms, 3),
        },
        status="Failed" if failed else "Completed",
        error_message=result.reason if failed else None,
        started_at=started_at,
        finished_at=mem.now(),
        agent_id=ctx.agent_id,
        user_id=ctx.user_id,
    )
    return result


def _echo(request: Any, failed: bool) -> Any:
    """The request as the result echoes it: unchanged unless it holds text that is not
    UTF-8, which is replaced (U+FFFD) so the result can always be sent back; a failed
    request's long texts are cut to a prefix plus their length and sha256."""
    plain = request.model_dump(by_alias=True) if isinstance(request, MemoryWrite) else request
    echo = printable(plain)
    if failed:
        echo = clip_texts(echo)
    return request if echo is plain else echo


def _guard(
    mem: MemoryContext, ctx: RunContext, request: Any, fields: _Fields, policy: AgentWidePolicy
) -> _Outcome:
    """Validation → scope clamp (and the agent-wide policy) → the guards and the save."""
    valid = _validate(request, fields, mem.write_config)
    if isinstance(valid, str):
        return _Outcome(Disposition.REJECTED_TYPE, valid)
    scope = clamp_scope(ctx, valid.scope_hint)
    if policy.allows(scope):
        return _guard_scoped(mem, ctx, valid, scope)
    if ctx.user_id is None:
        return _Outcome(Disposition.REJECTED_TYPE, policy.reason(REASON_AGENT_WIDE_REJECTED))
    scope = WriteScope(agent_id=scope.agent_id, user_id=ctx.user_id, company_id=scope.company_id)
    outcome = _guard_scoped(mem, ctx, valid, scope)
    if outcome.disposition in (
        Disposition.WRITTEN,
        Disposition.SUPERSEDED_OWN,
        Disposition.DEDUPED,
    ):
        clamped = f"{outcome.reason} {policy.reason(REASON_AGENT_WIDE_CLAMPED)}"
        outcome = _Outcome(outcome.disposition, clamped, outcome.note_id, outcome.final_scope)
    return outcome


def _guard_scoped(
    mem: MemoryContext, ctx: RunContext, valid: _Valid, scope: WriteScope
) -> _Outcome:
    """Idempotency → cap → near-duplicate guard → save, at the clamped scope."""
    config = mem.write_config
    run_id = ctx.run_id or ""
    norm = normalize(valid.text)
    key = ledger_key(scope.key, norm)

    ledger = RunLedger.load(mem, run_id, scope.agent_id)
    earlier = ledger.keys.get(key)
    if earlier is not None:
        return _duplicate(earlier["note_id"])
    at_cap = ledger.written >= config.max_writes_per_run

    new_id = stable_id(run_id, scope.key, norm)
    vector, hits = _near_duplicates(mem, ctx, scope, valid.text, exclude_id=new_id)
    own = next((h for h in hits if ledger.own.get(h.item.id) == scope.key), None)
    if own is not None:
        return _supersede(mem, run_id, key, scope, valid, own.item.id, vector)
    exact = next(
        (h for h in hits if h.item.id not in ledger.own and normalize(h.item.note) == norm), None
    )
    if exact is not None:
        return _dedupe(mem, run_id, key, scope, exact.item.id)
    if at_cap:  # the cap stops only a write that would create a note
        return _Outcome(Disposition.SKIPPED_CAP, cap_reason(config.max_writes_per_run))
    return _create(mem, ctx, key, scope, valid, new_id, vector, ledger)


def _near_duplicates(
    mem: MemoryContext, ctx: RunContext, scope: WriteScope, text: str, exclude_id: str
) -> tuple[np.ndarray | None, list[Hit[Note]]]:
    """The text's vector and its top-3 neighbours at or above the near-dup threshold.

    Fails open: if embedding or the search fails, a warning is logged and no
    neighbour is reported (the vector is None when embedding failed).
    ``exclude_id`` is the id this write would create, left out so a retry after a crash
    between saving and committing does not mistake its own row for an older note.
    """
    try:
        vector = np.asarray(mem.embed([text])[0], dtype=np.float32)
    except Exception as e:  # fail-open by design (reference §2.3 item 5e)
        log.warning("near-dup check failed — proceeding fail-open with the write: %s", e)
        return None, []
    try:
        hits = mem.store.notes.vector_search(
            vector,
            where=near_dup_filter(scope, ctx),
            k=NEAR_DUP_TOP_K,
            min_similarity=mem.write_config.near_dup_similarity,
            exclude_ids=[exclude_id],
        )
    except Exception as e:  # fail-open by design (reference §2.3 item 5e)
        log.warning("near-dup check failed — proceeding fail-open with the write: %s", e)
        return vector, []
    return vector, hits


def _lost_claim(
    mem: MemoryContext, run_id: str, scope: WriteScope, key: str, fallback_id: str | None
) -> _Outcome:
    """Another writer of this run committed the same key first: report it as a repeat."""
    row = RunLedger.load(mem, run_id, scope.agent_id).keys.get(key)
    return _duplicate(row["note_id"] if row else fallback_id)


def _supersede(
    mem: MemoryContext,
    run_id: str,
    key: str,
    scope: WriteScope,
    valid: _Valid,
    note_id: str,
    vector: np.ndarray | None,
) -> _Outcome:
    """Rewrite the run's own note (text and type; scope, status and TTL are kept)."""
    note = _load_note(mem, note_id)
    if note is None:
        return _error(f"Could not load own note {note_id} to supersede.")
    if not mem.sources.ledger_claim(
        [_ledger_row(run_id, key, note_id, scope, Disposition.SUPERSEDED_OWN.value)]
    ):
        return _lost_claim(mem, run_id, scope, key, note_id)
    try:
        vectors = None if vector is None else vector[None, :]
        mem.notebook.save_notes([note.model_copy(update={"note": valid.text, "type": valid.type})], vectors)
    except Exception as e:
        mem.sources.ledger_release(run_id, [key], scope.agent_id)
        return _error(f"Failed to supersede own note: {e}")
    final = WriteScope(note.agent_id or scope.agent_id, note.user_id, note.company_id)
    return _Outcome(Disposition.SUPERSEDED_OWN, REASON_SUPERSEDED, note_id, final.as_dict())


def _load_note(mem: MemoryContext, note_id: str) -> Note | None:
    """The stored note, or None when it is gone or the store cannot be read (logged)."""
    try:
        return mem.store.notes.get(note_id)
    except Exception as e:
        log.warning("could not load note %s: %s", note_id, e)
        return None


def _dedupe(mem: MemoryContext, run_id: str, key: str, scope: WriteScope, note_id: str) -> _Outcome:
    """Reinforce a pre-existing note restated verbatim: access_count + 1, last access now."""
    existing = _load_note(mem, note_id)
    if existing is None:
        return _error(f"Could not load existing note {note_id} to dedupe against.")
    if not mem.sources.ledger_claim(
        [_ledger_row(run_id, key, note_id, scope, Disposition.DEDUPED.value)]
    ):
        return _lost_claim(mem, run_id, scope, key, note_id)
    try:
        now = mem.now()
        stored = mem.store.notes.vectors([note_id]).get(note_id)
        vector = stored if stored is not None else mem.embed([existing.note])[0]
        updated = existing.model_copy(
            update={
                "access_count": existing.access_count + 1,
                "last_accessed_at": now,
                "updated_at": now,
            }
        )
        mem.store.notes.upsert([updated], np.asarray(vector, dtype=np.float32)[None, :])
    except Exception as e:
        mem.sources.ledger_release(run_id, [key], scope.agent_id)
        return _error(f"Failed to update existing note: {e}")
    return _Outcome(Disposition.DEDUPED, REASON_DEDUPED, note_id)


def _create(
    mem: MemoryContext,
    ctx: RunContext,
    key: str,
    scope: WriteScope,
    valid: _Valid,
    note_id: str,
    vector: np.ndarray | None,
    ledger: RunLedger,
) -> _Outcome:
    """Save a new provisional note, then commit it to the ledger (key row + cap slot)."""
    config = mem.write_config
    run_id = ctx.run_id or ""
    now = mem.now()
    note = Note(
        id=note_id,
        agent_id=scope.agent_id,
        user_id=scope.user_id,
        company_id=scope.company_id,
        note=valid.text,
        type=valid.type,
        status=NoteStatus.PROVISIONAL,
        author_type=AuthorType.AGENT,
        protection_tier=ProtectionTier.STANDARD,
        is_auto_generated=True,
        consolidation_count=0,
        access_count=1,
        source_run_id=ctx.run_id,
        source_conversation_id=ctx.conversation_id,
        source_conversation_detail_id=ctx.conversation_detail_id,
        primary_scope_entity_id=ctx.primary_scope_entity_id,
        primary_scope_record_id=ctx.primary_scope_record_id,
        secondary_scopes=ctx.secondary_scopes,
        expires_at=now + timedelta(days=config.default_ttl_days),
    )
    try:
        if vector is None:
            vector = np.asarray(mem.embed([valid.text])[0], dtype=np.float32)
        mem.notebook.save_notes([note], vector[None, :])
    except Exception as e:
        return _error(f"Failed to save memory: {e}")

    written = ledger.written
    for _ in range(config.max_writes_per_run + 2):
        if written >= config.max_writes_per_run:
            # Another writer of this run filled the cap after our check: undo our note.
            mem.store.notes.delete(eq("id", note_id))
            return _Outcome(Disposition.SKIPPED_CAP, cap_reason(config.max_writes_per_run))
        claimed = mem.sources.ledger_claim(
            [
                _ledger_row(run_id, key, note_id, scope, Disposition.WRITTEN.value),
                _ledger_row(
                    run_id, f"{SLOT_KEY_PREFIX}{written + 1}", note_id, scope, SLOT_DISPOSITION
                ),
            ]
        )
        if claimed:
            return _Outcome(Disposition.WRITTEN, REASON_WRITTEN, note_id, scope.as_dict())
        fresh = RunLedger.load(mem, run_id, scope.agent_id)
        row = fresh.keys.get(key)
        if row is not None:  # the same write committed by another writer of this run
            _collapse_duplicate_rows(mem, note, vector)
            return _duplicate(row["note_id"])
        written = fresh.written
    mem.store.notes.delete(eq("id", note_id))
    return _error("Failed to save memory: could not commit the write to the run's ledger.")


def _collapse_duplicate_rows(mem: MemoryContext, note: Note, vector: np.ndarray) -> None:
    """Leave one row for ``note.id`` after two writers inserted it at the same time.

    LanceDB's ``merge_insert`` of the same new id from two processes at once can keep
    both rows. Both saves finished before either writer committed to the ledger, so the
    writer that lost the commit can safely replace the copies with one row.
    """
    try:
        if mem.store.notes.count(eq("id", note.id)) > 1:
            keep = mem.store.notes.get(note.id) or note
            mem.store.notes.delete(eq("id", note.id))
            mem.store.notes.upsert([keep], vector[None, :])
    except Exception as e:  # the note exists at least once; a later write can retry
        log.warning("could not collapse duplicate rows of note %s: %s", note.id, e)


# --------------------------------------------------------------------------- feedback


def _feedback_text(request: Any) -> str:
    if isinstance(request, MemoryWrite):
        note: Any = request.note
    elif isinstance(request, Mapping):
        note = request.get("note")
    else:
        note = None
    text = "" if note is None else str(note)
    text = " ".join(text.strip().splitlines())
    if len(text) > FEEDBACK_TEXT_LIMIT:
        text = text[:FEEDBACK_TEXT_LIMIT] + "…"
    return text


def format_write_feedback(results: Sequence[WriteResult]) -> str:
    """The next-turn message reporting each write (reference §2.4); ``""`` for no results.

    Header "Memory write result:" (one write) or "Memory write results (N writes):", then
    one line per write: ``{i}. "{text}" — **{disposition}**: {reason}``, the text cut to
    120 characters plus "…" (line breaks in it become spaces). A batch the gate skipped
    gets the reference's gate message, which says that nothing was saved.
    """
    results = list(results)
    if not results:
        return ""
    if all(r.disposition == Disposition.SKIPPED_DISABLED for r in results):
        return GATE_FEEDBACK
    n = len(results)
    header = "Memory write result:" if n == 1 else f"Memory write results ({n} writes):"
    lines = [header]
    for i, r in enumerate(results, start=1):
        lines.append(f'{i}. "{_feedback_text(r.request)}" — **{r.disposition}**: {r.reason}')
    return "\n".join(lines)


# --------------------------------------------------------------------------- prompt


def write_instructions(agent: AgentConfig, config: WriteConfig) -> str:
    """The "Durable Memory" block of an agent's system prompt (reference §2.6).

    Empty for an agent with ``allow_memory_write=False``, so such an agent never learns
    the ``memoryWrites`` field (the prompt layer of the three-layer gate).
    """
    if not agent.allow_memory_write:
        return ""
    example = (
        '"memoryWrites": [\n'
        '  {"note": "User prefers bar charts over pie charts.", "type": "Preference"},\n'
        '  {"note": "The team deploys to production on Fridays.", "type": "Context",'
        ' "scopeHint": "agent"}\n'
        "]"
    )
    lines = [
        "## Durable Memory",
        "",
        "You can save durable facts and preferences so they are available in future runs."
        " Add a `memoryWrites` array to your JSON response, beside your other fields:",
        "",
        "```json",
        example,
        "```",
        "",
        "- Record a durable fact or preference as soon as the user states it.",
        "- Each write is one atomic, declarative, third-person fact of at most"
        f" {config.max_note_length} characters.",
        '- `type` is "Preference" or "Context" only. Instructions, rules and constraints are'
        " not memories and are rejected.",
        "- Transient task state does not belong here; keep it in your scratchpad.",
        '- `scopeHint` is optional: "agent" makes the fact apply to all users of this agent;'
        ' leave it out (or use "user") for a fact about the current user.',
        f"- At most {config.max_writes_per_run} new memories are saved per run. The framework"
        " dedupes, caps and reports every write, so do not resubmit one.",
        "- Results arrive on the NEXT turn. Never claim a memory was saved until its result"
        " says so. If a write was skipped or rejected, tell the user what was NOT saved.",
        "- Saved memories take effect immediately for future runs and are reviewed by the"
        " Memory Manager.",
    ]
    return "\n".join(lines)
