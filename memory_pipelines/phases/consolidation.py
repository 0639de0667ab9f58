"""Consolidation, maintenance phase 2 (reference §4.8): clusters of similar
auto-generated Standard/Ephemeral notes of one exact scope are synthesised by the judge
into one note; the sources are revoked into it (the new note is saved first; an
interrupted run is completed by the next)."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memory_pipelines.blas import single_blas_thread
from memory_pipelines.config import ConsolidationConfig
from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import JudgeError
from memory_pipelines.note_events import EventKind, NoteEvent
from memory_pipelines.notes import (
    AuthorType,
    Note,
    NoteStatus,
    NoteType,
    append_comment,
    stable_id,
)
from memory_pipelines.partitions import note_filter, state_key
from memory_pipelines.phases import audit
from memory_pipelines.phases.clustering import (
    chunk_cluster,
    greedy_clusters,
    group_indices,
    resolve_originals,
    scope_group_key,
    top_neighbours,
    verify_consolidation,
)
from memory_pipelines.phases.common import (
    ACTIVE,
    EPHEMERAL,
    STANDARD,
    PhaseRun,
    created,
    manager_event,
    restored_against,
    save_notes,
    unit,
)
from memory_pipelines.phases.lease import exclusive_phase
from memory_pipelines.phases.reports import PhaseReport
from memory_pipelines.store import and_, eq

#: audit step names, as the reference writes them
STEP = "Consolidate Related Notes"
STEP_CLUSTER = "Process Consolidation Cluster"
STEP_VERIFY = "Verify Consolidation Output"

#: manager_state key of the ids the last consolidation made (read by contradictions)
STATE_CONSOLIDATED = "maintenance.consolidated_ids"

#: the ``details.rule`` of this phase's events (and of the restores that undo them)
RULE = "consolidation"


def consolidation_note_id(source_ids: Iterable[str]) -> str:
    """The deterministic id of the note consolidating exactly these sources."""
    return stable_id("consolidated-note", *sorted(source_ids))


_CONSOLIDATED_FROM = re.compile(r"Consolidated from \d+ notes: (.*?)(?: \[Verification:.*)?$", re.S)


@dataclass
class _Planned:
    """A consolidated note waiting to be saved, and the sources it will revoke."""

    note: Note
    sources: list[int]
    reason: str


def revoke_sources(
    mem: MemoryContext,
    notes: Sequence[Note],
    vectors: np.ndarray,
    revocations: Sequence[tuple[int, str, str]],
    report: PhaseReport,
    run_id: str | None = None,
    **details: object,
) -> None:
    """Revoke ``(row, into_id, reason)`` sources into their consolidated note, each with a
    ``merged`` event naming it.

    Runs strictly after the consolidated notes are saved, so an interruption here leaves
    Active sources beside an existing consolidated note, which the next run completes.
    """
    if not revocations:
        return
    revoked: list[Note] = []
    events: list[NoteEvent] = []
    for row, into, reason in revocations:
        src = notes[row]
        new = src.model_copy(
            update={
                "status": NoteStatus.REVOKED.value,
                "consolidated_into_note_id": into,
                "comments": append_comment(
                    src.comments, f"Consolidated into note {into}: {reason}"
                ),
            }
        )
        revoked.append(new)
        report.note_changed(new, "revoked-consolidated")
        events.append(
            manager_event(
                EventKind.MERGED, new, src, phase="consolidation", run_id=run_id,
                rule=RULE, reason=reason, related=[into], **details,
            )
        )  # fmt: skip
    save_notes(mem, revoked, vectors[[r for r, _, _ in revocations]], events)


def _interrupted_revocations(
    notes: Sequence[Note], restored: Collection[str] = ()
) -> list[tuple[int, str, str]]:
    """Sources still Active beside the consolidated note that should have revoked them
    (a run interrupted between "save new note" and "revoke sources"); a source an analyst
    restored out of its merge (``restored``) is not one."""
    row_of = {n.id: i for i, n in enumerate(notes)}
    out: list[tuple[int, str, str]] = []
    taken: set[int] = set()
    for c in notes:
        parents = c.derived_from_note_ids or []
        if c.consolidation_count < 1 or not parents or c.id != consolidation_note_id(parents):
            continue
        match = _CONSOLIDATED_FROM.match(c.comments or "")
        reason = match.group(1).strip() if match else "completing an interrupted consolidation"
        for pid in parents:
            row = row_of.get(pid)
            if row is None or row in taken or notes[row].consolidated_into_note_id is not None:
                continue
            if pid in restored:
                continue
            taken.add(row)
            out.append((row, c.id, reason))
    return out


@dataclass
class _Merging:
    """What merging the clusters did so far: the new notes' ids, the sources revoked, the
    verification counts, the skipped clusters by reason and the audit steps to flush."""

    notes: Sequence[Note]
    raw: np.ndarray
    new_ids: list[str] = field(default_factory=list)
    sources_revoked: int = 0
    verify: dict[str, int] = field(
        default_factory=lambda: {
            "clustersVerified": 0,
            "entitiesChecked": 0,
            "entitiesMissing": 0,
            "verificationsPassed": 0,
            "verificationsFlagged": 0,
        }
    )
    skipped: Counter[str] = field(default_factory=Counter)
    steps: list[dict[str, Any]] = field(default_factory=list)


@exclusive_phase
def run(
    mem: MemoryContext,
    run_id: str | None = None,
    partition: str | None = None,
    *,
    trigger_type: str | None = None,
) -> PhaseReport:
    """Phase 2: merge clusters of similar auto-generated notes of one scope.

    Candidates: Active, auto-generated, Standard or Ephemeral notes, grouped by exact
    scope. Greedy single pass at similarity >= 0.60 (top 10 per seed); clusters of 3 (2
    when the seed is Ephemeral), oversized ones cut into chunks of 7. Generation >= 3
    clusters are re-synthesised from their generation-0 originals; generation 1-2 are
    "anchored". The judge writes the new note (``JudgeError`` or a refusal: the cluster is
    left alone). The new note (deterministic id, the cluster's scope, Standard, access
    count summed, lineage in ``derived_from_note_ids``) is saved before any source is
    revoked into it, batch by batch (at most 2000 clusters or 60 s of judging per batch);
    a run interrupted in between is completed by the next one. Audit steps "Process Consolidation Cluster" (per cluster), "Verify
    Consolidation Output", "Consolidate Related Notes". Returns
    consolidatedClusterCount, sourceNotesArchived, newConsolidatedNoteIds.
    """
    pr = PhaseRun.start(mem, run_id, partition)
    notes, raw = mem.store.notes.scan_with_vectors(
        and_(eq("status", ACTIVE), eq("is_auto_generated", True), note_filter(partition))
    )
    restored = restored_against(mem, (n.id for n in notes), RULE)
    completion = _interrupted_revocations(notes, restored)
    revoke_sources(mem, notes, raw, completion, pr.report, pr.run_id, completed_interrupted=True)
    completed = {row for row, _, _ in completion}
    chunks = _clusters(pr, notes, unit(raw), completed, restored)
    merging = _Merging(notes, raw)
    _merge_clusters(pr, merging, chunks)
    _record(pr, merging, len(chunks), len(completion), trigger_type)
    return pr.report


def _clusters(
    pr: PhaseRun,
    notes: Sequence[Note],
    mat: np.ndarray,
    completed: Collection[int],
    restored: Collection[str],
) -> list[list[int]]:
    """The clusters to merge (rows of ``notes``): greedy clusters of similar eligible
    notes of one exact scope, oldest seed first, cut into chunks of at most
    ``max_cluster_size``."""
    cfg = pr.mem.maintenance_config.consolidation
    eligible = np.array(
        [
            n.protection_tier in (STANDARD, EPHEMERAL) and i not in completed
            and n.id not in restored
            for i, n in enumerate(notes)
        ],
        dtype=bool,
    )  # fmt: skip
    chunks: list[list[int]] = []
    # the reference needs at least 3 Active auto-generated notes before it clusters at all
    if len(notes) - len(completed) < cfg.min_cluster_size or int(eligible.sum()) < 2:
        return chunks
    cand = np.nonzero(eligible)[0]
    with single_blas_thread():
        groups = [
            cand[local] for local in group_indices(scope_group_key(notes[i]) for i in cand).values()
        ]
        neighbours = [
            top_neighbours(
                mat[rows],
                mat[rows],
                cfg.top_k,
                min_similarity=cfg.similarity_threshold,
                self_index=np.arange(rows.size),
            )[0]
            for rows in groups
        ]
    for rows, nbrs in zip(groups, neighbours, strict=True):
        if rows.size < 2:
            continue
        order = sorted(
            range(rows.size), key=lambda j: (created(notes[rows[j]], pr.now), notes[rows[j]].id)
        )

        def min_size(j: int, rows: np.ndarray = rows) -> int:
            if notes[rows[j]].protection_tier == EPHEMERAL:
                return cfg.ephemeral_min_cluster_size
            return cfg.min_cluster_size

        for cluster in greedy_clusters(order, nbrs, min_size):
            for chunk in chunk_cluster(cluster, cfg.max_cluster_size, cfg.min_cluster_size):
                chunks.append([int(rows[j]) for j in chunk])
    return chunks


def _merge_clusters(pr: PhaseRun, merging: _Merging, chunks: list[list[int]]) -> None:
    """Judge the clusters batch by batch (at most ``batch_clusters`` clusters or
    ``batch_seconds`` of judging each); after each batch, flush its audit steps, save its
    consolidated notes, then revoke their sources into them."""
    mem, cfg = pr.mem, pr.mem.maintenance_config.consolidation

    def lookup(ids: list[str]) -> dict[str, Note]:
        return {n.id: n for n in mem.store.notes.get_many(ids)}

    planned: list[_Planned] = []
    batch_started = time.monotonic()
    for pos, chunk in enumerate(chunks):
        plan = _plan_cluster(pr, merging, chunk, lookup)
        if plan is not None:
            planned.append(plan)
        full = len(planned) >= max(1, cfg.batch_clusters)
        slow = time.monotonic() - batch_started >= cfg.batch_seconds
        if not (full or slow or pos == len(chunks) - 1):
            continue
        audit.flush_steps(mem, merging.steps)
        _save_batch(pr, merging, planned)
        planned = []
        batch_started = time.monotonic()


def _save_batch(pr: PhaseRun, merging: _Merging, planned: list[_Planned]) -> None:
    """Save one batch's consolidated notes (with their events), then revoke their
    sources into them."""
    if not planned:
        return
    mem = pr.mem
    new_vectors = mem.embed([p.note.note for p in planned])
    save_notes(mem, [p.note for p in planned], new_vectors, _merged_events(mem, pr.run_id, planned))
    for p in planned:
        pr.report.note_changed(p.note, "consolidated")
        merging.new_ids.append(p.note.id)
    revocations = [(row, p.note.id, p.reason) for p in planned for row in p.sources]
    revoke_sources(mem, merging.notes, merging.raw, revocations, pr.report, pr.run_id)
    merging.sources_revoked += len(revocations)


def _record(
    pr: PhaseRun,
    merging: _Merging,
    clusters_found: int,
    completed: int,
    trigger_type: str | None,
) -> None:
    """The verification audit step, the report's counts, the record of the notes made
    (read by contradictions) and the phase's closing audit step."""
    mem, report, new_ids = pr.mem, pr.report, merging.new_ids
    audit.step(
        mem,
        pr.run_id,
        "Validation",
        STEP_VERIFY,
        {"clusterCount": len(new_ids)},
        merging.verify,
        started_at=pr.started,
    )
    report.update(
        consolidatedClusterCount=len(new_ids),
        sourceNotesArchived=merging.sources_revoked,
        newConsolidatedNoteIds=new_ids,
    )
    report.extra.update(
        clustersFound=clusters_found,
        clustersSkipped=dict(merging.skipped),
        interruptedRevocationsCompleted=completed,
        verification=merging.verify,
    )
    mem.sources.set_state(
        state_key(STATE_CONSOLIDATED, pr.partition),
        {"run_id": pr.run_id, "ids": new_ids, "consumed": False},
    )
    pr.close(
        "consolidation",
        STEP,
        {
            "frequency": mem.maintenance_config.frequency,
            "triggerType": trigger_type or "manual",
            "activeNoteCount": len(merging.notes),
        },
        output={**report, "interruptedRevocationsCompleted": completed},
    )


def _merged_events(mem: MemoryContext, run_id: str, planned: Sequence[_Planned]) -> list[NoteEvent]:
    """The events of the consolidated notes about to be saved: ``created`` listing the
    sources. A deterministic id that already names a note (the same sources merged before,
    then reactivated by an analyst) is overwritten by the save, as it always was: that is an
    ``updated`` event against the row it replaces, with ``merge_target_existed``."""
    existing = {n.id: n for n in mem.store.notes.get_many([p.note.id for p in planned])}
    events = []
    for p in planned:
        old = existing.get(p.note.id)
        kind = EventKind.CREATED if old is None else EventKind.UPDATED
        extra = {} if old is None else {"merge_target_existed": True}
        events.append(
            manager_event(
                kind, p.note, old, phase="consolidation", run_id=run_id, rule=RULE,
                reason=p.reason, related=p.note.derived_from_note_ids or [], **extra,
            )
        )  # fmt: skip
    return events


def _judged_members(
    members: list[Note], cfg: ConsolidationConfig, lookup: Callable[[list[str]], Mapping[str, Note]]
) -> tuple[list[Note], bool, bool]:
    """The notes the judge reads for a cluster, whether it is anchored, and whether they
    are its generation-0 originals (a cluster of generation >= ``max_consolidation_count``
    is re-synthesised from them; generation 1-2 is anchored)."""
    max_cc = max(n.consolidation_count for n in members)
    if max_cc >= cfg.max_consolidation_count:
        originals = resolve_originals(members, lookup, cfg.max_source_resolution_depth)
        if originals:
            return originals, False, True
    elif max_cc > 0:
        return members, True, False
    return members, False, False


def _plan_cluster(
    pr: PhaseRun,
    merging: _Merging,
    chunk: list[int],
    lookup: Callable[[list[str]], Mapping[str, Note]],
) -> _Planned | None:
    """Ask the judge about one cluster and build (not save) its consolidated note; its
    audit step is appended to ``merging.steps``."""
    mem, cfg = pr.mem, pr.mem.maintenance_config.consolidation
    started = mem.now()
    members = [merging.notes[i] for i in chunk]
    judged, anchored, resolved = _judged_members(members, cfg, lookup)
    step_input = {
        "clusterSize": len(members),
        "noteIds": [n.id for n in members],
        "maxGeneration": max(n.consolidation_count for n in members),
        "anchoredMode": anchored,
        "resolvedToOriginals": len(judged) if resolved else 0,
    }

    def step(output: dict[str, Any], error: str | None = None) -> None:
        merging.steps.append(
            audit.step_row(
                mem, pr.run_id, STEP_CLUSTER, "Prompt", step_input, output, started, error
            )
        )

    def skip(reason: str, error: str | None = None) -> None:
        merging.skipped[reason] += 1
        step({"skipReason": reason}, error)

    try:
        decision = mem.judge.synthesize_cluster(judged, anchored=anchored)
    except JudgeError as e:
        skip("prompt-failed", str(e)[:2000])
        return None
    if not decision.should_consolidate:
        skip(decision.reason or "declined")
        return None
    content = (decision.content or "").strip()
    if not content:
        skip("empty-output")
        return None
    reason = (decision.reason or "").strip() or "similar notes merged"
    check = verify_consolidation([n.note for n in judged], content)
    verify = merging.verify
    verify["clustersVerified"] += 1
    verify["entitiesChecked"] += check.checked
    verify["entitiesMissing"] += len(check.missing)
    verify["verificationsPassed" if check.passed else "verificationsFlagged"] += 1
    comments = f"Consolidated from {len(members)} notes: {reason}"
    if not check.passed:
        comments += check.comment(cfg.verification_entity_limit)
    new = _consolidated_note(members, content, decision.type, comments)
    step({"newNoteId": new.id, "reason": reason, "verificationPassed": check.passed})
    return _Planned(new, list(chunk), reason)


def _consolidated_note(
    members: list[Note], content: str, judged_type: str | None, comments: str
) -> Note:
    """The note consolidating ``members``: deterministic id, the first member's scope,
    Standard, access counts summed, one generation above the members'."""
    template = members[0]
    valid_types = {t.value for t in NoteType}
    ids = [n.id for n in members]
    return Note(
        id=consolidation_note_id(ids),
        agent_id=template.agent_id,
        user_id=template.user_id,
        company_id=template.company_id,
        primary_scope_entity_id=template.primary_scope_entity_id,
        primary_scope_record_id=template.primary_scope_record_id,
        secondary_scopes=template.secondary_scopes,
        note=content,
        type=judged_type if judged_type in valid_types else template.type,
        status=ACTIVE,
        author_type=AuthorType.MEMORY_MANAGER.value,
        protection_tier=STANDARD,
        is_auto_generated=True,
        access_count=sum(n.access_count for n in members),
        consolidation_count=max(n.consolidation_count for n in members) + 1,
        derived_from_note_ids=ids,
        comments=comments,
        note_type_name=template.note_type_name,
    )
