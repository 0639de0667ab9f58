"""Importance scoring, maintenance phase 1 (reference §4.7): every Active note gets a
0-10 importance from seven signals; Standard notes at >= 8.0, or at/above the cohort's
95th-percentile uniqueness, become Protected (never demoted)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memory_pipelines.blas import single_blas_thread
from memory_pipelines.context import MemoryContext
from memory_pipelines.note_events import EventKind, NoteEvent
from memory_pipelines.notes import Note, append_comment
from memory_pipelines.partitions import note_filter
from memory_pipelines.phases.clustering import group_indices, top_neighbours
from memory_pipelines.phases.common import (
    ACTIVE,
    PROTECTED,
    PhaseRun,
    manager_event,
    save_notes,
    unit,
)
from memory_pipelines.phases.lease import exclusive_phase
from memory_pipelines.phases.reports import PhaseReport
from memory_pipelines.phases.scoring import (
    InjectionStats,
    Signal,
    compute_signals,
    distribution,
    importance_score,
    percentile_value,
    promotion_for,
    uniqueness_signal,
)
from memory_pipelines.store import and_, injectable

#: the audit step name, as the reference writes it
STEP = "Compute Importance Scores"


def _injection_stats(mem: MemoryContext) -> dict[str, InjectionStats]:
    """Per note: how many times it was injected and when last (``injection_events``)."""
    return {
        note_id: InjectionStats(count, last)
        for note_id, (count, last) in mem.sources.note_injection_stats().items()
    }


@dataclass
class _Scoring:
    """The scores given, the notes whose score or tier changed (rows and new values),
    the promotion events and the promotions by path."""

    scores: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    changed: list[Note] = field(default_factory=list)
    events: list[NoteEvent] = field(default_factory=list)
    promotions: dict[str, int] = field(default_factory=lambda: {"score": 0, "uniqueness": 0})


@exclusive_phase
def run(mem: MemoryContext, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
    """Phase 1: score every Active note and auto-promote outstanding Standard notes.

    Reads the injectable notes and their vectors (uniqueness: 1 - similarity to the
    closest *other* injectable note of the same agent, as the reference searched it) and
    the injection events (relevance). Writes
    ``importance_score`` of every Active note whose score changed, and ``Protected`` plus
    an appended comment for promoted notes (one ``protection-changed`` event each; a score
    alone is no event). Audit step "Compute Importance Scores".
    Returns notesScored, tierPromotions, scoreDistribution.
    """
    pr = PhaseRun.start(mem, run_id, partition)
    notes, raw = mem.store.notes.scan_with_vectors(and_(injectable(), note_filter(partition)))
    active = np.array([n.status == ACTIVE for n in notes], dtype=bool)
    top_sim = _closest_similarity(notes, unit(raw), active)
    cohort = np.nonzero(active)[0]
    uniq = {
        int(i): uniqueness_signal(
            notes[i].note, None if math.isnan(top_sim[i]) else float(top_sim[i])
        )
        for i in cohort
    }
    cfg = mem.maintenance_config.importance
    available = [s.value for s in uniq.values() if s.available]
    p95 = percentile_value(available, cfg.outlier_percentile, cfg.outlier_promotion_min_cohort)
    stats = _injection_stats(mem)
    scoring = _Scoring()
    for i in cohort:
        _score(pr, scoring, notes[i], int(i), uniq[int(i)], len(cohort), p95, stats)
    save_notes(mem, scoring.changed, raw[scoring.rows] if scoring.rows else None, scoring.events)
    _record(pr, scoring, p95, sum(1 for i in cohort if notes[i].id in stats), len(cohort))
    return pr.report


def _closest_similarity(notes: list[Note], mat: np.ndarray, active: np.ndarray) -> np.ndarray:
    """Per note, the similarity of the closest *other* injectable note of its agent (NaN
    for notes not Active, or with no other note)."""
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
    return top_sim


def _score(
    pr: PhaseRun,
    scoring: _Scoring,
    note: Note,
    row: int,
    uniq: Signal,
    cohort_size: int,
    p95: float | None,
    stats: dict[str, InjectionStats],
) -> None:
    """Score one Active note; promote it to Protected when it qualifies (one
    ``protection-changed`` event)."""
    cfg = pr.mem.maintenance_config.importance
    signals = compute_signals(note, pr.now, uniqueness=uniq, injections=stats.get(note.id), cfg=cfg)
    score = importance_score(signals, cfg)
    scoring.scores.append(score)
    update: dict[str, Any] = {}
    if note.importance_score is None or abs(note.importance_score - score) > 1e-9:
        update["importance_score"] = score
    promo = promotion_for(note, score, uniq, cohort_size=cohort_size, p95=p95, cfg=cfg)
    if promo is not None:
        update["protection_tier"] = PROTECTED
        update["comments"] = append_comment(note.comments, promo.comment)
        scoring.promotions[promo.path] += 1
    if not update:
        return
    new = note.model_copy(update=update)
    scoring.rows.append(row)
    scoring.changed.append(new)
    if promo is not None:
        pr.report.note_changed(new, f"promoted-{promo.path}")
        scoring.events.append(
            manager_event(
                EventKind.PROTECTION_CHANGED, new, note, phase="importance",
                run_id=pr.run_id, rule="importance", reason=promo.comment.strip(" []"),
                path=promo.path,
            )
        )  # fmt: skip


def _record(
    pr: PhaseRun, scoring: _Scoring, p95: float | None, with_injections: int, cohort_size: int
) -> None:
    """Fill the report's counts and close the phase with its audit step."""
    promotions = scoring.promotions
    pr.report.update(
        notesScored=len(scoring.scores),
        tierPromotions=promotions["score"] + promotions["uniqueness"],
        scoreDistribution=distribution(scoring.scores),
    )
    pr.report.extra.update(
        promotionsByScore=promotions["score"],
        promotionsByUniqueness=promotions["uniqueness"],
        uniquenessP95=None if p95 is None else round(p95, 3),
        notesUpdated=len(scoring.changed),
        notesWithInjections=with_injections,
    )
    pr.close("importance", STEP, {"activeNoteCount": cohort_size})
