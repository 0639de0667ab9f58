"""Step 5: when a note's TTL or its Ebbinghaus decay (:mod:`memory_pipelines.phases.ebbinghaus`)
retires it, and :func:`days_to_floor`, the days until decay takes it below the floor."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from memory_pipelines.config import DecayConfig
from memory_pipelines.explain.models import Retirement
from memory_pipelines.notes import (
    AgentConfig,
    AuthorType,
    Note,
    NoteStatus,
    ProtectionTier,
    is_injectable,
)
from memory_pipelines.phases.ebbinghaus import (
    days_untouched,
    decay_factor,
    effective_lambda,
    is_expired,
    retention,
)


def days_to_floor(
    importance: float, access_count: int, tier: str | None, cfg: DecayConfig
) -> float:
    """Days untouched after which decay's new score falls below the archival floor.

    The score is ``round2(I * min(1, exp(-lambda_eff * t) * retention))``, monotone in
    ``t``; found by bisection to well under a minute. 0 when it is already below.
    """

    def score(t: float) -> float:
        return round(importance * decay_factor(importance, t, access_count, tier, cfg), 2)

    if score(0.0) < cfg.archival_floor:
        return 0.0
    lam = effective_lambda(importance, tier, cfg)
    hi = max(
        1.0, math.log(importance * retention(access_count, cfg) / (cfg.archival_floor / 2)) / lam
    )
    while score(hi) >= cfg.archival_floor:
        hi *= 2
    lo = 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if score(mid) < cfg.archival_floor:
            hi = mid
        else:
            lo = mid
    return hi


def _days(delta: timedelta) -> float:
    return round(delta.total_seconds() / 86400.0, 2)


def check_retirement(
    note: Note, agent: AgentConfig | None, now: datetime, cfg: DecayConfig
) -> Retirement:
    """Step 5: TTL (``expires_at``) and Ebbinghaus decay (reference §4.11)."""
    expired = is_expired(note.expires_at, now)
    result: dict[str, Any] = {
        "expires_at": note.expires_at,
        "expired": expired,
        "ttl": _ttl(note, now, expired),
    }
    exempt = _not_decayed(note, agent)
    if exempt is not None:
        return Retirement(**result, decay=exempt)
    return _decay(note, now, cfg, result)


def _ttl(note: Note, now: datetime, expired: bool) -> str:
    """When the note's TTL retires it, in words."""
    expires = note.expires_at
    if expires is None:
        return "no TTL (expires_at is not set)"
    if expired:
        ttl = f"expired on {expires.isoformat()}: injection already treats it as gone"
        if is_injectable(note.status) and note.protection_tier != ProtectionTier.IMMUTABLE.value:
            ttl += "; the next maintenance run archives it"
        return ttl
    ttl = f"expires on {expires.isoformat()} (in {_days(expires - now)} days)"
    if note.status == NoteStatus.PROVISIONAL.value and note.author_type == AuthorType.AGENT.value:
        ttl += " unless hardening promotes it first (promotion clears the TTL)"
    return ttl


def _not_decayed(note: Note, agent: AgentConfig | None) -> str | None:
    """Why decay leaves the note alone, in words; None when decay applies to it."""
    if not is_injectable(note.status):
        return f"not decayed: already {note.status}"
    if note.status != NoteStatus.ACTIVE.value:
        return f"not decayed while {note.status} (decay considers Active notes only)"
    if not note.is_auto_generated:
        return "not decayed: not auto-generated (human-authored notes are only scored)"
    if note.protection_tier == ProtectionTier.IMMUTABLE.value:
        return "never decays (Immutable)"
    if note.agent_id is None:
        return "not decayed: a cross-agent note (decay runs over agents' notes)"
    if agent is None or not agent.auto_archive_enabled:
        return f"not decayed: auto-archive is off for agent {note.agent_id}"
    if note.importance_score is None:
        return "not decayed yet: no importance score (set at the next maintenance run)"
    return None


def _decay(note: Note, now: datetime, cfg: DecayConfig, result: dict[str, Any]) -> Retirement:
    """When decay takes a scored Active auto note below the floor (a Protected note is
    exempt for ``protected_inactivity_days`` after its last access)."""
    tier = note.protection_tier
    importance = float(note.importance_score or 0.0)
    base = note.last_accessed_at or note.created_at or now
    t_now = days_untouched(note, now)
    score_now = round(importance * decay_factor(importance, t_now, note.access_count, tier, cfg), 2)
    t_floor = days_to_floor(importance, note.access_count, tier, cfg)
    assumption = f"(importance {importance:g}, access count {note.access_count}, tier {tier}, if not accessed again)"
    if tier == ProtectionTier.PROTECTED.value and t_now < cfg.protected_inactivity_days:
        exempt_until = base + timedelta(days=cfg.protected_inactivity_days)
        retires = base + timedelta(days=max(t_floor, cfg.protected_inactivity_days))
        return Retirement(
            **result,
            decay=(
                f"exempt until {exempt_until.date().isoformat()} (Protected: 365 days after last access); "
                f"decay archives it from {retires.date().isoformat()} {assumption}"
            ),
            decay_applies=True,
            decay_score_now=importance,
            retires_at=retires,
            days_left=_days(retires - now),
        )
    retires = base + timedelta(days=t_floor)
    if retires <= now:
        text = f"decayed score {score_now:g} is below the floor {cfg.archival_floor:g}: the next maintenance run archives it"
    else:
        text = (
            f"decay archives it on {retires.date().isoformat()} (in {_days(retires - now)} days; "
            f"score now {score_now:g}, floor {cfg.archival_floor:g}) {assumption}"
        )
    return Retirement(
        **result,
        decay=text,
        decay_applies=True,
        decay_score_now=score_now,
        retires_at=retires,
        days_left=max(0.0, _days(retires - now)),
    )
