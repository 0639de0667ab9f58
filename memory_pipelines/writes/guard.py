"""The guard pipeline, one write at a time: :func:`execute_each` runs each request through
validation, the scope clamp, idempotency, the cap and the near-duplicate guard, saves it
and records its audit step; the pieces both write paths share (the clamp, outcomes,
results, audit steps, the new note) live here too."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from memory_pipelines.context import MemoryContext
from memory_pipelines.limits import clip_texts, printable
from memory_pipelines.notes import (
    AuthorType,
    Note,
    NoteStatus,
    ProtectionTier,
    RunContext,
    stable_id,
)
from memory_pipelines.scope.placement import (
    AgentWidePolicy,
    WriteScope,
    clamp_scope,
    near_dup_filter,
)
from memory_pipelines.store import Hit, eq
from memory_pipelines.text import normalize
from memory_pipelines.writes.disposition_events import (
    created_event,
    reinforced_event,
    superseded_event,
)
from memory_pipelines.writes.ledger import (
    SLOT_DISPOSITION,
    SLOT_KEY_PREFIX,
    RunLedger,
    ledger_key,
    ledger_row,
)
from memory_pipelines.writes.models import (
    FAILED_DISPOSITIONS,
    GATE_STEP_NAME,
    NEAR_DUP_TOP_K,
    REASON_AGENT_WIDE_CLAMPED,
    REASON_AGENT_WIDE_REJECTED,
    REASON_DEDUPED,
    REASON_DISABLED,
    REASON_DUPLICATE,
    REASON_SUPERSEDED,
    REASON_WRITTEN,
    STEP_NAME,
    STEP_TYPE,
    Disposition,
    MemoryWrite,
    WriteResult,
    cap_reason,
)
from memory_pipelines.writes.validate import (
    RequestFields,
    ValidRequest,
    request_fields,
    validate_request,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    disposition: Disposition
    reason: str
    note_id: str | None = None
    final_scope: dict[str, str | None] | None = None


def error_outcome(reason: str) -> Outcome:
    return Outcome(Disposition.ERROR, reason)


def duplicate_outcome(note_id: str | None) -> Outcome:
    return Outcome(Disposition.SKIPPED_DUPLICATE, REASON_DUPLICATE, note_id)


def execute_each(
    mem: MemoryContext, ctx: RunContext, requests: Sequence[Any], policy: AgentWidePolicy
) -> list[WriteResult]:
    """The per-write path: each request embeds, searches, saves and commits on its own.

    The reference semantics the batched path (:mod:`memory_pipelines.writes.batch`)
    reproduces; the batched path falls back to it when its commit cannot go through as
    planned (an embedding or save failure, or another writer of the run committing first).
    """
    return [_execute_one(mem, ctx, request, policy) for request in requests]


def skip_disabled(mem: MemoryContext, ctx: RunContext, requests: list[Any]) -> list[WriteResult]:
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
    fields = request_fields(request)
    outcome = guard(mem, ctx, request, fields, policy, lambda v, s: _guard_scoped(mem, ctx, v, s))
    result = write_result(request, outcome, (time.perf_counter() - t0) * 1000.0)
    mem.sources.add_step(**write_step(ctx, fields, result, started_at, mem.now()))
    return result


def write_result(request: Any, outcome: Outcome, duration_ms: float) -> WriteResult:
    """The result a request gets for its outcome."""
    failed = outcome.disposition.value in FAILED_DISPOSITIONS
    return WriteResult(
        disposition=outcome.disposition.value,
        note_id=outcome.note_id,
        reason=outcome.reason,
        final_scope=outcome.final_scope,
        duration_ms=duration_ms,
        request=echo_request(request, failed),
    )


def write_step(
    ctx: RunContext,
    fields: RequestFields,
    result: WriteResult,
    started_at: datetime,
    finished_at: datetime,
) -> dict[str, Any]:
    """The keyword arguments of the request's ``Memory Write`` audit step (``add_step``)."""
    failed = result.disposition in FAILED_DISPOSITIONS
    audit = printable(fields.audit())
    return {
        "run_id": ctx.run_id or "",
        "step_type": STEP_TYPE,
        "step_name": STEP_NAME,
        "input": clip_texts(audit) if failed else audit,
        "output": {
            "disposition": result.disposition,
            "noteId": result.note_id,
            "finalScope": result.final_scope,
            "reason": result.reason,
            "durationMs": round(result.duration_ms, 3),
        },
        "status": "Failed" if failed else "Completed",
        "error_message": result.reason if failed else None,
        "started_at": started_at,
        "finished_at": finished_at,
        "agent_id": ctx.agent_id,
        "user_id": ctx.user_id,
    }


def echo_request(request: Any, failed: bool) -> Any:
    """The request as the result echoes it: unchanged unless it holds text that is not
    UTF-8, which is replaced (U+FFFD) so the result can always be sent back; a failed
    request's long texts are cut to a prefix plus their length and sha256."""
    plain = request.model_dump(by_alias=True) if isinstance(request, MemoryWrite) else request
    echo = printable(plain)
    if failed:
        echo = clip_texts(echo)
    return request if echo is plain else echo


def guard(
    mem: MemoryContext,
    ctx: RunContext,
    request: Any,
    fields: RequestFields,
    policy: AgentWidePolicy,
    scoped: Callable[[ValidRequest, WriteScope], Outcome],
) -> Outcome:
    """Validation → scope clamp (and the agent-wide policy) → ``scoped``: the guards and
    the save at the clamped scope (done at once, or planned for a batch commit)."""
    valid = validate_request(request, fields, mem.write_config)
    if isinstance(valid, str):
        return Outcome(Disposition.REJECTED_TYPE, valid)
    scope = clamp_scope(ctx, valid.scope_hint)
    if policy.allows(scope):
        return scoped(valid, scope)
    if ctx.user_id is None:
        return Outcome(Disposition.REJECTED_TYPE, policy.reason(REASON_AGENT_WIDE_REJECTED))
    scope = WriteScope(agent_id=scope.agent_id, user_id=ctx.user_id, company_id=scope.company_id)
    outcome = scoped(valid, scope)
    if outcome.disposition in (
        Disposition.WRITTEN,
        Disposition.SUPERSEDED_OWN,
        Disposition.DEDUPED,
    ):
        clamped = f"{outcome.reason} {policy.reason(REASON_AGENT_WIDE_CLAMPED)}"
        outcome = Outcome(outcome.disposition, clamped, outcome.note_id, outcome.final_scope)
    return outcome


def _guard_scoped(
    mem: MemoryContext, ctx: RunContext, valid: ValidRequest, scope: WriteScope
) -> Outcome:
    """Idempotency → cap → near-duplicate guard → save, at the clamped scope."""
    config = mem.write_config
    run_id = ctx.run_id or ""
    norm = normalize(valid.text)
    key = ledger_key(scope.key, norm)

    ledger = RunLedger.load(mem, run_id, scope.agent_id)
    earlier = ledger.keys.get(key)
    if earlier is not None:
        return duplicate_outcome(earlier["note_id"])
    at_cap = ledger.written >= config.max_writes_per_run

    new_id = stable_id(run_id, scope.key, norm)
    vector, hits = _near_duplicates(mem, ctx, scope, valid.text, exclude_id=new_id)
    own = next((h for h in hits if ledger.own.get(h.item.id) == scope.key), None)
    if own is not None:
        return _supersede(mem, run_id, key, scope, valid, own, vector)
    exact = next(
        (h for h in hits if h.item.id not in ledger.own and normalize(h.item.note) == norm), None
    )
    if exact is not None:
        return _dedupe(mem, run_id, key, scope, exact)
    if at_cap:  # the cap stops only a write that would create a note
        return Outcome(Disposition.SKIPPED_CAP, cap_reason(config.max_writes_per_run))
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
) -> Outcome:
    """Another writer of this run committed the same key first: report it as a repeat."""
    row = RunLedger.load(mem, run_id, scope.agent_id).keys.get(key)
    return duplicate_outcome(row["note_id"] if row else fallback_id)


def _supersede(
    mem: MemoryContext,
    run_id: str,
    key: str,
    scope: WriteScope,
    valid: ValidRequest,
    own: Hit[Note],
    vector: np.ndarray | None,
) -> Outcome:
    """Rewrite the run's own note (text and type; scope, status and TTL are kept), with
    its ``superseded`` event."""
    note_id = own.item.id
    note = load_note(mem, note_id)
    if note is None:
        return error_outcome(f"Could not load own note {note_id} to supersede.")
    if not mem.sources.ledger_claim(
        [ledger_row(run_id, key, note_id, scope, Disposition.SUPERSEDED_OWN.value)]
    ):
        return _lost_claim(mem, run_id, scope, key, note_id)
    try:
        vectors = None if vector is None else vector[None, :]
        after = note.model_copy(update={"note": valid.text, "type": valid.type})
        event = superseded_event(note, after, run_id, similarity=own.score)
        mem.notebook.save_notes([after], vectors, events=[event])
    except Exception as e:
        mem.sources.ledger_release(run_id, [key], scope.agent_id)
        return error_outcome(f"Failed to supersede own note: {e}")
    final = WriteScope(note.agent_id or scope.agent_id, note.user_id, note.company_id)
    return Outcome(Disposition.SUPERSEDED_OWN, REASON_SUPERSEDED, note_id, final.as_dict())


def load_note(mem: MemoryContext, note_id: str) -> Note | None:
    """The stored note, or None when it is gone or the store cannot be read (logged)."""
    try:
        return mem.store.notes.get(note_id)
    except Exception as e:
        log.warning("could not load note %s: %s", note_id, e)
        return None


def _dedupe(
    mem: MemoryContext, run_id: str, key: str, scope: WriteScope, exact: Hit[Note]
) -> Outcome:
    """Reinforce a pre-existing note restated verbatim: access_count + 1, last access now
    (its ``reinforced`` event is recorded right after the save)."""
    note_id = exact.item.id
    existing = load_note(mem, note_id)
    if existing is None:
        return error_outcome(f"Could not load existing note {note_id} to dedupe against.")
    if not mem.sources.ledger_claim(
        [ledger_row(run_id, key, note_id, scope, Disposition.DEDUPED.value)]
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
        return error_outcome(f"Failed to update existing note: {e}")
    mem.notebook.record([reinforced_event(existing, updated, run_id, similarity=exact.score)], now)
    return Outcome(Disposition.DEDUPED, REASON_DEDUPED, note_id)


def _create(
    mem: MemoryContext,
    ctx: RunContext,
    key: str,
    scope: WriteScope,
    valid: ValidRequest,
    note_id: str,
    vector: np.ndarray | None,
    ledger: RunLedger,
) -> Outcome:
    """Save a new provisional note, then commit it to the ledger (key row + cap slot); the
    note's ``created`` event is recorded once the commit went through."""
    config = mem.write_config
    run_id = ctx.run_id or ""
    note = new_note(mem, ctx, scope, valid, note_id)
    try:
        if vector is None:
            vector = np.asarray(mem.embed([valid.text])[0], dtype=np.float32)
        with mem.notebook.appending():  # the ledger claim below decides the id
            (saved,) = mem.notebook.save_notes([note], vector[None, :])
    except Exception as e:
        return error_outcome(f"Failed to save memory: {e}")

    written = ledger.written
    for _ in range(config.max_writes_per_run + 2):
        if written >= config.max_writes_per_run:
            # Another writer of this run filled the cap after our check: undo our note.
            mem.store.notes.delete(eq("id", note_id))
            return Outcome(Disposition.SKIPPED_CAP, cap_reason(config.max_writes_per_run))
        claimed = mem.sources.ledger_claim(
            [
                ledger_row(run_id, key, note_id, scope, Disposition.WRITTEN.value),
                ledger_row(
                    run_id, f"{SLOT_KEY_PREFIX}{written + 1}", note_id, scope, SLOT_DISPOSITION
                ),
            ]
        )
        if claimed:
            mem.notebook.record([created_event(saved, run_id)])
            return Outcome(Disposition.WRITTEN, REASON_WRITTEN, note_id, scope.as_dict())
        fresh = RunLedger.load(mem, run_id, scope.agent_id)
        row = fresh.keys.get(key)
        if row is not None:  # the same write committed by another writer of this run
            collapse_duplicate_rows(mem, note, vector)
            return duplicate_outcome(row["note_id"])
        written = fresh.written
    mem.store.notes.delete(eq("id", note_id))
    return error_outcome("Failed to save memory: could not commit the write to the run's ledger.")


def new_note(
    mem: MemoryContext, ctx: RunContext, scope: WriteScope, valid: ValidRequest, note_id: str
) -> Note:
    """The new provisional note a ``written`` request creates (TTL from the service clock)."""
    return Note(
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
        expires_at=mem.now() + timedelta(days=mem.write_config.default_ttl_days),
    )


def collapse_duplicate_rows(mem: MemoryContext, note: Note, vector: np.ndarray) -> None:
    """Leave one row for ``note.id`` after two writers inserted it at the same time.

    The write path appends a new note before claiming it (``Notebook.appending``), so
    two writers of one run saving the same write both append its id. Both saves finished
    before either writer committed to the ledger, so the writer that lost the commit can
    safely replace the copies with one row.
    """
    try:
        if mem.store.notes.count(eq("id", note.id)) > 1:
            keep = mem.store.notes.get(note.id) or note
            mem.store.notes.delete(eq("id", note.id))
            mem.store.notes.upsert([keep], vector[None, :])
    except Exception as e:  # the note exists at least once; a later write can retry
        log.warning("could not collapse duplicate rows of note %s: %s", note.id, e)
