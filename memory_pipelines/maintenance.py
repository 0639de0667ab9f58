"""The gated maintenance phases of the Memory Manager (reference §4.6-§4.12).

Five phases, always in this order, each a function ``(svc, run_id=None) -> PhaseReport``
that the manager (``svc.manager``) and the Dagster assets call:

1. :func:`score_importance`: every Active note gets a 0-10 importance from seven signals;
   Standard notes at >= 8.0, or at/above the cohort's 95th-percentile uniqueness, become
   Protected (never demoted).
2. :func:`consolidate`: clusters of similar auto-generated Standard/Ephemeral notes of
   one exact scope are synthesised by the judge into one note; the sources are revoked
   into it (the new note is saved first; an interrupted run is completed by the next).
3. :func:`resolve_contradictions`: similar note pairs of one scope are judged; the loser
   is revoked, or both are flagged when they are important or Protected.
4. :func:`prune_stale`: auto notes whose agent, user, company or source conversation is
   gone are archived.
5. :func:`expire_and_decay`: notes and examples past ``expires_at`` are archived; auto
   notes and low-scored examples of archive-enabled agents decay, and are archived below
   the floor.

:func:`maintenance_trigger` is the gate (forced, frequency since the *last maintenance*,
or 100 new notes for one agent) and :func:`run_maintenance` runs all five and records the
run. Every constant is a default of :class:`MaintenanceConfig` (``svc.maintenance_config``).

What differs from the reference, on purpose (reference §6.2 and scale):

- uniqueness and contradiction partners never match the note itself (§6.2 item 2);
  uniqueness is measured, as in the reference, against the other injectable notes of
  the same agent (any user or company); clustering and contradiction pairing compare a
  note only with notes of its exact scope (agent, user, company, primary and secondary
  scope; §6.2 items 5 and 7). All neighbour searches are exact, in blocked matrix
  products per group over vectors read once (cost: the sum of squared group sizes, so
  linear in the pool for bounded agents and scopes);
- consolidation re-checks membership (Active, auto-generated, Standard/Ephemeral only),
  keeps the cluster's scope, gives the new note a deterministic id, saves it before
  revoking anything and completes an interrupted run;
- comments are always appended (contradiction revocation and stale pruning included);
- relevance comes from injection events (unavailable for never-injected notes, so those
  score exactly as the reference);
- judged contradiction pairs are remembered by content, so the 50-pair budget is not
  spent re-asking (and re-flagging) the same pair every run;
- stale pruning checks every candidate's references with a light column scan, then
  archives the oldest 200 stale notes (the reference loaded only the oldest 400 notes and
  could starve behind live ones);
- decay takes the longest-untouched candidates first; importance 0 decays (it is not
  read as "missing"); example retention is capped at 1.5 like notes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import func, insert, select

from memory_pipelines.clustering import (
    chunk_cluster,
    greedy_clusters,
    group_indices,
    resolve_originals,
    scope_group_key,
    single_blas_thread,
    top_neighbours,
    verify_consolidation,
)
from memory_pipelines.config import (
    ConsolidationConfig,
    MaintenanceConfig,
)
from memory_pipelines.context import MemoryContext
from memory_pipelines.contradictions import (
    flag_comment,
    pair_key,
    resolve,
    resolved_comment,
    select_pairs,
)
from memory_pipelines.decay import (
    archival_comment,
    decay_example,
    decay_note,
    example_archival_comment,
    expiry_comment,
    iso,
)
from memory_pipelines.errors import JudgeError, MemoryPipelineError
from memory_pipelines.inventory import note_inventory
from memory_pipelines.notes import (
    AuthorType,
    Example,
    ExampleStatus,
    Note,
    NoteStatus,
    NoteType,
    ProtectionTier,
    append_comment,
    new_id,
    stable_id,
)
from memory_pipelines.partitions import note_filter, state_key
from memory_pipelines.reports import PhaseReport
from memory_pipelines.scoring import (
    InjectionStats,
    compute_signals,
    distribution,
    importance_score,
    percentile_value,
    promotion_for,
    uniqueness_signal,
)
from memory_pipelines.sources import injection_events, manager_runs, run_steps
from memory_pipelines.store import and_, cmp, eq, in_, injectable, is_null, ne, not_null, or_

log = logging.getLogger(__name__)

ACTIVE = NoteStatus.ACTIVE.value
IMMUTABLE = ProtectionTier.IMMUTABLE.value
PROTECTED = ProtectionTier.PROTECTED.value
STANDARD = ProtectionTier.STANDARD.value
EPHEMERAL = ProtectionTier.EPHEMERAL.value

#: audit step names, as the reference writes them
STEP_IMPORTANCE = "Compute Importance Scores"
STEP_CONSOLIDATION = "Consolidate Related Notes"
STEP_CLUSTER = "Process Consolidation Cluster"
STEP_VERIFY = "Verify Consolidation Output"
STEP_CONTRADICTIONS = "Detect Note Contradictions"
STEP_PRUNING = "Prune Stale References"
STEP_DECAY = "Decay-Based Archival"

PHASES: tuple[str, ...] = ("importance", "consolidation", "contradictions", "pruning", "decay")
PHASE_STEPS: dict[str, str] = {
    "importance": STEP_IMPORTANCE,
    "consolidation": STEP_CONSOLIDATION,
    "contradictions": STEP_CONTRADICTIONS,
    "pruning": STEP_PRUNING,
    "decay": STEP_DECAY,
}

#: manager_state keys (all under "maintenance.")
STATE_LAST = "maintenance.last"
STATE_PHASE = "maintenance.phase."
STATE_CONSOLIDATED = "maintenance.consolidated_ids"
STATE_JUDGED_PAIRS = "maintenance.contradictions.judged"

#: rows per upsert when a phase saves many notes
SAVE_CHUNK = 50_000

STALE_REASONS = {
    "agent": "referenced agent is inactive or deleted",
    "user": "referenced user no longer exists",
    "company": "referenced company no longer exists",
    "conversation": "source conversation no longer exists",
}


# --------------------------------------------------------------------------- config


class MaintenanceError(MemoryPipelineError):
    """One or more maintenance phases failed; ``report`` holds what the run did."""

    def __init__(self, message: str, report: PhaseReport):
        super().__init__(message)
        self.report = report



def config_of(mem: MemoryContext) -> MaintenanceConfig:
    """The service's maintenance config (the reference defaults when it has none)."""
    cfg = getattr(mem, "maintenance_config", None)
    return cfg if isinstance(cfg, MaintenanceConfig) else MaintenanceConfig()


# --------------------------------------------------------------------------- helpers


def _run_id(run_id: str | None) -> str:
    return run_id or f"maintenance-{new_id()}"


def _unit(mat: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), so dot products are cosines."""
    mat = np.asarray(mat, dtype=np.float32)
    if mat.size == 0:
        return mat
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return mat / norms


def _step(
    mem: MemoryContext,
    run_id: str,
    name: str,
    step_type: str,
    input: Any,
    output: Any,
    started_at: datetime,
    status: str = "Completed",
    error: str | None = None,
) -> None:
    mem.sources.add_step(
        run_id,
        step_type,
        name,
        input=input,
        output=output,
        status=status,
        error_message=error,
        started_at=started_at,
        finished_at=mem.now(),
    )


def _step_row(
    mem: MemoryContext,
    run_id: str,
    name: str,
    step_type: str,
    input: Any,
    output: Any,
    started_at: datetime,
    error: str | None = None,
) -> dict[str, Any]:
    """An audit step row to insert later in bulk (see :func:`_flush_steps`)."""
    return {
        "run_id": run_id,
        "step_type": step_type,
        "step_name": name,
        "input_json": json.loads(json.dumps(input, default=str)),
        "output_json": json.loads(json.dumps(output, default=str)),
        "status": "Completed",
        "error_message": error,
        "started_at": started_at,
        "finished_at": mem.now(),
    }


def _flush_steps(mem: MemoryContext, rows: list[dict[str, Any]]) -> None:
    """Insert buffered audit steps in one transaction (thousands of clusters per run)."""
    if rows:
        with mem.sources.begin() as conn:
            conn.execute(insert(run_steps), rows)
        rows.clear()


def _record_phase(
    mem: MemoryContext,
    phase: str,
    run_id: str,
    report: PhaseReport,
    started_at: datetime,
    partition: str | None = None,
) -> None:
    """Remember what the phase did (counts and actions) for the inventory view and for
    :func:`finish_maintenance` (per partition for a partitioned run)."""
    mem.sources.set_state(
        state_key(STATE_PHASE + phase, partition),
        {
            "run_id": run_id,
            "started_at": iso(started_at),
            "at": iso(mem.now()),
            "counts": dict(report),
            "actions": dict(Counter(row["action"] for row in report.changed)),
        },
    )


def _close_phase(
    mem: MemoryContext,
    phase: str,
    step_name: str,
    run_id: str,
    step_input: Any,
    report: PhaseReport,
    started_at: datetime,
    output: Any = None,
    partition: str | None = None,
) -> None:
    """End a phase: its 'Decision' audit step (output: the report's counts unless given)
    and the record the inventory view and :func:`finish_maintenance` read."""
    _step(
        mem,
        run_id,
        step_name,
        "Decision",
        step_input,
        dict(report) if output is None else output,
        started_at,
    )
    _record_phase(mem, phase, run_id, report, started_at, partition)


def _save_notes(
    mem: MemoryContext, notes: Sequence[Note], vectors: np.ndarray | None = None
) -> None:
    """Save changed notes with their stored vectors (nothing is re-embedded)."""
    if not notes:
        return
    if vectors is None:
        stored = mem.store.notes.vectors([n.id for n in notes])
        missing = [n for n in notes if n.id not in stored]
        if missing:  # a row without a vector cannot exist, but never save a zero vector
            stored.update(
                zip([n.id for n in missing], mem.embed([n.note for n in missing]), strict=True)
            )
        vectors = np.stack([stored[n.id] for n in notes])
    for start in range(0, len(notes), SAVE_CHUNK):
        mem.notebook.save_notes(list(notes[start : start + SAVE_CHUNK]), vectors[start : start + SAVE_CHUNK])


def _save_examples(mem: MemoryContext, examples: Sequence[Example]) -> None:
    if not examples:
        return
    stored = mem.store.examples.vectors([e.id for e in examples])
    missing = [e for e in examples if e.id not in stored]
    if missing:
        stored.update(
            zip([e.id for e in missing], mem.embed([e.example_input for e in missing]), strict=True)
        )
    mem.notebook.save_examples(list(examples), np.stack([stored[e.id] for e in examples]))


def _example_changed(report: PhaseReport, example: Example, action: str) -> None:
    report.changed.append(
        {
            "id": example.id,
            "agent_id": example.agent_id,
            "user_id": example.user_id,
            "company_id": example.company_id,
            "type": "Example",
            "status": example.status,
            "protection_tier": None,
            "action": action,
            "note": example.example_input,
        }
    )


def _injection_stats(mem: MemoryContext) -> dict[str, InjectionStats]:
    """Per note: how many times it was injected and when last (``injection_events``)."""
    ev = injection_events
    q = (
        select(ev.c.item_id, func.count(), func.max(ev.c.injected_at))
        .where(ev.c.item_kind == "note")
        .group_by(ev.c.item_id)
    )
    with mem.sources.begin() as conn:
        return {row[0]: InjectionStats(int(row[1]), row[2]) for row in conn.execute(q)}


def _created(note: Note, now: datetime) -> datetime:
    return note.created_at or now


# --------------------------------------------------------------------------- 1. importance


def score_importance(
    mem: MemoryContext, run_id: str | None = None, *, partition: str | None = None
) -> PhaseReport:
    """Phase 1: score every Active note and auto-promote outstanding Standard notes.

    Reads the injectable notes and their vectors (uniqueness: 1 - similarity to the
    closest *other* injectable note of the same agent, as the reference searched it) and
    the injection events (relevance). Writes
    ``importance_score`` of every Active note whose score changed, and ``Protected`` plus
    an appended comment for promoted notes. Audit step "Compute Importance Scores".
    Returns notesScored, tierPromotions, scoreDistribution.
    """
    run_id = _run_id(run_id)
    cfg = config_of(mem).importance
    started = now = mem.now()
    notes, raw = mem.store.notes.scan_with_vectors(and_(injectable(), note_filter(partition)))
    mat = _unit(raw)
    active = np.array([n.status == ACTIVE for n in notes], dtype=bool)
    top_sim = np.full(len(notes), np.nan, dtype=np.float64)
    with single_blas_thread():
        for rows in group_indices(n.agent_id or "" for n in notes).values():
            queries = rows[active[rows]]
            if queries.size == 0:
                continue
            own = np.searchsorted(rows, queries)
            _, sims = top_neighbours(mat[queries], mat[rows], 1, self_index=own)
            best = sims[:, 0].astype(np.float64)
            best[~np.isfinite(best)] = np.nan
            top_sim[queries] = best

    cohort = np.nonzero(active)[0]
    uniq = {
        int(i): uniqueness_signal(
            notes[i].note, None if math.isnan(top_sim[i]) else float(top_sim[i])
        )
        for i in cohort
    }
    available = [s.value for s in uniq.values() if s.available]
    p95 = percentile_value(available, cfg.outlier_percentile, cfg.outlier_promotion_min_cohort)
    stats = _injection_stats(mem)

    report = PhaseReport()
    scores: list[float] = []
    changed_rows: list[int] = []
    changed_notes: list[Note] = []
    promotions = {"score": 0, "uniqueness": 0}
    for i in cohort:
        note = notes[i]
        signals = compute_signals(
            note, now, uniqueness=uniq[int(i)], injections=stats.get(note.id), cfg=cfg
        )
        score = importance_score(signals, cfg)
        scores.append(score)
        update: dict[str, Any] = {}
        if note.importance_score is None or abs(note.importance_score - score) > 1e-9:
            update["importance_score"] = score
        promo = promotion_for(note, score, uniq[int(i)], cohort_size=len(cohort), p95=p95, cfg=cfg)
        if promo is not None:
            update["protection_tier"] = PROTECTED
            update["comments"] = append_comment(note.comments, promo.comment)
            promotions[promo.path] += 1
        if update:
            new = note.model_copy(update=update)
            changed_rows.append(int(i))
            changed_notes.append(new)
            if promo is not None:
                report.note_changed(new, f"promoted-{promo.path}")
    _save_notes(mem, changed_notes, raw[changed_rows] if changed_rows else None)

    report.update(
        notesScored=len(scores),
        tierPromotions=promotions["score"] + promotions["uniqueness"],
        scoreDistribution=distribution(scores),
    )
    report.extra.update(
        promotionsByScore=promotions["score"],
        promotionsByUniqueness=promotions["uniqueness"],
        uniquenessP95=None if p95 is None else round(p95, 3),
        notesUpdated=len(changed_notes),
        notesWithInjections=sum(1 for i in cohort if notes[i].id in stats),
    )
    _close_phase(
        mem,
        "importance",
        STEP_IMPORTANCE,
        run_id,
        {"activeNoteCount": len(cohort)},
        report,
        started,
        partition=partition,
    )
    return report


# --------------------------------------------------------------------------- 2. consolidation


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


def _revoke_sources(
    mem: MemoryContext,
    notes: Sequence[Note],
    vectors: np.ndarray,
    revocations: Sequence[tuple[int, str, str]],
    report: PhaseReport,
) -> None:
    """Revoke ``(row, into_id, reason)`` sources into their consolidated note.

    Runs strictly after the consolidated notes are saved, so an interruption here leaves
    Active sources beside an existing consolidated note, which the next run completes.
    """
    if not revocations:
        return
    revoked: list[Note] = []
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
    _save_notes(mem, revoked, vectors[[r for r, _, _ in revocations]])


def _interrupted_revocations(notes: Sequence[Note]) -> list[tuple[int, str, str]]:
    """Sources still Active beside the consolidated note that should have revoked them
    (a run interrupted between "save new note" and "revoke sources")."""
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
            taken.add(row)
            out.append((row, c.id, reason))
    return out


def consolidate(
    mem: MemoryContext,
    run_id: str | None = None,
    *,
    trigger_type: str | None = None,
    partition: str | None = None,
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
    run_id = _run_id(run_id)
    mcfg = config_of(mem)
    cfg = mcfg.consolidation
    started = now = mem.now()
    notes, raw = mem.store.notes.scan_with_vectors(
        and_(eq("status", ACTIVE), eq("is_auto_generated", True), note_filter(partition))
    )
    mat = _unit(raw)
    report = PhaseReport()

    completion = _interrupted_revocations(notes)
    _revoke_sources(mem, notes, raw, completion, report)
    completed = {row for row, _, _ in completion}

    eligible = np.array(
        [
            n.protection_tier in (STANDARD, EPHEMERAL) and i not in completed
            for i, n in enumerate(notes)
        ],
        dtype=bool,
    )
    chunks: list[list[int]] = []
    # the reference needs at least 3 Active auto-generated notes before it clusters at all
    if len(notes) - len(completed) >= cfg.min_cluster_size and int(eligible.sum()) >= 2:
        cand = np.nonzero(eligible)[0]
        with single_blas_thread():
            groups = [
                cand[local]
                for local in group_indices(scope_group_key(notes[i]) for i in cand).values()
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
                range(rows.size), key=lambda j: (_created(notes[rows[j]], now), notes[rows[j]].id)
            )

            def min_size(j: int, rows: np.ndarray = rows) -> int:
                if notes[rows[j]].protection_tier == EPHEMERAL:
                    return cfg.ephemeral_min_cluster_size
                return cfg.min_cluster_size

            for cluster in greedy_clusters(order, nbrs, min_size):
                for chunk in chunk_cluster(cluster, cfg.max_cluster_size, cfg.min_cluster_size):
                    chunks.append([int(rows[j]) for j in chunk])

    verify = {
        "clustersVerified": 0,
        "entitiesChecked": 0,
        "entitiesMissing": 0,
        "verificationsPassed": 0,
        "verificationsFlagged": 0,
    }
    skipped: Counter[str] = Counter()
    new_ids: list[str] = []
    sources_revoked = 0

    def lookup(ids: list[str]) -> dict[str, Note]:
        return {n.id: n for n in mem.store.notes.get_many(ids)}

    planned: list[_Planned] = []
    steps: list[dict[str, Any]] = []
    batch_started = time.monotonic()
    for pos, chunk in enumerate(chunks):
        plan = _plan_cluster(mem, run_id, notes, chunk, cfg, lookup, verify, skipped, steps)
        if plan is not None:
            planned.append(plan)
        full = len(planned) >= max(1, cfg.batch_clusters)
        slow = time.monotonic() - batch_started >= cfg.batch_seconds
        if not (full or slow or pos == len(chunks) - 1):
            continue
        _flush_steps(mem, steps)
        if planned:
            new_vectors = mem.embed([p.note.note for p in planned])
            _save_notes(mem, [p.note for p in planned], new_vectors)
            for p in planned:
                report.note_changed(p.note, "consolidated")
                new_ids.append(p.note.id)
            revocations = [(row, p.note.id, p.reason) for p in planned for row in p.sources]
            _revoke_sources(mem, notes, raw, revocations, report)
            sources_revoked += len(revocations)
        planned = []
        batch_started = time.monotonic()

    _step(mem, run_id, STEP_VERIFY, "Validation", {"clusterCount": len(new_ids)}, verify, started)
    report.update(
        consolidatedClusterCount=len(new_ids),
        sourceNotesArchived=sources_revoked,
        newConsolidatedNoteIds=new_ids,
    )
    report.extra.update(
        clustersFound=len(chunks),
        clustersSkipped=dict(skipped),
        interruptedRevocationsCompleted=len(completion),
        verification=verify,
    )
    mem.sources.set_state(
        state_key(STATE_CONSOLIDATED, partition),
        {"run_id": run_id, "ids": new_ids, "consumed": False},
    )
    _close_phase(
        mem,
        "consolidation",
        STEP_CONSOLIDATION,
        run_id,
        {
            "frequency": mcfg.frequency,
            "triggerType": trigger_type or "manual",
            "activeNoteCount": len(notes),
        },
        report,
        started,
        output={**report, "interruptedRevocationsCompleted": len(completion)},
        partition=partition,
    )
    return report


def _plan_cluster(
    mem: MemoryContext,
    run_id: str,
    notes: Sequence[Note],
    chunk: list[int],
    cfg: ConsolidationConfig,
    lookup: Callable[[list[str]], Mapping[str, Note]],
    verify: dict[str, int],
    skipped: Counter[str],
    steps: list[dict[str, Any]],
) -> _Planned | None:
    """Ask the judge about one cluster and build (not save) its consolidated note; its
    audit step is appended to ``steps``."""
    started = mem.now()
    members = [notes[i] for i in chunk]
    max_cc = max(n.consolidation_count for n in members)
    judged, anchored, resolved = members, False, False
    if max_cc >= cfg.max_consolidation_count:
        originals = resolve_originals(members, lookup, cfg.max_source_resolution_depth)
        if originals:
            judged, resolved = originals, True
    elif max_cc > 0:
        anchored = True
    step_input = {
        "clusterSize": len(members),
        "noteIds": [n.id for n in members],
        "maxGeneration": max_cc,
        "anchoredMode": anchored,
        "resolvedToOriginals": len(judged) if resolved else 0,
    }

    def skip(reason: str, error: str | None = None) -> None:
        skipped[reason] += 1
        steps.append(
            _step_row(
                mem,
                run_id,
                STEP_CLUSTER,
                "Prompt",
                step_input,
                {"skipReason": reason},
                started,
                error,
            )
        )

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
    template = members[0]
    valid_types = {t.value for t in NoteType}
    note_type = decision.type if decision.type in valid_types else template.type
    check = verify_consolidation([n.note for n in judged], content)
    verify["clustersVerified"] += 1
    verify["entitiesChecked"] += check.checked
    verify["entitiesMissing"] += len(check.missing)
    verify["verificationsPassed" if check.passed else "verificationsFlagged"] += 1
    comments = f"Consolidated from {len(members)} notes: {reason}"
    if not check.passed:
        comments += check.comment(cfg.verification_entity_limit)
    ids = [n.id for n in members]
    new = Note(
        id=consolidation_note_id(ids),
        agent_id=template.agent_id,
        user_id=template.user_id,
        company_id=template.company_id,
        primary_scope_entity_id=template.primary_scope_entity_id,
        primary_scope_record_id=template.primary_scope_record_id,
        secondary_scopes=template.secondary_scopes,
        note=content,
        type=note_type,
        status=ACTIVE,
        author_type=AuthorType.MEMORY_MANAGER.value,
        protection_tier=STANDARD,
        is_auto_generated=True,
        access_count=sum(n.access_count for n in members),
        consolidation_count=max_cc + 1,
        derived_from_note_ids=ids,
        comments=comments,
        note_type_name=template.note_type_name,
    )
    steps.append(
        _step_row(
            mem,
            run_id,
            STEP_CLUSTER,
            "Prompt",
            step_input,
            {"newNoteId": new.id, "reason": reason, "verificationPassed": check.passed},
            started,
        )
    )
    return _Planned(new, list(chunk), reason)


# --------------------------------------------------------------------------- 3. contradictions


def _pair_fingerprint(a: Note, b: Note) -> str:
    first, second = (a, b) if a.id <= b.id else (b, a)
    return hashlib.sha1(f"{first.note}\x1f{second.note}".encode()).hexdigest()[:16]


def _this_cycle_consolidated(
    mem: MemoryContext, run_id: str | None, partition: str | None = None
) -> set[str]:
    """Ids of the notes this run's consolidation made (of this partition: concurrent
    partition runs keep separate records)."""
    state = mem.sources.get_state(state_key(STATE_CONSOLIDATED, partition)) or {}
    if not isinstance(state, dict):
        return set()
    if run_id is not None and state.get("run_id") == run_id:
        return set(state.get("ids") or [])
    if run_id is None and not state.get("consumed"):
        return set(state.get("ids") or [])
    return set()


def resolve_contradictions(
    mem: MemoryContext, run_id: str | None = None, *, partition: str | None = None
) -> PhaseReport:
    """Phase 3: judge similar note pairs of one scope and resolve contradictions.

    Seeds: Active, auto-generated, non-Immutable notes, newest first. Partners: the other
    injectable, non-Immutable notes of the same exact scope at similarity >= 0.70 (top 5
    per seed). Pairs both made by this cycle's consolidation, and pairs already judged
    with the same texts, are skipped; at most 50 pairs per run. A contradiction between
    two notes scored >= 7.0, or with a Protected note, is flagged on both (comment
    appended, both stay Active); otherwise the loser is Revoked into the keeper (comment
    appended). ``JudgeError``: the pair is left alone. Audit step "Detect Note
    Contradictions". Returns pairsAnalyzed, contradictionsFound, contradictionsResolved,
    contradictionsFlagged, entityTriplesExtracted.
    """
    run_id_given = run_id
    run_id = _run_id(run_id)
    cfg = config_of(mem).contradiction
    started = now = mem.now()
    fresh = _this_cycle_consolidated(mem, run_id_given, partition)
    notes, raw = mem.store.notes.scan_with_vectors(
        and_(injectable(), ne("protection_tier", IMMUTABLE), note_filter(partition))
    )
    mat = _unit(raw)
    is_seed = np.array([n.status == ACTIVE and n.is_auto_generated for n in notes], dtype=bool)
    partners_of: dict[int, list[int]] = {}
    with single_blas_thread():
        for rows in group_indices(scope_group_key(n) for n in notes).values():
            seeds = rows[is_seed[rows]]
            if seeds.size == 0 or rows.size < 2:
                continue
            nbrs, _ = top_neighbours(
                mat[seeds],
                mat[rows],
                cfg.top_k,
                min_similarity=cfg.similarity_threshold,
                self_index=np.searchsorted(rows, seeds),
            )
            for s, row_nbrs in zip(seeds, nbrs, strict=True):
                partners_of[int(s)] = [int(rows[j]) for j in row_nbrs if j >= 0]
    order = sorted(partners_of, key=lambda i: (_created(notes[i], now), notes[i].id), reverse=True)
    row_of = {n.id: i for i, n in enumerate(notes)}
    memo_raw = mem.sources.get_state(state_key(STATE_JUDGED_PAIRS, partition)) or {}
    memo: dict[str, str] = dict(memo_raw) if isinstance(memo_raw, dict) else {}

    def skip_pair(key: tuple[str, str]) -> bool:
        if key[0] in fresh and key[1] in fresh:
            return True
        a, b = notes[row_of[key[0]]], notes[row_of[key[1]]]
        return memo.get("|".join(key)) == _pair_fingerprint(a, b)

    pairs = select_pairs(
        ((notes[i].id, [notes[j].id for j in partners_of[i]]) for i in order),
        cfg.max_pairs_per_run,
        skip_pair,
    )

    current: dict[str, Note] = {}
    revoked: set[str] = set()
    counts = Counter()
    triples = 0
    report = PhaseReport()
    for a_id, b_id in pairs:
        if a_id in revoked or b_id in revoked:
            continue
        a = current.get(a_id, notes[row_of[a_id]])
        b = current.get(b_id, notes[row_of[b_id]])
        try:
            decision = mem.judge.detect_contradiction(a, b)
        except JudgeError as e:
            counts["judgeErrors"] += 1
            log.warning("contradiction judge failed for %s/%s: %s", a_id, b_id, e)
            continue
        counts["pairsAnalyzed"] += 1
        triples += len(decision.entity_triples)
        outcome = resolve(a, b, decision, cfg)
        key = "|".join(pair_key(a_id, b_id))
        if outcome.action == "none":
            memo[key] = _pair_fingerprint(a, b)
            continue
        counts["contradictionsFound"] += 1
        if outcome.action == "flag":
            current[a_id] = a.model_copy(
                update={"comments": append_comment(a.comments, flag_comment(b_id, outcome.reason))}
            )
            current[b_id] = b.model_copy(
                update={"comments": append_comment(b.comments, flag_comment(a_id, outcome.reason))}
            )
            report.note_changed(current[a_id], "flagged-contradiction")
            report.note_changed(current[b_id], "flagged-contradiction")
            memo[key] = _pair_fingerprint(a, b)
            counts["contradictionsFlagged"] += 1
        elif outcome.action == "revoke":
            loser = a if outcome.revoke_id == a_id else b
            current[loser.id] = loser.model_copy(
                update={
                    "status": NoteStatus.REVOKED.value,
                    "consolidated_into_note_id": outcome.keep_id,
                    "comments": append_comment(
                        loser.comments, resolved_comment(outcome.keep_id, outcome.reason)
                    ),
                }
            )
            revoked.add(loser.id)
            report.note_changed(current[loser.id], "revoked-contradiction")
            counts["contradictionsResolved"] += 1
        else:
            memo[key] = _pair_fingerprint(a, b)
            counts["contradictionsSkipped"] += 1
    changed = list(current.values())
    _save_notes(mem, changed, raw[[row_of[n.id] for n in changed]] if changed else None)
    if len(memo) > cfg.judged_memory_size:
        memo = dict(list(memo.items())[-cfg.judged_memory_size :])
    mem.sources.set_state(state_key(STATE_JUDGED_PAIRS, partition), memo)
    state = mem.sources.get_state(state_key(STATE_CONSOLIDATED, partition))
    if isinstance(state, dict) and not state.get("consumed"):
        mem.sources.set_state(state_key(STATE_CONSOLIDATED, partition), {**state, "consumed": True})

    report.update(
        pairsAnalyzed=counts["pairsAnalyzed"],
        contradictionsFound=counts["contradictionsFound"],
        contradictionsResolved=counts["contradictionsResolved"],
        contradictionsFlagged=counts["contradictionsFlagged"],
        entityTriplesExtracted=triples,
    )
    report.extra.update(
        judgeErrors=counts["judgeErrors"],
        contradictionsSkipped=counts["contradictionsSkipped"],
        seedsWithPartners=sum(1 for v in partners_of.values() if v),
    )
    _close_phase(
        mem,
        "contradictions",
        STEP_CONTRADICTIONS,
        run_id,
        {"consolidatedNoteIdsCount": len(fresh)},
        report,
        started,
        partition=partition,
    )
    return report


# --------------------------------------------------------------------------- 4. stale pruning


def prune_stale(
    mem: MemoryContext, run_id: str | None = None, *, partition: str | None = None
) -> PhaseReport:
    """Phase 4: archive auto notes whose agent, user, company or source conversation is gone.

    Candidates: Active, auto-generated, non-Immutable notes. An agent counts only if it
    exists and is Active. The oldest stale notes (at most 200) become Archived with
    "[Archived by Memory Manager: stale reference pruning - <reasons> on <ISO now>]"
    appended. Audit step "Prune Stale References". Returns notesArchived,
    orphanedAgents, orphanedUsers, orphanedCompanies, orphanedConversations.
    """
    run_id = _run_id(run_id)
    cfg = config_of(mem).pruning
    started = now = mem.now()
    cols = ["id", "agent_id", "user_id", "company_id", "source_conversation_id", "created_at"]
    df = mem.store.notes.scan(
        and_(
            eq("status", ACTIVE),
            eq("is_auto_generated", True),
            ne("protection_tier", IMMUTABLE),
            note_filter(partition),
        ),
        columns=cols,
    )
    flags: dict[str, pd.Series] = {}
    for kind, col in (
        ("agent", "agent_id"),
        ("user", "user_id"),
        ("company", "company_id"),
        ("conversation", "source_conversation_id"),
    ):
        values = df[col] if len(df) else pd.Series([], dtype=object)
        present = values.notna() & (values.astype(str) != "")
        known = mem.sources.existing_ids(kind, values[present].astype(str).unique().tolist())
        known_low = {k.lower() for k in known}
        flags[kind] = present & ~values.astype(str).str.lower().isin(known_low)
    stale = pd.Series(False, index=df.index)
    for mask in flags.values():
        stale |= mask
    picked = (
        df[stale].sort_values(["created_at", "id"], na_position="first").head(cfg.max_notes_per_run)
        if len(df)
        else df
    )
    report = PhaseReport()
    orphaned = Counter()
    archived: list[Note] = []
    if len(picked):
        reasons_of = {
            row_id: [STALE_REASONS[k] for k in STALE_REASONS if bool(flags[k].loc[idx])]
            for idx, row_id in picked["id"].items()
        }
        loaded, vectors = mem.store.notes.scan_with_vectors(in_("id", list(reasons_of)))
        stamp = iso(now)
        for note in loaded:
            reasons = reasons_of[note.id]
            for kind, text in STALE_REASONS.items():
                if text in reasons:
                    orphaned[kind] += 1
            new = note.model_copy(
                update={
                    "status": NoteStatus.ARCHIVED.value,
                    "comments": append_comment(
                        note.comments,
                        f"[Archived by Memory Manager: stale reference pruning - {'; '.join(reasons)} on {stamp}]",
                    ),
                }
            )
            archived.append(new)
            report.note_changed(new, "archived-stale")
        _save_notes(mem, archived, vectors)
    report.update(
        notesArchived=len(archived),
        orphanedAgents=orphaned["agent"],
        orphanedUsers=orphaned["user"],
        orphanedCompanies=orphaned["company"],
        orphanedConversations=orphaned["conversation"],
    )
    report.extra.update(candidatesChecked=len(df), staleFound=int(stale.sum()) if len(df) else 0)
    _close_phase(
        mem,
        "pruning",
        STEP_PRUNING,
        run_id,
        {"candidateCount": len(df)},
        report,
        started,
        partition=partition,
    )
    return report


# --------------------------------------------------------------------------- 5. TTL and decay


def _oldest_ids(df: pd.DataFrame, by: str, limit: int) -> list[str]:
    if df.empty or limit <= 0:
        return []
    return df.sort_values([by, "id"], na_position="first").head(limit)["id"].tolist()


def _untouched_since(df: pd.DataFrame) -> pd.Series:
    return df["last_accessed_at"].where(df["last_accessed_at"].notna(), df["created_at"])


def expire_and_decay(
    mem: MemoryContext, run_id: str | None = None, *, partition: str | None = None
) -> PhaseReport:
    """Phase 5: TTL expiry, then Ebbinghaus decay, of notes and examples.

    TTL: injectable non-Immutable notes and Active examples whose ``expires_at`` has
    passed (at most 200 each) become Archived with "[Archived by Memory Manager: expired
    on <expires_at>]" appended. Decay: Active auto-generated scored notes (and examples
    below success score 50) of agents with ``auto_archive_enabled``, longest untouched
    first (at most 1000 notes and 500 examples): a note falling below the floor is
    Archived with a comment, otherwise its decayed score is saved when the factor is
    below 0.99; Protected notes touched within 365 days and Immutable notes are exempt.
    Audit step "Decay-Based Archival". Returns notesArchived, examplesArchived,
    notesExpired, examplesExpired, decayScoreDistribution, protectedPreserved,
    ephemeralAccelerated.
    """
    run_id = _run_id(run_id)
    cfg = config_of(mem).decay
    started = now = mem.now()
    report = PhaseReport()

    # -- TTL: notes
    df = mem.store.notes.scan(
        and_(
            injectable(),
            not_null("expires_at"),
            cmp("expires_at", "<", now),
            ne("protection_tier", IMMUTABLE),
            note_filter(partition),
        ),
        columns=["id", "expires_at"],
    )
    expired_notes: list[Note] = []
    ids = _oldest_ids(df, "expires_at", cfg.ttl_max_notes_per_run)
    if ids:
        loaded, vectors = mem.store.notes.scan_with_vectors(in_("id", ids))
        for note in loaded:
            new = note.model_copy(
                update={
                    "status": NoteStatus.ARCHIVED.value,
                    "comments": append_comment(note.comments, expiry_comment(note.expires_at)),
                }
            )
            expired_notes.append(new)
            report.note_changed(new, "archived-expired")
        _save_notes(mem, expired_notes, vectors)

    # -- TTL: examples
    dfe = mem.store.examples.scan(
        and_(
            eq("status", ExampleStatus.ACTIVE.value),
            not_null("expires_at"),
            cmp("expires_at", "<", now),
            note_filter(partition),
        ),
        columns=["id", "expires_at"],
    )
    expired_examples: list[Example] = []
    for ex in mem.store.examples.get_many(
        _oldest_ids(dfe, "expires_at", cfg.ttl_max_examples_per_run)
    ):
        new = ex.model_copy(
            update={
                "status": ExampleStatus.ARCHIVED.value,
                "comments": append_comment(ex.comments, expiry_comment(ex.expires_at)),
            }
        )
        expired_examples.append(new)
        _example_changed(report, new, "archived-expired")
    _save_examples(mem, expired_examples)

    # -- decay: notes
    enabled = [a.agent_id for a in mem.sources.list_agents() if a.auto_archive_enabled]
    cols = ["id", "protection_tier", "last_accessed_at", "created_at"]
    dfn = mem.store.notes.scan(
        and_(
            eq("status", ACTIVE),
            eq("is_auto_generated", True),
            in_("agent_id", enabled),
            not_null("importance_score"),
            ne("protection_tier", IMMUTABLE),
            note_filter(partition),
        ),
        columns=cols,
    )
    protected_preserved = 0
    decay_ids: list[str] = []
    if len(dfn):
        since = _untouched_since(dfn)
        horizon = now - timedelta(days=cfg.protected_inactivity_days)
        preserved = (dfn["protection_tier"] == PROTECTED) & (since > horizon)
        protected_preserved = int(preserved.sum())
        rest = dfn[~preserved].assign(_since=since[~preserved])
        decay_ids = _oldest_ids(rest, "_since", cfg.max_notes_per_run)
    factors: list[float] = []
    ephemeral = 0
    decay_changed: list[Note] = []
    notes_archived = 0
    if decay_ids:
        loaded, vectors = mem.store.notes.scan_with_vectors(in_("id", decay_ids))
        rows: list[int] = []
        for i, note in enumerate(loaded):
            outcome = decay_note(note, now, cfg)
            if outcome.outcome == "protected-preserved":  # touched since the column scan
                protected_preserved += 1
                continue
            if outcome.outcome not in ("archive", "update", "unchanged"):
                continue
            factors.append(outcome.factor)
            ephemeral += int(outcome.ephemeral)
            if outcome.outcome == "archive":
                new = note.model_copy(
                    update={
                        "status": NoteStatus.ARCHIVED.value,
                        "importance_score": outcome.new_score,
                        "comments": append_comment(
                            note.comments, archival_comment(outcome.new_score, cfg)
                        ),
                    }
                )
                report.note_changed(new, "archived-decay")
                notes_archived += 1
            elif outcome.outcome == "update":
                new = note.model_copy(update={"importance_score": outcome.new_score})
            else:
                continue
            decay_changed.append(new)
            rows.append(i)
        _save_notes(mem, decay_changed, vectors[rows] if rows else None)

    # -- decay: examples
    dfx = mem.store.examples.scan(
        and_(
            eq("status", ExampleStatus.ACTIVE.value),
            eq("is_auto_generated", True),
            in_("agent_id", enabled),
            or_(is_null("success_score"), cmp("success_score", "<", cfg.example_success_threshold)),
            note_filter(partition),
        ),
        columns=["id", "last_accessed_at", "created_at"],
    )
    examples_archived: list[Example] = []
    if len(dfx):
        ids = _oldest_ids(
            dfx.assign(_since=_untouched_since(dfx)), "_since", cfg.max_examples_per_run
        )
        for ex in mem.store.examples.get_many(ids):
            outcome = decay_example(ex, now, cfg)
            if outcome.outcome != "archive":
                continue
            new = ex.model_copy(
                update={
                    "status": ExampleStatus.ARCHIVED.value,
                    "comments": append_comment(
                        ex.comments, example_archival_comment(outcome.effective_score)
                    ),
                }
            )
            examples_archived.append(new)
            _example_changed(report, new, "archived-decay")
        _save_examples(mem, examples_archived)

    report.update(
        notesArchived=notes_archived,
        examplesArchived=len(examples_archived),
        notesExpired=len(expired_notes),
        examplesExpired=len(expired_examples),
        decayScoreDistribution=(
            {
                "min": round(min(factors), 3),
                "max": round(max(factors), 3),
                "mean": round(sum(factors) / len(factors), 3),
            }
            if factors
            else None
        ),
        protectedPreserved=protected_preserved,
        ephemeralAccelerated=ephemeral,
    )
    report.extra.update(
        notesDecayed=len(decay_changed) - notes_archived, notesEvaluated=len(factors)
    )
    _close_phase(
        mem,
        "decay",
        STEP_DECAY,
        run_id,
        {"archiveEnabledAgents": len(enabled)},
        report,
        started,
        partition=partition,
    )
    return report


# --------------------------------------------------------------------------- trigger and run


def last_maintenance_at(mem: MemoryContext, partition: str | None = None) -> datetime | None:
    """When the last completed maintenance finished (``manager_state``, else the newest
    completed ``manager_runs`` row of kind 'maintenance'). For a ``partition``: the later
    of its own last maintenance and the last whole-pool one (which covered it)."""
    whole = _last_recorded(mem, None)
    if partition is None:
        return whole
    own = _last_recorded(mem, partition)
    return max((t for t in (whole, own) if t is not None), default=None)


def _last_recorded(mem: MemoryContext, partition: str | None) -> datetime | None:
    state = mem.sources.get_state(state_key(STATE_LAST, partition))
    if isinstance(state, dict) and state.get("at"):
        return datetime.fromisoformat(str(state["at"]).replace("Z", "+00:00"))
    if partition is not None:
        return None
    q = (
        select(manager_runs.c.finished_at, manager_runs.c.counts)
        .where(manager_runs.c.kind == "maintenance", manager_runs.c.status == "Completed")
        .order_by(manager_runs.c.finished_at.desc())
    )
    with mem.sources.begin() as conn:
        for finished, counts in conn.execute(q):
            if not (counts or {}).get("partition"):  # a whole-pool run
                return finished
    return None


def _cycles_since(mem: MemoryContext, since: datetime | None, partition: str | None = None) -> int:
    """Completed cycles started after ``since``: whole-pool ones, plus the partition's own
    for a ``partition`` (its name is in the recorded counts)."""
    q = select(manager_runs.c.counts).where(
        manager_runs.c.kind == "cycle", manager_runs.c.status == "Completed"
    )
    if since is not None:
        q = q.where(manager_runs.c.started_at > since)
    with mem.sources.begin() as conn:
        rows = conn.execute(q).scalars().all()
    names = {None} if partition is None else {None, partition}
    return sum(1 for counts in rows if (counts or {}).get("partition") in names)


def new_notes_per_agent(
    mem: MemoryContext, since: datetime | None, partition: str | None = None
) -> dict[str, int]:
    """Active auto-generated notes created after ``since``, counted per agent
    (cross-agent notes under ``""``), of one ``partition`` or of the whole pool."""
    conds = [eq("status", ACTIVE), eq("is_auto_generated", True), note_filter(partition)]
    if since is not None:
        conds.append(cmp("created_at", ">", since))
    df = mem.store.notes.scan(and_(*conds), columns=["agent_id"])
    if df.empty:
        return {}
    return {str(k): int(v) for k, v in df["agent_id"].fillna("").value_counts().items()}


def maintenance_trigger(
    mem: MemoryContext, force: bool = False, partition: str | None = None
) -> tuple[bool, str]:
    """Should maintenance run now, and why (reference §4.6, measured since the last
    *maintenance*, §6.2 item 1; the event count is per agent, FR-095/096). For a
    ``partition``: since its last maintenance, counting its cycles and its notes.

    Returns ``(True, "forced" | "every-run" | "time" | "count" | "event")`` or
    ``(False, "disabled" | "not-triggered")``.
    """
    if force:
        return True, "forced"
    cfg = config_of(mem)
    freq: Any = cfg.frequency
    if isinstance(freq, str) and freq.strip().isdigit():
        freq = int(freq.strip())
    if freq == "disabled":
        return False, "disabled"
    if isinstance(freq, bool) or not (freq in ("hourly", "daily") or isinstance(freq, int)):
        return True, "every-run"
    last = last_maintenance_at(mem, partition)
    if isinstance(freq, int):
        if freq <= 0:
            return True, "every-run"
        if _cycles_since(mem, last, partition) >= freq:
            return True, "count"
    else:
        if last is None:
            return True, "time"
        hours = (mem.now() - last).total_seconds() / 3600.0
        if hours >= (1.0 if freq == "hourly" else 24.0):
            return True, "time"
    counts = new_notes_per_agent(mem, last, partition)
    if counts and max(counts.values()) >= cfg.note_count_trigger:
        return True, "event"
    return False, "not-triggered"


def record_maintenance(
    mem: MemoryContext,
    run_id: str,
    trigger_type: str,
    started_at: datetime,
    counts: Mapping[str, Any],
    status: str = "Completed",
    partition: str | None = None,
) -> None:
    """Record a maintenance run: a ``manager_runs`` row of kind 'maintenance' (naming its
    partition, if any) and, when it completed, the last-maintenance time the trigger
    measures from."""
    finished = mem.now()
    with mem.sources.begin() as conn:
        conn.execute(
            insert(manager_runs).values(
                kind="maintenance",
                status=status,
                started_at=started_at,
                finished_at=finished,
                counts={"run_id": run_id, "triggerType": trigger_type, **_jsonable(counts)}
                | ({} if partition is None else {"partition": partition}),
            )
        )
    if status == "Completed":
        mem.sources.set_state(
            state_key(STATE_LAST, partition),
            {"at": iso(finished), "run_id": run_id, "trigger": trigger_type},
        )


def finish_maintenance(
    mem: MemoryContext, run_id: str, trigger_type: str, partition: str | None = None
) -> dict[str, Any]:
    """Record a maintenance whose phases ran one by one (the Dagster job) under ``run_id``.

    Totals what each phase remembered for this run. The run is 'Completed' (and moves the
    last-maintenance time) only when all five phases ran under ``run_id``; a partial
    materialization is recorded as 'Partial'. Returns the recorded summary counts.
    """
    phases: dict[str, Mapping[str, Any]] = {}
    starts: list[datetime] = []
    for phase in PHASES:
        state = mem.sources.get_state(state_key(STATE_PHASE + phase, partition))
        if isinstance(state, dict) and state.get("run_id") == run_id:
            phases[phase] = state.get("counts") or {}
            if state.get("started_at"):
                starts.append(
                    datetime.fromisoformat(str(state["started_at"]).replace("Z", "+00:00"))
                )
    summary = summary_counts(phases)
    status = "Completed" if len(phases) == len(PHASES) else "Partial"
    record_maintenance(
        mem,
        run_id,
        trigger_type,
        min(starts) if starts else mem.now(),
        {**summary, "phasesRun": list(phases)},
        status,
        partition,
    )
    return {**summary, "status": status}


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return value


def summary_counts(phases: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """The flat maintenance summary (reference §4.2 final message) from phase reports."""
    get = lambda phase, key: int((phases.get(phase) or {}).get(key) or 0)  # noqa: E731
    return {
        "notesScored": get("importance", "notesScored"),
        "tierPromotions": get("importance", "tierPromotions"),
        "consolidatedClusters": get("consolidation", "consolidatedClusterCount"),
        "sourceNotesRevoked": get("consolidation", "sourceNotesArchived"),
        "contradictionsResolved": get("contradictions", "contradictionsResolved"),
        "contradictionsFlagged": get("contradictions", "contradictionsFlagged"),
        "staleNotesPruned": get("pruning", "notesArchived"),
        "notesExpired": get("decay", "notesExpired"),
        "examplesExpired": get("decay", "examplesExpired"),
        "decayArchivedNotes": get("decay", "notesArchived"),
        "decayArchivedExamples": get("decay", "examplesArchived"),
    }


def summary_message(counts: Mapping[str, int]) -> str:
    """The reference's maintenance sentence appended to the cycle message."""
    return (
        f" Maintenance: consolidated {counts['consolidatedClusters']} clusters, resolved "
        f"{counts['contradictionsResolved']} contradictions, flagged {counts['contradictionsFlagged']}"
        f" high-importance contradictions, pruned {counts['staleNotesPruned']} stale notes,"
        f" decay-archived {counts['decayArchivedNotes']} notes + {counts['decayArchivedExamples']} examples."
    )


def run_maintenance(
    mem: MemoryContext,
    trigger_type: str,
    run_id: str | None = None,
    partition: str | None = None,
) -> PhaseReport:
    """Run the five phases in order and record the run.

    Each phase has its own error handling: a failing phase gets a 'Failed' audit step and
    the later phases still run; the run is then recorded and ``MaintenanceError`` (chained
    to the first failure, carrying the report) is raised. The run is recorded in
    ``manager_runs`` (kind 'maintenance', 'Completed' or 'Failed'); only a completed run
    moves the last-maintenance time the trigger measures from. Returns the flat summary counts plus
    ``phases`` (each phase's counts), ``errors``, ``triggerType`` and ``runId``; ``changed``
    holds every phase's changed rows. With a ``partition``, every phase works on that
    partition only and the table is not compacted (the whole-pool compaction does it).
    """
    run_id = _run_id(run_id)
    started = mem.now()
    part = {"partition": partition}
    phase_fns: dict[str, Callable[[], PhaseReport]] = {
        "importance": lambda: score_importance(mem, run_id, **part),
        "consolidation": lambda: consolidate(mem, run_id, trigger_type=trigger_type, **part),
        "contradictions": lambda: resolve_contradictions(mem, run_id, **part),
        "pruning": lambda: prune_stale(mem, run_id, **part),
        "decay": lambda: expire_and_decay(mem, run_id, **part),
    }
    reports: dict[str, PhaseReport] = {}
    errors: dict[str, str] = {}
    first_error: Exception | None = None
    for name in PHASES:
        phase_started = mem.now()
        try:
            reports[name] = phase_fns[name]()
        except Exception as e:  # each phase has its own error handling (reference §4.2)
            if not isinstance(e, MemoryPipelineError):
                log.exception("maintenance phase %s failed", name)
            errors[name] = f"{type(e).__name__}: {e}"[:2000]
            first_error = first_error or e
            _step(
                mem,
                run_id,
                PHASE_STEPS[name],
                "Decision",
                None,
                None,
                phase_started,
                "Failed",
                errors[name],
            )
    summary = summary_counts(reports)
    status = "Failed" if errors else "Completed"
    report = PhaseReport(
        {
            **summary,
            "triggerType": trigger_type,
            "runId": run_id,
            "status": status,
            "phases": {k: dict(v) for k, v in reports.items()},
            "errors": errors,
        }
    )
    for name in PHASES:
        if name in reports:
            report.changed.extend(dict(row, phase=name) for row in reports[name].changed)
            report.extra[name] = reports[name].extra
    report.extra["summary"] = summary_message(summary)
    record_maintenance(
        mem, run_id, trigger_type, started, {**summary, "errors": errors}, status, partition
    )
    if partition is None:
        try:
            report.extra["compaction"] = dict(compact_store(mem, run_id))
        except MemoryPipelineError as e:  # compaction is housekeeping: never fails the run
            log.warning("note table compaction failed: %s", e)
            report.extra["compaction"] = {"error": str(e)}
    if errors:
        raise MaintenanceError(
            f"maintenance {run_id} failed in {', '.join(errors)}: {next(iter(errors.values()))}",
            report,
        ) from first_error
    return report


def compact_store(mem: MemoryContext, run_id: str | None = None) -> PhaseReport:
    """Compact the note and example tables and keep their scalar indexes current.

    Every LanceDB write is a new table version with small files; this merges them
    (``optimize``), folds new rows into the indexes, removes versions older than
    ``cleanup_older_than`` and creates the Bitmap indexes of ``indexed_columns`` when
    missing. Runs after the maintenance phases; it changes no note.
    """
    run_id = _run_id(run_id)
    started = mem.now()
    cfg = config_of(mem)
    mem.store.notes.ensure_scalar_indexes(cfg.indexed_columns)
    mem.store.examples.ensure_scalar_indexes(("agent_id", "status"))
    result = mem.store.optimize(cleanup_older_than=cfg.cleanup_older_than)
    counts = {
        "notesVersionBefore": result["notes"]["version_before"],
        "notesVersionAfter": result["notes"]["version_after"],
        "notesVersionsKept": len(mem.store.notes.list_versions()),
        "examplesVersionsKept": len(mem.store.examples.list_versions()),
    }
    _step(mem, run_id, "Compact Note Tables", "Decision", None, counts, started, "Completed", None)
    return PhaseReport(counts)


# --------------------------------------------------------------------------- inventory


def last_maintenance_frame(mem: MemoryContext) -> pd.DataFrame:
    """Per phase of the most recent maintenance: its run, when it ran, its counts and the
    actions it took on notes (from ``manager_state``; empty before the first run)."""
    rows = []
    for phase in PHASES:
        state = mem.sources.get_state(STATE_PHASE + phase)
        if not isinstance(state, dict):
            continue
        counts = {
            k: v for k, v in (state.get("counts") or {}).items() if isinstance(v, (int, float))
        }
        rows.append(
            {
                "phase": phase,
                "run_id": state.get("run_id"),
                "at": state.get("at"),
                "counts": ", ".join(f"{k}={v}" for k, v in counts.items()),
                "actions": ", ".join(f"{k}={v}" for k, v in (state.get("actions") or {}).items())
                or "-",
            }
        )
    return pd.DataFrame(rows, columns=["phase", "run_id", "at", "counts", "actions"])


def maintenance_inventory(mem: MemoryContext) -> dict[str, pd.DataFrame]:
    """The note inventory (:func:`memory_pipelines.inventory.note_inventory`: counts by
    status, tier, type and agent, importance distribution) plus ``last_maintenance``."""
    frames = dict(note_inventory(mem))
    frames["last_maintenance"] = last_maintenance_frame(mem)
    return frames
