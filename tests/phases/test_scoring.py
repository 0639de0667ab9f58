"""Importance scoring as pure functions: signals, redistribution, promotion (reference §4.7)."""

from datetime import UTC, datetime, timedelta

import pytest

from memory_pipelines.config import ImportanceConfig
from memory_pipelines.notes import Note
from memory_pipelines.phases.scoring import (
    InjectionStats,
    Signal,
    compute_signals,
    distribution,
    format_number,
    importance_score,
    percentile_value,
    promotion_for,
    relevance_signal,
    uniqueness_signal,
)

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def note(hours_old: float = 0.0, **fields) -> Note:
    fields.setdefault("is_auto_generated", True)
    return Note(note="the user prefers tea", created_at=NOW - timedelta(hours=hours_old), **fields)


def score(n: Note, uniqueness: float = 1.0, injections: InjectionStats | None = None) -> float:
    signals = compute_signals(n, NOW, uniqueness=Signal(uniqueness, True), injections=injections)
    return importance_score(signals)


def test_reference_anchor_scores():
    assert score(note()) == 7.0  # fresh auto note, uniqueness 1
    assert score(note(is_auto_generated=False)) == 8.0  # fresh human note
    assert score(note(comments="Superseded: contradiction detected")) == 10.0  # correction
    # correction bonus is capped at 10 even for a human note
    assert score(note(is_auto_generated=False, comments="contradiction")) == 10.0


def test_typical_auto_note_doubles_the_available_weights():
    # A = 0.5 (recency, uniqueness, correction, user mark), U = 0.5: weights double
    hours = 24.0
    expected = round(10 * (0.4 * 0.995**hours + 0.3 * 0.6), 2)
    assert score(note(hours), uniqueness=0.6) == expected == 5.35


def test_redistribution_when_llm_importance_is_available():
    n = note(48.0, comments="extracted with confidence 92")
    rec = 0.995**48
    a = 0.20 + 0.25 + 0.15 + 0.10 + 0.05  # recency, llm, uniqueness, correction, user mark
    u = 0.15 + 0.10  # relevance, goal alignment
    adj = lambda w: w + (w / a) * u  # noqa: E731
    expected = 10 * (rec * adj(0.20) + 0.7 * adj(0.25) + 0.8 * adj(0.15))
    assert score(n, uniqueness=0.8) == round(expected, 2)


def test_signal_availability_and_values():
    sig = compute_signals(note(24.0), NOW, uniqueness=Signal(1.0, True))
    assert sig.recency == Signal(pytest.approx(0.995**24), True)
    assert round(sig.recency.value, 3) == 0.887
    assert sig.llm_importance == Signal(0.5, False)
    assert sig.relevance == Signal(0.5, False)
    assert sig.goal_alignment == Signal(0.5, False)
    assert sig.correction_boost == Signal(0.0, True)
    assert sig.user_mark == Signal(0.0, True)
    # the reference's substring checks are case-sensitive
    assert (
        compute_signals(
            note(comments="superseded"), NOW, uniqueness=Signal(1, True)
        ).correction_boost.value
        == 0
    )
    assert round(0.995 ** (7 * 24), 3) == 0.431 and round(0.995 ** (30 * 24), 3) == 0.027


def test_relevance_is_available_only_for_injected_notes():
    assert relevance_signal(None, NOW) == Signal(0.5, False)
    assert relevance_signal(InjectionStats(0, None), NOW) == Signal(0.5, False)
    once_now = relevance_signal(InjectionStats(1, NOW), NOW)
    assert once_now.available
    assert once_now.value == pytest.approx(0.5 * (0.6931471805599453 / 3.044522437723423) + 0.5)
    saturated = relevance_signal(InjectionStats(500, NOW - timedelta(hours=10)), NOW)
    assert saturated.value == pytest.approx(0.5 + 0.5 * 0.995**10)
    stale = relevance_signal(InjectionStats(3, NOW - timedelta(days=60)), NOW)
    assert stale.value < once_now.value


def test_relevance_changes_the_score_only_when_injected():
    n = note(24.0)
    base = score(n)
    assert base == round(10 * (0.4 * 0.995**24 + 0.3), 2)  # exactly the reference
    used = score(n, injections=InjectionStats(20, NOW))
    # relevance 1.0 becomes available: A = 0.65, U = 0.35
    a, u = 0.65, 0.35
    adj = lambda w: w + (w / a) * u  # noqa: E731
    assert used == round(10 * (0.995**24 * adj(0.20) + 1.0 * adj(0.15) + 1.0 * adj(0.15)), 2)
    assert used > base


def test_uniqueness_signal():
    assert uniqueness_signal("", 0.9) == Signal(0.5, False)
    assert uniqueness_signal("   ", None) == Signal(0.5, False)
    assert uniqueness_signal("text", None) == Signal(1.0, True)
    assert uniqueness_signal("text", -0.2) == Signal(1.0, True)
    assert uniqueness_signal("text", 0.3) == Signal(pytest.approx(0.7), True)
    assert uniqueness_signal("text", 1.0000001) == Signal(0.0, True)


def test_percentile_needs_twenty_values_and_uses_the_reference_index():
    assert percentile_value(list(range(19)), 0.95, 20) is None
    assert percentile_value(list(range(20)), 0.95, 20) == 19  # floor(19.0) = 19
    assert percentile_value(list(range(40)), 0.95, 20) == 38  # floor(38.0)
    assert percentile_value([5.0] * 25, 0.95, 20) == 5.0


def test_promotion_paths():
    std = note()
    promo = promotion_for(std, 8.0, Signal(0.1, True), cohort_size=1, p95=None)
    assert promo is not None and promo.path == "score"
    assert promo.comment == " [Auto-promoted to Protected: ImportanceScore 8 >= 8]"
    assert promotion_for(std, 9.25, Signal(0.1, True), cohort_size=1, p95=None).comment.endswith(
        "ImportanceScore 9.25 >= 8]"
    )
    # path 2 only with a cohort of 20 and uniqueness at/above p95
    promo = promotion_for(std, 6.0, Signal(0.9, True), cohort_size=20, p95=0.9)
    assert promo.path == "uniqueness"
    assert promo.comment == " [Auto-protected: uniqueness 0.900 at/above 95th percentile 0.900]"
    assert promotion_for(std, 6.0, Signal(0.9, True), cohort_size=19, p95=0.9) is None
    assert promotion_for(std, 6.0, Signal(0.89, True), cohort_size=50, p95=0.9) is None
    assert promotion_for(std, 6.0, Signal(0.5, False), cohort_size=50, p95=0.4) is None
    # only Standard notes are promoted: never a demotion, never to Immutable
    for tier in ("Protected", "Immutable", "Ephemeral"):
        assert (
            promotion_for(note(protection_tier=tier), 9.9, Signal(1, True), cohort_size=99, p95=0.1)
            is None
        )


def test_config_values_are_the_reference_defaults():
    cfg = ImportanceConfig()
    weights = [
        cfg.recency_weight,
        cfg.llm_importance_weight,
        cfg.relevance_weight,
        cfg.uniqueness_weight,
        cfg.correction_weight,
        cfg.goal_alignment_weight,
        cfg.user_mark_weight,
    ]
    assert weights == [0.20, 0.25, 0.15, 0.15, 0.10, 0.10, 0.05]
    assert sum(weights) == pytest.approx(1.0)
    assert (cfg.correction_bonus_points, cfg.auto_promote_threshold) == (1.5, 8.0)
    assert cfg.outlier_promotion_min_cohort == 20


def test_helpers():
    assert format_number(8.0) == "8"
    assert format_number(8.5) == "8.5"
    assert format_number(9.25) == "9.25"
    assert distribution([]) is None
    assert distribution([1.0, 2.0, 3.0, 10.0]) == {
        "min": 1.0,
        "max": 10.0,
        "mean": 4.0,
        "median": 2.5,
    }
