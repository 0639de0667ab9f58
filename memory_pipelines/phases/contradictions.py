"""Contradiction resolution, maintenance phase 3 (reference §4.9): similar note pairs of
one scope are judged; the loser is revoked, or both are flagged when they are important
or Protected."""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from memory_pipelines.blas import single_blas_thread
from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import JudgeError
from memory_pipelines.judge.decisions import ContradictionDecision
from memory_pipelines.note_events import EventKind, NoteEvent
from memory_pipelines.notes import Note, NoteStatus, append_comment
from memory_pipelines.partitions import note_filter, state_key
from memory_pipelines.phases.clustering import (
    group_indices,
    scope_group_key,
    top_neighbours,
)
from memory_pipelines.phases.common import (
    ACTIVE,
    IMMUTABLE,
    PhaseRun,
    created,
    manager_event,
    restored_against,
    save_notes,
    unit,
)
from memory_pipelines.phases.consolidation import STATE_CONSOLIDATED
from memory_pipelines.phases.contradiction_rules import (
    Resolution,
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


@dataclass
class _Resolutions:
    """The judged pairs' outcomes, applied in memory: the notes as changed so far, their
    events, the revoked ids, the pair memo (by content) and the counts."""

    notes: list[Note]
    row_of: dict[str, int]
    memo: dict[str, str]
    restored: set[str]
    current: dict[str, Note] = field(default_factory=dict)
    events: list[NoteEvent] = field(default_factory=list)
    revoked: set[str] = field(default_factory=set)
    counts: Counter = field(default_factory=Counter)
    triples: int = 0

    def note(self, note_id: str) -> Note:
        """The note as this run changed it so far."""
        return self.current.get(note_id, self.notes[self.row_of[note_id]])


@exclusive_phase
def run(mem: MemoryContext, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
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
    pr = PhaseRun.start(mem, run_id, partition)
    fresh = this_cycle_consolidated(mem, run_id, partition)
    notes, raw = mem.store.notes.scan_with_vectors(
        and_(injectable(), ne("protection_tier", IMMUTABLE), note_filter(partition))
    )
    partners_of = _partners(mem, notes, unit(raw))
    res = _Resolutions(notes, {n.id: i for i, n in enumerate(notes)}, _judged_memo(pr), set())
    pairs = _pairs_to_judge(pr, res, partners_of, fresh)
    res.restored = restored_against(mem, {i for pair in pairs for i in pair}, RULE)
    for a_id, b_id in pairs:
        if a_id not in res.revoked and b_id not in res.revoked:
            _judge_pair(pr, res, res.note(a_id), res.note(b_id))
    _save(pr, res, raw)
    _record(pr, res, partners_of, fresh)
    return pr.report


def _partners(mem: MemoryContext, notes: list[Note], mat: np.ndarray) -> dict[int, list[int]]:
    """Each seed's row -> the rows of its partners: the nearest notes of its exact scope
    at or above the similarity threshold (at most ``top_k``)."""
    cfg = mem.maintenance_config.contradiction
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
    return partners_of


def _judged_memo(pr: PhaseRun) -> dict[str, str]:
    """The pairs already judged (pair key -> the fingerprint of their texts)."""
    memo_raw = pr.mem.sources.get_state(state_key(STATE_JUDGED_PAIRS, pr.partition)) or {}
    return dict(memo_raw) if isinstance(memo_raw, dict) else {}


def _pairs_to_judge(
    pr: PhaseRun, res: _Resolutions, partners_of: dict[int, list[int]], fresh: set[str]
) -> list[tuple[str, str]]:
    """The pairs to judge this run, newest seed first, skipping pairs both made by this
    cycle's consolidation, a note beside its merge source and pairs judged with the same
    texts (at most ``max_pairs_per_run``)."""
    notes, row_of, memo = res.notes, res.row_of, res.memo
    order = sorted(
        partners_of, key=lambda i: (created(notes[i], pr.now), notes[i].id), reverse=True
    )

    def skip_pair(key: tuple[str, str]) -> bool:
        if key[0] in fresh and key[1] in fresh:
            return True
        a, b = notes[row_of[key[0]]], notes[row_of[key[1]]]
        if _lineage_pair(a, b):
            return True
        return memo.get("|".join(key)) == _pair_fingerprint(a, b)

    return select_pairs(
        ((notes[i].id, [notes[j].id for j in partners_of[i]]) for i in order),
        pr.mem.maintenance_config.contradiction.max_pairs_per_run,
        skip_pair,
    )


def _judge_pair(pr: PhaseRun, res: _Resolutions, a: Note, b: Note) -> None:
    """Judge one pair and apply the outcome in memory: nothing, flag both, keep both (the
    analyst restored the loser) or revoke the loser into the keeper."""
    counts = res.counts
    try:
        decision = pr.mem.judge.detect_contradiction(a, b)
    except JudgeError as e:
        counts["judgeErrors"] += 1
        log.warning("contradiction judge failed for %s/%s: %s", a.id, b.id, e)
        return
    counts["pairsAnalyzed"] += 1
    res.triples += len(decision.entity_triples)
    outcome = resolve(a, b, decision, pr.mem.maintenance_config.contradiction)
    key = "|".join(pair_key(a.id, b.id))
    if outcome.action == "none":
        res.memo[key] = _pair_fingerprint(a, b)
        return
    counts["contradictionsFound"] += 1
    if outcome.action == "flag":
        for note, other in ((a, b), (b, a)):
            res.current[note.id] = note.model_copy(
                update={
                    "comments": append_comment(
                        note.comments, flag_comment(other.id, outcome.reason)
                    )
                }
            )
        pr.report.note_changed(res.current[a.id], "flagged-contradiction")
        pr.report.note_changed(res.current[b.id], "flagged-contradiction")
        res.memo[key] = _pair_fingerprint(a, b)
        counts["contradictionsFlagged"] += 1
    elif outcome.action == "revoke" and outcome.revoke_id in res.restored:
        # the analyst restored the loser: keep both (not memoised, so that a later
        # change of the note by the analyst lets the rule apply again)
        counts["restoredKept"] += 1
    elif outcome.action == "revoke":
        _revoke(pr, res, a if outcome.revoke_id == a.id else b, outcome, decision)
        counts["contradictionsResolved"] += 1
    else:
        res.memo[key] = _pair_fingerprint(a, b)
        counts["contradictionsSkipped"] += 1


def _revoke(
    pr: PhaseRun,
    res: _Resolutions,
    loser: Note,
    outcome: Resolution,
    decision: ContradictionDecision,
) -> None:
    """Revoke the pair's loser into the keeper, with a ``revoked`` event naming it."""
    res.current[loser.id] = loser.model_copy(
        update={
            "status": NoteStatus.REVOKED.value,
            "consolidated_into_note_id": outcome.keep_id,
            "comments": append_comment(
                loser.comments, resolved_comment(outcome.keep_id, outcome.reason)
            ),
        }
    )
    res.revoked.add(loser.id)
    pr.report.note_changed(res.current[loser.id], "revoked-contradiction")
    res.events.append(
        manager_event(
            EventKind.REVOKED, res.current[loser.id], loser, phase="contradictions",
            run_id=pr.run_id, rule=RULE, reason=outcome.reason, related=[outcome.keep_id],
            contradiction_type=decision.contradiction_type,
            confidence=decision.confidence,
        )
    )  # fmt: skip


def _save(pr: PhaseRun, res: _Resolutions, raw: np.ndarray) -> None:
    """Save the changed notes with their events, the pair memo (its newest
    ``judged_memory_size`` entries), and mark this cycle's consolidation consumed."""
    mem, partition = pr.mem, pr.partition
    changed = list(res.current.values())
    save_notes(
        mem, changed, raw[[res.row_of[n.id] for n in changed]] if changed else None, res.events
    )
    memo, size = res.memo, mem.maintenance_config.contradiction.judged_memory_size
    if len(memo) > size:
        memo = dict(list(memo.items())[-size:])
    mem.sources.set_state(state_key(STATE_JUDGED_PAIRS, partition), memo)
    state = mem.sources.get_state(state_key(STATE_CONSOLIDATED, partition))
    if isinstance(state, dict) and not state.get("consumed"):
        mem.sources.set_state(state_key(STATE_CONSOLIDATED, partition), {**state, "consumed": True})


def _record(
    pr: PhaseRun, res: _Resolutions, partners_of: dict[int, list[int]], fresh: set[str]
) -> None:
    """Fill the report's counts and close the phase with its audit step."""
    counts = res.counts
    pr.report.update(
        pairsAnalyzed=counts["pairsAnalyzed"],
        contradictionsFound=counts["contradictionsFound"],
        contradictionsResolved=counts["contradictionsResolved"],
        contradictionsFlagged=counts["contradictionsFlagged"],
        entityTriplesExtracted=res.triples,
    )
    pr.report.extra.update(
        judgeErrors=counts["judgeErrors"],
        contradictionsSkipped=counts["contradictionsSkipped"],
        restoredKept=counts["restoredKept"],
        seedsWithPartners=sum(1 for v in partners_of.values() if v),
    )
    pr.close("contradictions", STEP, {"consolidatedNoteIdsCount": len(fresh)})
