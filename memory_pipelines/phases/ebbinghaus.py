"""TTL expiry and Ebbinghaus decay: pure functions of a note (or example) and ``now``.

Reference §4.11 with the §6.2 item 8 fix (examples cap access retention at 1.5 like
notes). For a note of importance ``I`` untouched for ``t`` days:

    lambda_eff = base_lambda * (1 - dampening * I / 10)      (x2 for Ephemeral notes)
    retention  = min(cap, 1 + access_boost * access_count)
    factor     = min(1, exp(-lambda_eff * t) * retention)
    new score  = round(I * factor, 2)

A note whose new score falls below the floor (0.5) is archived; otherwise the new score
is saved when the factor is below 0.99. Protected notes are exempt while they were
accessed within the last 365 days; Immutable notes never decay. Importance 0 is a score
(it decays fastest), not a missing value; a note with no score is skipped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from memory_pipelines.config import DecayConfig
from memory_pipelines.notes import Example, Note, ProtectionTier


def effective_lambda(
    importance: float, tier: str | None = None, cfg: DecayConfig = DecayConfig()
) -> float:
    """Daily decay rate for a note of ``importance`` (0-10), doubled for Ephemeral."""
    ni = max(0.0, min(10.0, float(importance))) / 10.0
    lam = cfg.base_lambda * (1.0 - cfg.importance_dampening * ni)
    if tier == ProtectionTier.EPHEMERAL.value:
        lam *= cfg.ephemeral_decay_multiplier
    return lam


def retention(access_count: int | None, cfg: DecayConfig = DecayConfig()) -> float:
    """Reinforcement by use: ``min(cap, 1 + boost * access_count)``."""
    return min(cfg.access_retention_cap, 1.0 + cfg.access_boost_factor * max(0, access_count or 0))


def decay_factor(
    importance: float,
    days: float,
    access_count: int | None,
    tier: str | None = None,
    cfg: DecayConfig = DecayConfig(),
) -> float:
    """``min(1, exp(-lambda_eff * days) * retention)``."""
    lam = effective_lambda(importance, tier, cfg)
    return min(1.0, math.exp(-lam * max(0.0, days)) * retention(access_count, cfg))


def half_life_days(
    importance: float, tier: str | None = None, cfg: DecayConfig = DecayConfig()
) -> float:
    """Days for the raw exponential (no retention) to halve: ``ln 2 / lambda_eff``."""
    return math.log(2) / effective_lambda(importance, tier, cfg)


def days_since(now: datetime, then: datetime | None) -> float:
    if then is None:
        return 0.0
    return max(0.0, (now - then).total_seconds() / 86400.0)


def days_untouched(item: Note | Example, now: datetime) -> float:
    """Days since the last access, or since creation when it was never accessed."""
    return days_since(now, item.last_accessed_at or item.created_at)


@dataclass(frozen=True)
class NoteDecay:
    """What decay does to one note.

    ``outcome``: ``skip-no-score`` | ``skip-immutable`` | ``protected-preserved`` |
    ``archive`` | ``update`` | ``unchanged``.
    """

    outcome: str
    factor: float = 1.0
    new_score: float | None = None
    ephemeral: bool = False


def _floor_text(value: float) -> str:
    return f"{value:g}"


def decay_note(note: Note, now: datetime, cfg: DecayConfig = DecayConfig()) -> NoteDecay:
    """Apply the decay rule to one note (the caller has already checked the agent)."""
    if note.importance_score is None:
        return NoteDecay("skip-no-score")
    tier = note.protection_tier
    if tier == ProtectionTier.IMMUTABLE.value:
        return NoteDecay("skip-immutable")
    days = days_untouched(note, now)
    if tier == ProtectionTier.PROTECTED.value and days < cfg.protected_inactivity_days:
        return NoteDecay("protected-preserved")
    importance = float(note.importance_score)
    factor = decay_factor(importance, days, note.access_count, tier, cfg)
    new_score = round(importance * factor, 2)
    ephemeral = tier == ProtectionTier.EPHEMERAL.value
    if new_score < cfg.archival_floor:
        return NoteDecay("archive", factor, new_score, ephemeral)
    if factor < cfg.save_factor_below:
        return NoteDecay("update", factor, new_score, ephemeral)
    return NoteDecay("unchanged", factor, importance, ephemeral)


def archival_comment(new_score: float, cfg: DecayConfig = DecayConfig()) -> str:
    """The comment appended to a note archived by decay."""
    return (
        f" [Archived by Memory Manager: ImportanceScore decayed to {new_score:.2f},"
        f" below floor {_floor_text(cfg.archival_floor)}]"
    )


@dataclass(frozen=True)
class ExampleDecay:
    """What decay does to one example: ``archive`` or ``keep`` (or ``skip``)."""

    outcome: str
    factor: float = 1.0
    effective_score: float | None = None


def decay_example(
    example: Example, now: datetime, cfg: DecayConfig = DecayConfig()
) -> ExampleDecay:
    """Examples below the success threshold decay like notes of importance
    ``success / 10`` (no Ephemeral multiplier; retention capped at 1.5, §6.2 item 8)."""
    score = example.success_score
    if score is not None and score >= cfg.example_success_threshold:
        return ExampleDecay("skip")
    ni = (score if score is not None else cfg.example_default_success) / 100.0
    factor = decay_factor(ni * 10.0, days_untouched(example, now), example.access_count, None, cfg)
    effective = ni * 10.0 * factor
    if effective < cfg.archival_floor:
        return ExampleDecay("archive", factor, effective)
    return ExampleDecay("keep", factor, effective)


def example_archival_comment(effective: float) -> str:
    return f" [Archived by Memory Manager: effective score {effective:.2f} below floor]"


def is_expired(expires_at: datetime | None, now: datetime) -> bool:
    """TTL: a non-null ``expires_at`` strictly earlier than ``now``."""
    return expires_at is not None and expires_at < now


def expiry_comment(expires_at: datetime) -> str:
    """The comment appended to a note or example archived by its TTL."""
    return f" [Archived by Memory Manager: expired on {iso(expires_at)}]"


def iso(value: datetime) -> str:
    """ISO-8601 UTC with milliseconds and ``Z`` (as JavaScript's ``toISOString``)."""
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
