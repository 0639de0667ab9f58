"""Importance scoring: the seven signals, the weight redistribution and auto-promotion.

Pure functions of a note, the clock and precomputed facts about it (its top similarity to
another note, how often it was injected); nothing here reads or writes the store. The
numbers are the reference defaults (reference §4.1, §4.7) and live in
:class:`ImportanceConfig`.

The score is ``10 * sum(value * adjusted_weight)`` over the signals, where every
*available* signal's weight becomes ``w + (w / A) * U`` (``A``/``U``: total weight of the
available/unavailable signals), plus a correction bonus (capped at 10), rounded to 2 dp.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from memory_pipelines.config import ImportanceConfig
from memory_pipelines.judge import reads_as_instruction
from memory_pipelines.notes import Note, ProtectionTier


@dataclass(frozen=True)
class Signal:
    """One importance signal: a value in [0, 1] and whether it carries information."""

    value: float
    available: bool


@dataclass(frozen=True)
class InjectionStats:
    """How often and how recently a note was injected into an agent's context."""

    count: int
    last_injected_at: datetime | None


@dataclass(frozen=True)
class ImportanceSignals:
    """The seven signals of one note, in the reference order."""

    recency: Signal
    llm_importance: Signal
    relevance: Signal
    uniqueness: Signal
    correction_boost: Signal
    goal_alignment: Signal
    user_mark: Signal

    def weighted(self, cfg: ImportanceConfig) -> list[tuple[Signal, float]]:
        return [
            (self.recency, cfg.recency_weight),
            (self.llm_importance, cfg.llm_importance_weight),
            (self.relevance, cfg.relevance_weight),
            (self.uniqueness, cfg.uniqueness_weight),
            (self.correction_boost, cfg.correction_weight),
            (self.goal_alignment, cfg.goal_alignment_weight),
            (self.user_mark, cfg.user_mark_weight),
        ]


def _hours(now: datetime, then: datetime | None) -> float:
    if then is None:
        return 0.0
    return max(0.0, (now - then).total_seconds() / 3600.0)


def uniqueness_signal(text: str | None, top_similarity: float | None) -> Signal:
    """``1 - similarity`` of the most similar *other* note (1.0 when there is none or
    it points away); an empty text gives 0.5, unavailable."""
    if not text or not text.strip():
        return Signal(0.5, False)
    if top_similarity is None or top_similarity < 0.0:
        return Signal(1.0, True)
    return Signal(min(1.0, max(0.0, 1.0 - float(top_similarity))), True)


def relevance_signal(
    stats: InjectionStats | None, now: datetime, cfg: ImportanceConfig = ImportanceConfig()
) -> Signal:
    """How much agents actually use the note, from its injection history.

    Unavailable (0.5, as the reference placeholder) for a note never injected, so such a
    note scores exactly as in the reference. Otherwise
    ``0.5 * min(1, log1p(count) / log1p(saturation)) + 0.5 * base ** hours_since_last``:
    half frequency (log-saturating at ``relevance_saturation_count`` injections), half
    freshness of the last injection.
    """
    if stats is None or stats.count <= 0:
        return Signal(0.5, False)
    freq = min(1.0, math.log1p(stats.count) / math.log1p(max(1, cfg.relevance_saturation_count)))
    fresh = cfg.relevance_recency_base_per_hour ** _hours(now, stats.last_injected_at)
    return Signal(0.5 * freq + 0.5 * fresh, True)


def compute_signals(
    note: Note,
    now: datetime,
    *,
    uniqueness: Signal,
    injections: InjectionStats | None = None,
    cfg: ImportanceConfig = ImportanceConfig(),
) -> ImportanceSignals:
    """The seven signals of ``note`` at ``now`` (reference §4.7, relevance from usage)."""
    comments = note.comments or ""
    recency = Signal(cfg.recency_base_per_hour ** _hours(now, note.created_at), True)
    if "confidence" in comments:
        llm = Signal(cfg.llm_importance_value, True)
    else:
        llm = Signal(0.5, False)
    correction = Signal(
        1.0 if ("Superseded" in comments or "contradiction" in comments) else 0.0, True
    )
    return ImportanceSignals(
        recency=recency,
        llm_importance=llm,
        relevance=relevance_signal(injections, now, cfg),
        uniqueness=uniqueness,
        correction_boost=correction,
        goal_alignment=Signal(0.5, False),
        user_mark=Signal(0.0 if note.is_auto_generated else 1.0, True),
    )


def importance_score(
    signals: ImportanceSignals, cfg: ImportanceConfig = ImportanceConfig()
) -> float:
    """The 0-10 importance of a note from its signals, rounded to 2 dp.

    Unavailable signals' weight is spread over the available ones in proportion to their
    own weight (``w + (w / A) * U``); a correction adds ``correction_bonus_points``.
    """
    pairs = signals.weighted(cfg)
    available = sum(w for s, w in pairs if s.available)
    unavailable = sum(w for s, w in pairs if not s.available)
    raw = 0.0
    if available > 0:
        for s, w in pairs:
            if s.available:
                raw += s.value * (w + (w / available) * unavailable)
    score = raw * 10.0
    if signals.correction_boost.value > 0:
        score = min(10.0, score + cfg.correction_bonus_points)
    return round(max(0.0, min(10.0, score)), 2)


def percentile_value(values: Sequence[float], q: float, min_count: int) -> float | None:
    """The reference percentile: sort ascending, take index ``floor(n * q)`` clamped to
    ``n - 1``; None when fewer than ``min_count`` values."""
    n = len(values)
    if n == 0 or n < min_count:
        return None
    ordered = sorted(values)
    return ordered[min(n - 1, int(math.floor(n * q)))]


@dataclass(frozen=True)
class Promotion:
    """A tier change proposed by scoring (always Standard -> Protected)."""

    path: str  # "score" | "uniqueness"
    comment: str


def format_number(value: float) -> str:
    """A number as JavaScript prints it: no trailing zeros (8.0 -> "8", 8.50 -> "8.5")."""
    text = f"{round(float(value), 2):.2f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0") else "0"


def promotion_for(
    note: Note,
    score: float,
    uniqueness: Signal,
    *,
    cohort_size: int,
    p95: float | None,
    cfg: ImportanceConfig = ImportanceConfig(),
) -> Promotion | None:
    """Auto-promotion of a Standard note to Protected (never a demotion, never Immutable).

    Path 1: ``score >= auto_promote_threshold``. Path 2 (only if path 1 did not fire): the
    cohort has at least ``outlier_promotion_min_cohort`` notes and the note's uniqueness is
    at or above the cohort's 95th percentile. A note that reads as an instruction to the
    assistant (:func:`memory_pipelines.judge.rules.reads_as_instruction`) is never promoted.
    """
    if note.protection_tier != ProtectionTier.STANDARD.value:
        return None
    if reads_as_instruction(note.note):  # steering text never becomes protected memory
        return None
    if score >= cfg.auto_promote_threshold:
        return Promotion(
            "score",
            f" [Auto-promoted to Protected: ImportanceScore {format_number(score)} >= "
            f"{format_number(cfg.auto_promote_threshold)}]",
        )
    if (
        p95 is not None
        and cohort_size >= cfg.outlier_promotion_min_cohort
        and uniqueness.available
        and uniqueness.value >= p95
    ):
        return Promotion(
            "uniqueness",
            f" [Auto-protected: uniqueness {uniqueness.value:.3f} at/above 95th percentile {p95:.3f}]",
        )
    return None


def distribution(values: Sequence[float], digits: int = 2) -> dict[str, float] | None:
    """``{min, max, mean, median}`` rounded to ``digits``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {
        "min": round(ordered[0], digits),
        "max": round(ordered[-1], digits),
        "mean": round(sum(ordered) / n, digits),
        "median": round(median, digits),
    }
