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
    tier = note.protection_tier
    expires = note.expires_at
    expired = is_expired(expires, now)
    live = is_injectable(note.status)
    if expires is None:
        ttl = "no TTL (expires_at is not set)"
    elif expired:
        ttl = f"expired on {expires.isoformat()}: injection already treats it as gone"
        if live and tier != ProtectionTier.IMMUTABLE.value:
            ttl += "; the next maintenance run archives it"
    else:
        ttl = f"expires on {expires.isoformat()} (in {_days(expires - now)} days)"
        if (
            note.status == NoteStatus.PROVISIONAL.value
            and note.author_type == AuthorType.AGENT.value
        ):
            ttl += " unless hardening promotes it first (promotion clears the TTL)"
    result: dict[str, Any] = {"expires_at": expires, "expired": expired, "ttl": ttl}
    if not live:
        return Retirement(**result, decay=f"not decayed: already {note.status}")
    if note.status != NoteStatus.ACTIVE.value:
        return Retirement(
            **result, decay=f"not decayed while {note.status} (decay considers Active notes only)"
        )
    if not note.is_auto_generated:
        return Retirement(
            **result, decay="not decayed: not auto-generated (human-authored notes are only scored)"
        )
    if tier == ProtectionTier.IMMUTABLE.value:
        return Retirement(**result, decay="never decays (Immutable)")
    if note.agent_id is None:
        return Retirement(
            **result, decay="not decayed: a cross-agent note (decay runs over agents' notes)"
        )
    if agent is None or not agent.auto_archive_enabled:
        return Retirement(
            **result, decay=f"not decayed: auto-archive is off for agent {note.agent_id}"
        )
    if note.importance_score is None:
        return Retirement(
            **result, decay="not decayed yet: no importance score (set at the next maintenance run)"
        )
    importance = float(note.importance_score)
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
