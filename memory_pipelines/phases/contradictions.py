"""Contradiction resolution, maintenance phase 3 (reference §4.9): similar note pairs of
one scope are judged; the loser is revoked, or both are flagged when they are important
or Protected."""

from __future__ import annotations

import hashlib
import logging
from collections import Counter

import numpy as np

from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import JudgeError
from memory_pipelines.events import EventKind, NoteEvent
from memory_pipelines.notes import Note, NoteStatus, append_comment
from memory_pipelines.partitions import note_filter, state_key
from memory_pipelines.phases import audit
from memory_pipelines.phases.clustering import (
    group_indices,
    scope_group_key,
    single_blas_thread,
    top_neighbours,
)
from memory_pipelines.phases.common import (
    ACTIVE,
    IMMUTABLE,
    created,
    maintenance_run_id,
    manager_event,
    restored_against,
    save_notes,
    unit,
)
from memory_pipelines.phases.consolidation import STATE_CONSOLIDATED
from memory_pipelines.phases.contradiction_rules import (
    flag_comment,
    pair_key,
    resolve,
    resolved_comment,
    select_pairs,
)
from memory_pipelines.phases.lease import exclusive_phase
from memory_pipelines.phases.reports import PhaseReport
from memory_pipelines.store import and_, injectable, ne

log = logging.getLogger(__name__)

#: the audit step name, as the reference writes it
STEP = "Detect Note Contradictions"
#: manager_state key of the judged pairs (by content)
STATE_JUDGED_PAIRS = "maintenance.contradictions.judged"
#: the ``details.rule`` of this phase's events (and of the restores that undo them)
RULE = "contradiction"


def _pair_fingerprint(a: Note, b: Note) -> str:
    first, second = (a, b) if a.id <= b.id else (b, a)
    return hashlib.sha1(f"{first.note}\x1f{second.note}".encode()).hexdigest()[:16]


def _lineage_pair(a: Note, b: Note) -> bool:
    """One note is consolidated from the other (a merge source an analyst restored beside
    the note that merged it): the merged note holds the source, it does not contradict it."""
    return a.id in (b.derived_from_note_ids or []) or b.id in (a.derived_from_note_ids or [])


def this_cycle_consolidated(
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


@exclusive_phase
def run(
    mem: MemoryContext, run_id: str | None = None, partition: str | None = None
) -> PhaseReport:
    """Phase 3: judge similar note pairs of one scope and resolve contradictions.

    Seeds: Active, auto-generated, non-Immutable notes, newest first. Partners: the other
    injectable, non-Immutable notes of the same exact scope at similarity >= 0.70 (top 5
    per seed). Pairs both made by this cycle's consolidation, and pairs already judged
    with the same texts, are skipped; at most 50 pairs per run. A contradiction between
    two notes scored >= 7.0, or with a Protected note, is flagged on both (comment
    appended, both stay Active); otherwise the loser is Revoked into the keeper (comment
    appended, a ``revoked`` event naming the keeper), unless an analyst restored the loser
    from a contradiction (both stay). A note and the note consolidated from it are not a
    pair. ``JudgeError``: the pair is left alone. Audit step "Detect Note
    Contradictions". Returns pairsAnalyzed, contradictionsFound, contradictionsResolved,
    contradictionsFlagged, entityTriplesExtracted.
    """
    run_id_given = run_id
    run_id = maintenance_run_id(run_id)
    cfg = mem.maintenance_config.contradiction
    started = now = mem.now()
    fresh = this_cycle_consolidated(mem, run_id_given, partition)
    notes, raw = mem.store.notes.scan_with_vectors(
        and_(injectable(), ne("protection_tier", IMMUTABLE), note_filter(partition))
    )
    mat = unit(raw)
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
    order = sorted(partners_of, key=lambda i: (created(notes[i], now), notes[i].id), reverse=True)
    row_of = {n.id: i for i, n in enumerate(notes)}
    memo_raw = mem.sources.get_state(state_key(STATE_JUDGED_PAIRS, partition)) or {}
    memo: dict[str, str] = dict(memo_raw) if isinstance(memo_raw, dict) else {}

    def skip_pair(key: tuple[str, str]) -> bool:
        if key[0] in fresh and key[1] in fresh:
            return True
        a, b = notes[row_of[key[0]]], notes[row_of[key[1]]]
        if _lineage_pair(a, b):
            return True
        return memo.get("|".join(key)) == _pair_fingerprint(a, b)

    pairs = select_pairs(
        ((notes[i].id, [notes[j].id for j in partners_of[i]]) for i in order),
        cfg.max_pairs_per_run,
        skip_pair,
    )

    restored = restored_against(mem, {i for pair in pairs for i in pair}, RULE)
    current: dict[str, Note] = {}
    events: list[NoteEvent] = []
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
        elif outcome.action == "revoke" and outcome.revoke_id in restored:
            # the analyst restored the loser: keep both (not memoised, so that a later
            # change of the note by the analyst lets the rule apply again)
            counts["restoredKept"] += 1
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
            events.append(
                manager_event(
                    EventKind.REVOKED, current[loser.id], loser, phase="contradictions",
                    run_id=run_id, rule=RULE, reason=outcome.reason, related=[outcome.keep_id],
                    contradiction_type=decision.contradiction_type,
                    confidence=decision.confidence,
                )
            )  # fmt: skip
            counts["contradictionsResolved"] += 1
        else:
            memo[key] = _pair_fingerprint(a, b)
            counts["contradictionsSkipped"] += 1
    changed = list(current.values())
    save_notes(mem, changed, raw[[row_of[n.id] for n in changed]] if changed else None, events)
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
        restoredKept=counts["restoredKept"],
        seedsWithPartners=sum(1 for v in partners_of.values() if v),
    )
    audit.close_phase(
        mem,
        "contradictions",
        STEP,
        run_id,
        {"consolidatedNoteIdsCount": len(fresh)},
        report,
        started,
        partition=partition,
    )
    return report
