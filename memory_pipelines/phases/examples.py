"""Example extraction, a cycle phase (reference §4.4): new conversation messages are
mined for input/output examples (success and confidence filter, exact and near-duplicate
dedupe)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import JudgeError
from memory_pipelines.judge import CandidateExample, judged_messages
from memory_pipelines.notes import (
    Example,
    ExampleStatus,
    Note,
    NoteStatus,
    NoteType,
    new_id,
    stable_id,
)
from memory_pipelines.partitions import agents_in
from memory_pipelines.phases import audit, mining
from memory_pipelines.phases.extraction import NO_AGENTS_MESSAGE
from memory_pipelines.phases.lease import exclusive_phase
from memory_pipelines.phases.mining import MiningBatch
from memory_pipelines.phases.reports import PhaseReport
from memory_pipelines.store import and_, eq
from memory_pipelines.text import normalize


@dataclass
class _ExampleCandidate:
    example: Example
    batch: MiningBatch
    confidence: float
    vector: np.ndarray | None = None
    reason: str = ""


def _candidate_example(
    mem: MemoryContext, c: CandidateExample, batch: MiningBatch
) -> tuple[_ExampleCandidate | None, str]:
    if float(c.success_score or 0) < mem.manager_config.example_min_success:
        return None, "lowSuccess"
    if float(c.confidence or 0) < mem.manager_config.example_min_confidence:
        return None, "lowConfidence"
    example_input = (c.example_input or "").strip()
    example_output = (c.example_output or "").strip()
    if not example_input or not example_output:
        return None, "empty"
    message_ids = {m.message_id for m in batch.messages if m.message_id}
    message_id = (
        c.source_message_id if c.source_message_id in message_ids else batch.last_message_id
    )
    example = Example(
        id=stable_id("mm-example", batch.conversation_id, message_id, normalize(example_input)),
        agent_id=batch.agent_id,
        user_id=batch.user_id,
        company_id=batch.company_id,
        example_input=example_input,
        example_output=example_output,
        success_score=float(c.success_score),
        is_auto_generated=True,
        status=ExampleStatus.ACTIVE,
        source_conversation_id=batch.conversation_id,
        source_conversation_detail_id=message_id,
        source_run_id=batch.run_id,
        primary_scope_entity_id=batch.primary_scope_entity_id,
        primary_scope_record_id=batch.primary_scope_record_id,
        secondary_scopes=batch.secondary_scopes,
        comments=(
            f"Extracted by the Memory Manager from {batch.source_label} "
            f"(confidence {float(c.confidence):g})."
        ),
    )
    return _ExampleCandidate(example=example, batch=batch, confidence=float(c.confidence)), ""


@dataclass
class _Mined:
    """What mining the batches gave: the kept candidates, the batches judged and those
    whose judge call failed, and how many examples the judge proposed."""

    cands: list[_ExampleCandidate] = field(default_factory=list)
    done: list[MiningBatch] = field(default_factory=list)
    failed: list[MiningBatch] = field(default_factory=list)
    raw: int = 0


@exclusive_phase
def run(mem: MemoryContext, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
    """Mine new conversation messages for input/output examples (reference §4.4).

    Reads: conversations of memory-using agents with messages past the examples
    cursor, the agent's Active examples. Writes: new Active auto-generated examples
    (success ≥ 70, confidence ≥ 70; deterministic ids), the cursors, audit steps.
    Guarantees: an exact input already present, or a near-duplicate the judge rejects
    (or cannot judge), is not added.
    """
    run_id = run_id or new_id()
    started = mem.now()
    report = PhaseReport(
        {
            "conversationsProcessed": 0,
            "rawExampleCount": 0,
            "examplesCreated": 0,
            "examplesRejected": 0,
            "exampleJudgeFailures": 0,
        }
    )
    agent_ids = agents_in(partition, mining.agents_using_memory(mem))
    if not agent_ids:
        report.extra["message"] = NO_AGENTS_MESSAGE
        audit.remember(mem, "extract_examples", run_id, started, report, partition)
        return report
    loaded = mining.load_conversations(mem, "examples", agent_ids, run_id, partition)
    mined = _mine(mem, loaded.batches, run_id, report)
    approved = _dedupe_examples(mem, mined.cands, run_id, report)
    _create(mem, approved, run_id, report)
    given_up = mining.advance(mem, "examples", loaded, mined.done, mined.failed, partition)
    if given_up:
        report["exampleSourcesGivenUp"] = len(given_up)
        mining.audit_given_up(mem, run_id, "examples", given_up)
    report["conversationsProcessed"] = len(mined.done)
    audit.remember(mem, "extract_examples", run_id, started, report, partition)
    return report


def _mine(
    mem: MemoryContext, batches: Sequence[MiningBatch], run_id: str, report: PhaseReport
) -> _Mined:
    """Ask the judge for examples in each batch (beside the agent's newest examples) and
    keep the candidates that pass the filters; one audit step."""
    started = mem.now()
    mined = _Mined()
    for batch in batches:
        existing = _examples_of(mem, batch.agent_id)[
            : mem.manager_config.existing_examples_for_judge
        ]
        try:
            proposals = mem.judge.extract_examples(judged_messages(batch.messages), existing)
        except JudgeError:
            mined.failed.append(batch)
            continue
        mined.done.append(batch)
        mined.raw += len(proposals)
        for p in proposals:
            cand, why = _candidate_example(mem, p, batch)
            if cand is None:
                report[f"examplesFiltered_{why}"] = report.get(f"examplesFiltered_{why}", 0) + 1
            else:
                mined.cands.append(cand)
    report["rawExampleCount"] = mined.raw
    report["exampleJudgeFailures"] = len(mined.failed)
    audit.step(
        mem,
        run_id,
        "Prompt",
        "Extract Examples from Conversations",
        {"conversationCount": len(batches)},
        {
            "success": not mined.failed,
            "rawExampleCount": mined.raw,
            "keptExampleCount": len(mined.cands),
        },
        started_at=started,
        status="Completed" if not mined.failed or bool(mined.done) else "Failed",
    )
    return mined


def _create(
    mem: MemoryContext, approved: list[_ExampleCandidate], run_id: str, report: PhaseReport
) -> None:
    """Save the approved examples not already present; one audit step."""
    started = mem.now()
    present = {e.id for e in mem.store.examples.get_many([c.example.id for c in approved])}
    fresh = [c for c in approved if c.example.id not in present]
    if fresh:
        mem.notebook.save_examples(
            [c.example for c in fresh], np.stack([c.vector for c in fresh]).astype(np.float32)
        )
    report["examplesCreated"] = len(fresh)
    audit.step(
        mem,
        run_id,
        "Decision",
        "Create Example Records",
        {"approvedCount": len(approved)},
        {"created": len(fresh), "alreadyPresent": len(present), "failed": 0},
        started_at=started,
    )


def _examples_of(mem: MemoryContext, agent_id: str) -> list[Example]:
    items = mem.store.examples.all(
        and_(eq("agent_id", agent_id), eq("status", ExampleStatus.ACTIVE))
    )
    items.sort(key=lambda e: e.updated_at or e.created_at or mem.now(), reverse=True)
    return items


def _dedupe_examples(
    mem: MemoryContext, cands: Sequence[_ExampleCandidate], run_id: str, report: PhaseReport
) -> list[_ExampleCandidate]:
    started = mem.now()
    approved: list[_ExampleCandidate] = []
    rejected = llm_calls = 0
    if cands:
        vectors = mem.embed([c.example.example_input for c in cands])
        for c, v in zip(cands, vectors, strict=True):
            c.vector = v
    inputs: dict[str, set[str]] = {}
    for c in cands:
        ex = c.example
        if ex.agent_id not in inputs:
            inputs[ex.agent_id] = {
                normalize(e.example_input) for e in _examples_of(mem, ex.agent_id)
            }
        key = normalize(ex.example_input)
        if key in inputs[ex.agent_id]:
            rejected += 1
            continue
        hits = [
            _example_note(h.item)
            for h in mem.store.examples.vector_search(
                c.vector,
                where=and_(eq("agent_id", ex.agent_id), eq("status", ExampleStatus.ACTIVE)),
                k=mem.manager_config.example_dedupe_k,
                min_similarity=mem.manager_config.example_dedupe_similarity,
                exclude_ids=[ex.id],
            )
        ]
        hits += [
            _example_note(a.example)
            for a in approved
            if a.example.agent_id == ex.agent_id
            and float(a.vector @ c.vector) >= mem.manager_config.example_dedupe_similarity
        ]
        if hits:
            llm_calls += 1
            try:
                decision = mem.judge.is_duplicate(_example_note(ex).note, hits)
            except JudgeError:
                rejected += 1
                continue
            if not decision.should_add:
                rejected += 1
                continue
        approved.append(c)
        inputs[ex.agent_id].add(key)
    report["examplesRejected"] = rejected
    audit.step(
        mem,
        run_id,
        "Decision",
        "Deduplicate Example Candidates",
        {"candidateCount": len(cands)},
        {"approvedCount": len(approved), "rejectedCount": rejected, "llmCallCount": llm_calls},
        started_at=started,
    )
    return approved


def _example_as_text(example: Example) -> str:
    return f"Input: {example.example_input} Output: {example.example_output}"


def _example_note(example: Example) -> Note:
    """An example shown to the note dedupe judge as a note (its input and output as text)."""
    return Note(
        id=example.id,
        agent_id=example.agent_id,
        user_id=example.user_id,
        company_id=example.company_id,
        note=_example_as_text(example),
        type=NoteType.EXAMPLE,
        status=NoteStatus.ACTIVE,
    )
