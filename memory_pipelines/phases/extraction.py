"""Note extraction, a cycle phase (reference §4.2-§4.3): new conversation messages,
high-value runs and failed runs are mined for durable notes (confidence/length filter,
merge collapse, dedupe, lineage-preserving revocation of merge targets)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import JudgeError
from memory_pipelines.judge import CandidateNote, judged_messages
from memory_pipelines.note_events import Actor, EventKind, NoteEvent, note_event
from memory_pipelines.notes import (
    AuthorType,
    Note,
    NoteStatus,
    NoteType,
    ProtectionTier,
    append_comment,
    new_id,
    stable_id,
)
from memory_pipelines.partitions import agents_in
from memory_pipelines.phases import audit, mining
from memory_pipelines.phases.common import scope_triple
from memory_pipelines.phases.lease import exclusive_phase
from memory_pipelines.phases.mining import MiningBatch
from memory_pipelines.phases.reports import PhaseReport
from memory_pipelines.scope import in_lattice, note_scope_filter
from memory_pipelines.store import and_, eq, injectable
from memory_pipelines.text import normalize

VALID_NOTE_TYPES = frozenset(t.value for t in NoteType)
FAILURE_NOTE_TYPES = (NoteType.ISSUE.value, NoteType.CONTEXT.value)
#: Tiers a judge may hint. Immutable is a human decision; a model never sets it.
HINTABLE_TIERS = frozenset(
    {ProtectionTier.STANDARD.value, ProtectionTier.EPHEMERAL.value, ProtectionTier.PROTECTED.value}
)
KEPT_TIERS = frozenset({ProtectionTier.IMMUTABLE.value, ProtectionTier.PROTECTED.value})
NO_AGENTS_MESSAGE = "No agents have note/example injection enabled - nothing to extract"
PHASE = "extraction"
RULE = "extraction"


@dataclass
class _NoteCandidate:
    note: Note
    merge_ids: tuple[str, ...]
    batch: MiningBatch
    confidence: float
    key: str = ""
    vector: np.ndarray | None = None
    reason: str = ""


def _existing_for_judge(mem: MemoryContext, batch: MiningBatch) -> list[Note]:
    """The Active notes (reference: Active only) the agent sees for this batch's user,
    at most ``existing_notes_for_judge``, the ones closest to the batch's text first."""
    where = and_(
        note_scope_filter(batch.agent_id, batch.user_id, batch.company_id),
        eq("status", NoteStatus.ACTIVE),
    )
    text = " ".join(m.text for m in batch.messages)[:4000]
    (query,) = mem.embed([text])
    hits = mem.store.notes.vector_search(
        query, where=where, k=mem.manager_config.existing_notes_for_judge
    )
    return [h.item for h in hits]


def _candidate_note(
    mem: MemoryContext, c: CandidateNote, batch: MiningBatch, existing: Mapping[str, Note]
) -> tuple[_NoteCandidate | None, str]:
    """Validate one judge proposal and build the note it would create (or say why not)."""
    content = (c.content or "").strip()
    if float(c.confidence or 0) < mem.manager_config.min_confidence:
        return None, "lowConfidence"
    if len(content) < mem.manager_config.min_content_length:
        return None, "tooShort"
    if len(content) > mem.manager_config.max_note_length:
        return None, "tooLong"
    note_type = c.type if c.type in VALID_NOTE_TYPES else None
    if batch.kind == "failure" and note_type not in FAILURE_NOTE_TYPES:
        note_type = NoteType.ISSUE.value
    if note_type is None:
        return None, "invalidType"
    tier = ProtectionTier.STANDARD.value
    if batch.kind == "failure":
        tier = ProtectionTier.EPHEMERAL.value
    elif c.protection_tier_hint in HINTABLE_TIERS:
        tier = c.protection_tier_hint
    level = (c.scope_level or "user").lower()
    user_id, company_id = batch.user_id, batch.company_id
    primary = (batch.primary_scope_entity_id, batch.primary_scope_record_id)
    secondary = batch.secondary_scopes
    if level == "global":
        user_id = company_id = None
        primary, secondary = (None, None), None
    elif level == "company" and company_id:
        user_id = None
        secondary = None
    # "company" without a known company keeps the user scope: never widen past the evidence
    message_ids = {m.message_id for m in batch.messages if m.message_id}
    message_id = (
        c.source_message_id if c.source_message_id in message_ids else batch.last_message_id
    )
    source = f"run:{batch.run_id}" if batch.kind == "failure" else batch.conversation_id
    note = Note(
        id=stable_id("mm-note", source, message_id, normalize(content)),
        agent_id=batch.agent_id,
        user_id=user_id,
        company_id=company_id,
        note=content,
        type=note_type,
        status=NoteStatus.ACTIVE,
        author_type=AuthorType.MEMORY_MANAGER,
        protection_tier=tier,
        access_count=1,
        is_auto_generated=True,
        source_run_id=batch.run_id,
        source_conversation_id=batch.conversation_id,
        source_conversation_detail_id=message_id,
        primary_scope_entity_id=primary[0],
        primary_scope_record_id=primary[1],
        secondary_scopes=secondary,
        comments=(
            f"Extracted by the Memory Manager from {batch.source_label} "
            f"(confidence {float(c.confidence):g}, rating context {batch.rating_context})."
        ),
    )
    # a merge may only revoke a note the judge was shown, of this agent, and no wider
    # than the new note (a user's statement never revokes a company-wide note)
    merge_ids = tuple(
        i
        for i in dict.fromkeys(c.merge_with_existing_ids)
        if i in existing
        and existing[i].agent_id == batch.agent_id
        and in_lattice(*scope_triple(note), *scope_triple(existing[i]))
    )
    return _NoteCandidate(
        note=note, merge_ids=merge_ids, batch=batch, confidence=float(c.confidence)
    ), ""


def _mine_notes(
    mem: MemoryContext, batches: Sequence[MiningBatch], run_id: str, report: PhaseReport
) -> tuple[list[_NoteCandidate], list[MiningBatch], list[MiningBatch]]:
    """Ask the judge for notes in each batch; keep the ones that pass the filter."""
    started = mem.now()
    candidates: list[_NoteCandidate] = []
    done: list[MiningBatch] = []
    failed: list[MiningBatch] = []
    raw = 0
    existing_count = 0
    errors: list[str] = []
    for batch in batches:
        existing = _existing_for_judge(mem, batch)
        existing_count += len(existing)
        by_id = {n.id: n for n in existing}
        try:
            proposals = mem.judge.extract_notes(
                judged_messages(batch.messages), existing, rating_context=batch.rating_context
            )
        except JudgeError as e:
            failed.append(batch)
            errors.append(f"{batch.source_label}: {e}")
            continue
        done.append(batch)
        raw += len(proposals)
        for p in proposals:
            cand, why = _candidate_note(mem, p, batch, by_id)
            if cand is None:
                report[f"notesFiltered_{why}"] = report.get(f"notesFiltered_{why}", 0) + 1
                continue
            candidates.append(cand)
    capped = candidates[: mem.manager_config.max_notes_per_run]
    if len(candidates) > len(capped):
        report["notesCapped"] = len(candidates) - len(capped)
    report["rawNoteCount"] += raw
    report["noteJudgeFailures"] += len(failed)
    audit.step(
        mem,
        run_id,
        "Prompt",
        "Extract Notes from Conversations",
        {
            "conversationCount": sum(1 for b in batches if b.kind == "conversation"),
            "failedRunCount": sum(1 for b in batches if b.kind == "failure"),
            "messageCount": sum(len(b.messages) for b in batches),
            "existingNoteCount": existing_count,
        },
        {
            "success": not failed,
            "rawNoteCount": raw,
            "keptNoteCount": len(capped),
            "failedBatches": len(failed),
        },
        started_at=started,
        status="Completed" if not failed or bool(done) else "Failed",
        error="; ".join(errors)[:4000] or None,
    )
    return capped, done, failed


def _collapse_merges(cands: Sequence[_NoteCandidate]) -> list[_NoteCandidate]:
    """Merge candidates with the same normalised content in the same scope become one
    (targets joined); merge candidates come first so a plain restatement of one is
    deduped against it."""
    merged: dict[str, _NoteCandidate] = {}
    plain: list[_NoteCandidate] = []
    for c in cands:
        c.key = f"{c.note.scope_key}|{normalize(c.note.note)}"
        if not c.merge_ids:
            plain.append(c)
        elif c.key in merged:
            first = merged[c.key]
            first.merge_ids = tuple(dict.fromkeys(first.merge_ids + c.merge_ids))
        else:
            merged[c.key] = c
    return [*merged.values(), *plain]


def _dedupe_notes(
    mem: MemoryContext, cands: list[_NoteCandidate], run_id: str, report: PhaseReport
) -> list[_NoteCandidate]:
    """Approve merges; reject exact restatements; ask the judge about near-duplicates
    (store hits and notes approved earlier in this run). A failed judge rejects the
    NEW candidate ("too similar to existing notes"): nothing existing is touched."""
    started = mem.now()
    approved: list[_NoteCandidate] = []
    rejected: list[_NoteCandidate] = []
    llm_calls = 0
    if cands:
        vectors = mem.embed([c.note.note for c in cands])
        for c, v in zip(cands, vectors, strict=True):
            c.vector = v
    exact_cache: dict[str, set[str]] = {}
    seen_keys: set[str] = set()
    for c in cands:
        if c.merge_ids:
            c.reason = "merge candidate (auto-approved)"
        elif c.key in seen_keys:
            c.reason = "duplicate of a note approved earlier in this run"
            rejected.append(c)
            continue
        else:
            keep, asked = _judge_new_note(mem, c, approved, exact_cache)
            llm_calls += asked
            if not keep:
                rejected.append(c)
                continue
        approved.append(c)
        seen_keys.add(c.key)
    report["notesRejected"] += len(rejected)
    report.extra.setdefault("rejectedNotes", []).extend(
        {"note": c.note.note, "reason": c.reason, "source": c.batch.source_label}
        for c in rejected
    )
    audit.step(
        mem,
        run_id,
        "Decision",
        "Deduplicate Note Candidates",
        {"candidateCount": len(cands)},
        {
            "approvedCount": len(approved),
            "rejectedCount": len(rejected),
            "llmCallCount": llm_calls,
        },
        started_at=started,
    )
    return approved


def _judge_new_note(
    mem: MemoryContext,
    c: _NoteCandidate,
    approved: Sequence[_NoteCandidate],
    exact_cache: dict[str, set[str]],
) -> tuple[bool, int]:
    """Whether a new (non-merge) candidate is kept, and how many judge calls that took
    (0 or 1): an exact restatement of a note of its scope is rejected; near-duplicates
    (store hits and notes approved earlier in this run) go to the judge, whose failure
    rejects the candidate. Sets ``c.reason`` when a rule or the judge gave one."""
    n = c.note
    where = and_(note_scope_filter(n.agent_id, n.user_id, n.company_id), injectable())
    scope = n.scope_key
    if scope not in exact_cache:
        texts = mem.store.notes.scan(where, columns=["note"])["note"]
        exact_cache[scope] = {normalize(t) for t in texts}
    if normalize(n.note) in exact_cache[scope]:
        c.reason = "exact restatement of an existing note"
        return False, 0
    hits = [
        h.item
        for h in mem.store.notes.vector_search(
            c.vector,
            where=where,
            k=mem.manager_config.note_dedupe_k,
            min_similarity=mem.manager_config.note_dedupe_similarity,
            exclude_ids=[n.id],
        )
    ]
    hits += _batch_hits(mem, c, approved)
    if not hits:
        return True, 0
    try:
        decision = mem.judge.is_duplicate(n.note, hits)
    except JudgeError:
        c.reason = "too similar to existing notes"
        return False, 1
    if not decision.should_add:
        c.reason = decision.reason or "duplicate"
        return False, 1
    c.reason = decision.reason
    return True, 1


def _batch_hits(mem: MemoryContext, c: _NoteCandidate, approved: Sequence[_NoteCandidate]) -> list[Note]:
    """Notes approved earlier in this run that are near-duplicates of ``c`` in its lattice."""
    n = c.note
    pool = [a for a in approved if in_lattice(*scope_triple(a.note), *scope_triple(n))]
    if not pool or c.vector is None:
        return []
    sims = np.stack([a.vector for a in pool]) @ c.vector
    order = np.argsort(-sims)
    return [pool[i].note for i in order if sims[i] >= mem.manager_config.note_dedupe_similarity][
        : mem.manager_config.note_dedupe_k
    ]


def _create_notes(
    mem: MemoryContext, approved: Sequence[_NoteCandidate], run_id: str, report: PhaseReport
) -> None:
    """Save each approved note, then revoke its merge targets (lineage kept; Immutable
    and Protected targets only get a conflict comment). A note already saved by an
    earlier, interrupted run is not saved again, but its revocations are completed."""
    started = mem.now()
    created = merged = conflicts = 0
    present = {n.id for n in mem.store.notes.get_many([c.note.id for c in approved])}
    fresh = [c for c in approved if c.note.id not in present]
    if fresh:
        saved = mem.notebook.save_notes(
            [c.note for c in fresh], np.stack([c.vector for c in fresh]).astype(np.float32)
        )
        mem.notebook.record(
            [_created_event(n, c, run_id) for n, c in zip(saved, fresh, strict=True)]
        )
        created = len(saved)
        for n in saved:
            report.note_changed(n, "created")
    for c in approved:
        if not c.merge_ids:
            continue
        changes = [
            change
            for target in mem.store.notes.get_many(list(c.merge_ids))
            if (change := _merge_target_change(target, c, run_id)) is not None
        ]
        conflicts += sum(1 for _, after, _ in changes if after.status == NoteStatus.ACTIVE.value)
        merged += sum(1 for _, after, _ in changes if after.status != NoteStatus.ACTIVE.value)
        saved_targets = mem.notebook.save_notes(
            [after for _, after, _ in changes], events=[ev for _, _, ev in changes]
        )
        for n in saved_targets:
            report.note_changed(
                n, "revoked" if n.status == NoteStatus.REVOKED.value else "merge-conflict"
            )
    report["notesCreated"] += created
    report["notesMerged"] += merged
    report["mergeConflicts"] += conflicts
    audit.step(
        mem,
        run_id,
        "Decision",
        "Create Note Records",
        {"approvedCount": len(approved), "alreadyPresent": len(present)},
        {"created": created, "merged": merged, "failed": 0, "conflicts": conflicts},
        started_at=started,
    )


def _merge_target_change(
    target: Note, c: _NoteCandidate, run_id: str
) -> tuple[Note, Note, NoteEvent] | None:
    """What the new note ``c`` does to one Active merge target (before, after, event): a
    kept tier only gets a conflict comment (once); any other target is revoked into the
    new note. None: the target is not Active, or already carries the comment."""
    if target.status != NoteStatus.ACTIVE.value:
        return None
    if target.protection_tier in KEPT_TIERS:
        marker = (
            f"[Merge-target conflict: new note {c.note.id} from {c.batch.source_label} "
            f"supersedes this {target.protection_tier} note; it was kept]"
        )
        if marker in (target.comments or ""):
            return None
        kept = target.model_copy(update={"comments": append_comment(target.comments, marker)})
        return (
            target,
            kept,
            _target_event(
                EventKind.UPDATED, target, kept, c, run_id,
                f"merge-target conflict: the {target.protection_tier} note was kept",
            ),
        )  # fmt: skip
    superseded = target.model_copy(
        update={
            "status": NoteStatus.REVOKED.value,
            "consolidated_into_note_id": c.note.id,
            "comments": append_comment(
                target.comments,
                "Superseded: contradiction detected, replaced by new note from "
                f"{c.batch.source_label}",
            ),
        }
    )
    return (
        target,
        superseded,
        _target_event(
            EventKind.SUPERSEDED, target, superseded, c, run_id,
            f"superseded by a new note from {c.batch.source_label}",
        ),
    )  # fmt: skip


def _created_event(note: Note, c: _NoteCandidate, run_id: str) -> NoteEvent:
    """``created`` for an extracted note (``note`` as saved), naming where it came from;
    a merge candidate's related notes are the targets the judge said it replaces."""
    source = {"conversation_id": c.batch.conversation_id} if c.batch.conversation_id else {}
    if c.batch.kind == "failure":
        source["failed_run_id"] = c.batch.run_id
    return note_event(
        EventKind.CREATED,
        note,
        actor=Actor.MANAGER,
        phase=PHASE,
        run_id=run_id,
        related=c.merge_ids,
        at=note.updated_at,
        rule=RULE,
        reason=f"extracted from {c.batch.source_label}",
        source=c.batch.source_label,
        confidence=c.confidence,
        **source,
        **({"judge_reason": c.reason} if c.reason else {}),
    )


def _target_event(
    kind: EventKind, before: Note, after: Note, c: _NoteCandidate, run_id: str, reason: str
) -> NoteEvent:
    """The event of a merge target of ``c``: ``superseded`` when it is revoked in favour of
    the new note, ``updated`` when a kept (Immutable/Protected) target only gets the
    conflict comment; related: the new note."""
    return note_event(
        kind,
        after,
        before=before,
        actor=Actor.MANAGER,
        phase=PHASE,
        run_id=run_id,
        related=[c.note.id],
        rule=RULE,
        reason=reason,
        source=c.batch.source_label,
    )


#: the counts of the report, in order
_COUNTS = (
    "conversationsProcessed",
    "messagesProcessed",
    "agentRunsProcessed",
    "failedRunsMined",
    "rawNoteCount",
    "notesCreated",
    "notesMerged",
    "mergeConflicts",
    "notesRejected",
    "noteJudgeFailures",
)


@exclusive_phase
def run(
    mem: MemoryContext, run_id: str | None = None, partition: str | None = None
) -> PhaseReport:
    """Mine new conversation messages, high-value runs and failed runs for notes.

    Reads: memory-using agents (Active, injecting notes or examples), their
    conversations with messages past the per-conversation cursor, high-value and
    failed agent runs, the Active notes each conversation's user sees (sent to the
    judge), injectable notes in the lattice (dedupe). Writes: new Active
    MemoryManager notes (deterministic ids), revoked merge targets with lineage, the
    cursors, audit steps. Guarantees: a message or failed run is mined once; a judge
    failure mines nothing from that batch and leaves its cursor for the next cycle, until
    it has failed ``judge_give_up_attempts`` times over ``judge_give_up_after``: then it
    is given up (its cursor moves, an audit step names it).
    With a ``partition``: only that agent's conversations and runs (none for the
    shared partition); merge targets are always notes of the batch's own agent.
    """
    run_id = run_id or new_id()
    started = mem.now()
    report = PhaseReport(dict.fromkeys(_COUNTS, 0))
    agent_ids = agents_in(partition, mining.agents_using_memory(mem))
    if not agent_ids:
        audit.step(
            mem,
            run_id,
            "Decision",
            "Load Conversations With New Activity",
            {"agentCount": 0},
            {"message": NO_AGENTS_MESSAGE},
            started_at=started,
        )
        report.extra["message"] = NO_AGENTS_MESSAGE
        audit.remember(mem, "extract_notes", run_id, started, report, partition)
        return report
    convs = mining.load_conversations(mem, "notes", agent_ids, run_id, partition)
    failures = mining.load_failed_runs(mem, agent_ids, run_id, partition)
    batches = convs.batches + failures.batches
    cands, done, failed = _mine_notes(mem, batches, run_id, report)
    approved = _dedupe_notes(mem, _collapse_merges(cands), run_id, report)
    _create_notes(mem, approved, run_id, report)
    given_up = _advance(mem, convs, failures, done, failed, partition)
    if given_up:
        report["noteSourcesGivenUp"] = len(given_up)
        mining.audit_given_up(mem, run_id, "notes", given_up)
    conv_done = [b for b in done if b.kind == "conversation"]
    report["conversationsProcessed"] = len(conv_done)
    report["messagesProcessed"] = sum(len(b.messages) for b in conv_done)
    report["failedRunsMined"] = sum(1 for b in done if b.kind == "failure")
    report["agentRunsProcessed"] = len({b.run_id for b in done if b.run_id})
    audit.remember(mem, "extract_notes", run_id, started, report, partition)
    return report


def _advance(
    mem: MemoryContext,
    convs: mining.Loaded,
    failures: mining.Loaded,
    done: Sequence[MiningBatch],
    failed: Sequence[MiningBatch],
    partition: str | None,
) -> list[MiningBatch]:
    """Move the conversation cursors, then the failed-run marks, past what was mined
    (and what was given up: returned)."""
    steps = (("notes", convs, "conversation"), ("failure", failures, "failure"))
    given_up: list[MiningBatch] = []
    for kind, loaded, batch_kind in steps:
        given_up += mining.advance(
            mem,
            kind,
            loaded,
            [b for b in done if b.kind == batch_kind],
            [b for b in failed if b.kind == batch_kind],
            partition,
        )
    return given_up
