"""TTL and Ebbinghaus decay as pure functions (reference §4.11, §6.2 item 8)."""

import math
from datetime import UTC, datetime, timedelta

import pytest

from memory_pipelines.config import DecayConfig
from memory_pipelines.notes import Example, Note
from memory_pipelines.phases.ebbinghaus import (
    archival_comment,
    decay_example,
    decay_factor,
    decay_note,
    effective_lambda,
    example_archival_comment,
    expiry_comment,
    half_life_days,
    is_expired,
    iso,
    retention,
)
from memory_pipelines.phases.scoring import Signal, compute_signals, importance_score

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def aged(days: float, importance: float | None, **fields) -> Note:
    fields.setdefault("is_auto_generated", True)
    fields.setdefault("access_count", 1)
    return Note(
        note="a fact",
        importance_score=importance,
        created_at=NOW - timedelta(days=days),
        **fields,
    )


@pytest.mark.parametrize(
    ("importance", "half_life"), [(0, 4.33), (2, 5.16), (5, 7.22), (8, 12.0), (10, 21.7)]
)
def test_half_lives(importance, half_life):
    assert round(half_life_days(importance), 2 if half_life < 10 else 1) == half_life


def test_lambda_retention_and_factor():
    assert effective_lambda(5) == pytest.approx(0.16 * 0.6)
    assert effective_lambda(5, "Ephemeral") == pytest.approx(2 * 0.16 * 0.6)
    assert [retention(n) for n in (0, 1, 2, 3, 10)] == pytest.approx([1.0, 1.2, 1.4, 1.5, 1.5])
    assert decay_factor(5, 0, 1) == 1.0  # capped at 1
    assert decay_factor(5, 10, 0) == pytest.approx(math.exp(-0.096 * 10))
    assert decay_factor(5, 10, 2) == pytest.approx(math.exp(-0.096 * 10) * 1.4)


def test_importance_two_untouched_for_thirty_days_is_archived():
    outcome = decay_note(aged(30, 2.0), NOW)
    assert outcome.outcome == "archive"
    assert outcome.new_score < 0.5
    assert archival_comment(outcome.new_score) == (
        f" [Archived by Memory Manager: ImportanceScore decayed to {outcome.new_score:.2f}, below floor 0.5]"
    )


def test_protected_note_is_preserved_for_365_days_then_decays():
    assert (
        decay_note(aged(120, 9.0, protection_tier="Protected"), NOW).outcome
        == "protected-preserved"
    )
    assert (
        decay_note(aged(364, 9.0, protection_tier="Protected"), NOW).outcome
        == "protected-preserved"
    )
    late = decay_note(aged(366, 9.0, protection_tier="Protected"), NOW)
    assert late.outcome == "archive"
    # last access, not creation, is what counts
    touched = aged(500, 9.0, protection_tier="Protected", last_accessed_at=NOW - timedelta(days=10))
    assert decay_note(touched, NOW).outcome == "protected-preserved"
    # under the bare formula a Standard 9.0 note is archived by day 120 (reference §4.13)
    assert decay_note(aged(120, 9.0), NOW).outcome == "archive"


def test_tiers_and_missing_scores():
    assert decay_note(aged(400, 1.0, protection_tier="Immutable"), NOW).outcome == "skip-immutable"
    assert decay_note(aged(400, None), NOW).outcome == "skip-no-score"
    eph = decay_note(aged(3, 6.0, protection_tier="Ephemeral"), NOW)
    std = decay_note(aged(3, 6.0), NOW)
    assert eph.ephemeral and not std.ephemeral
    assert eph.new_score < std.new_score
    # importance 0 is a score (fastest decay), not "missing"
    assert decay_note(aged(0, 0.0), NOW).outcome == "archive"


def test_small_changes_are_not_saved():
    fresh = decay_note(aged(0.05, 6.0, access_count=0), NOW)
    assert fresh.factor >= 0.99 and fresh.outcome == "unchanged"
    older = decay_note(aged(2, 6.0, access_count=0), NOW)
    assert older.outcome == "update" and older.new_score == round(6.0 * older.factor, 2)


def test_last_access_resets_the_clock():
    n = aged(60, 5.0, last_accessed_at=NOW - timedelta(days=1))
    assert decay_note(n, NOW).outcome == "unchanged"  # factor capped at 1 by retention 1.2


def test_reference_sample_table():
    """A never re-accessed auto note (access 1, uniqueness 1): importance recomputed each
    cycle, then decayed once: 7.0 / 5.37 / 2.82 / 0.93 / archived (0.34)."""
    expected = {0: 7.0, 3: 5.37, 7: 2.82, 14: 0.93, 21: 0.34}
    for day, value in expected.items():
        n = aged(day, None)
        score = importance_score(compute_signals(n, NOW, uniqueness=Signal(1.0, True)))
        outcome = decay_note(n.model_copy(update={"importance_score": score}), NOW)
        got = outcome.new_score
        assert got == value, (day, score, got)
        assert (outcome.outcome == "archive") == (day == 21)


def test_examples_decay_with_capped_retention():
    def ex(days: float, success: float | None, access: int = 0) -> Example:
        return Example(
            agent_id="a",
            example_input="in",
            example_output="out",
            success_score=success,
            access_count=access,
            is_auto_generated=True,
            created_at=NOW - timedelta(days=days),
        )

    assert decay_example(ex(400, 50), NOW).outcome == "skip"
    assert decay_example(ex(1, 40), NOW).outcome == "keep"
    old = decay_example(ex(60, 40), NOW)
    assert old.outcome == "archive"
    assert example_archival_comment(old.effective_score) == (
        f" [Archived by Memory Manager: effective score {old.effective_score:.2f} below floor]"
    )
    # missing score counts as 25
    assert decay_example(ex(5, None), NOW).effective_score == pytest.approx(
        2.5 * math.exp(-0.16 * (1 - 0.8 * 0.25) * 5)
    )
    # retention is capped at 1.5 for examples too (reference §6.2 item 8)
    many = decay_example(ex(10, 40, access=50), NOW)
    assert many.factor == pytest.approx(math.exp(-0.16 * (1 - 0.32) * 10) * 1.5)


def test_ttl_helpers():
    assert is_expired(NOW - timedelta(seconds=1), NOW)
    assert not is_expired(NOW, NOW)
    assert not is_expired(None, NOW)
    when = datetime(2026, 5, 25, 8, 30, 5, 123456, tzinfo=UTC)
    assert iso(when) == "2026-05-25T08:30:05.123Z"
    assert (
        expiry_comment(when) == " [Archived by Memory Manager: expired on 2026-05-25T08:30:05.123Z]"
    )


def test_config_values_are_the_reference_defaults():
    cfg = DecayConfig()
    assert (cfg.base_lambda, cfg.importance_dampening, cfg.access_boost_factor) == (0.16, 0.8, 0.2)
    assert (cfg.access_retention_cap, cfg.protected_inactivity_days) == (1.5, 365)
    assert (cfg.ephemeral_decay_multiplier, cfg.archival_floor) == (2.0, 0.5)
    assert (cfg.max_notes_per_run, cfg.max_examples_per_run) == (1000, 500)
    assert (cfg.ttl_max_notes_per_run, cfg.ttl_max_examples_per_run) == (200, 200)
