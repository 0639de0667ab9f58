"""Contradiction pairing and resolution rules (reference §4.9): pure functions.

The judge decides whether two notes contradict each other and which one the authority
order keeps; these functions decide which pairs to ask about and what to do with the
answer:

- a pair is two *different* notes of the *same* scope (§6.2 items 2 and 5), keyed by
  its sorted ids, asked about once per run, at most ``max_pairs_per_run`` pairs;
- a contradiction between two important notes (both at or above 7.0) or involving a
  Protected note is only *flagged* on both; otherwise the loser is revoked into the
  keeper, and its comments are appended to, never replaced (§6.2 item 10).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from memory_pipelines.config import ContradictionConfig
from memory_pipelines.judge.decisions import ContradictionDecision
from memory_pipelines.notes import Note, ProtectionTier


def pair_key(a: str, b: str) -> tuple[str, str]:
    """The order-free key of a pair of note ids."""
    return (a, b) if a <= b else (b, a)


def select_pairs(
    seeds: Iterable[tuple[str, Sequence[str]]],
    max_pairs: int,
    skip: Callable[[tuple[str, str]], bool] = lambda key: False,
) -> list[tuple[str, str]]:
    """Pairs to judge, in seed order then partner order: never a note with itself, each
    key once, pairs for which ``skip(key)`` holds left out, stop at ``max_pairs``."""
    seen: set[tuple[str, str]] = set()
    out: list[tuple[str, str]] = []
    if max_pairs <= 0:
        return out
    for seed_id, partner_ids in seeds:
        for partner_id in partner_ids:
            if partner_id == seed_id:
                continue
            key = pair_key(seed_id, partner_id)
            if key in seen:
                continue
            seen.add(key)
            if skip(key):
                continue
            out.append((seed_id, partner_id))
            if len(out) >= max_pairs:
                return out
    return out


@dataclass(frozen=True)
class Resolution:
    """What to do with a judged pair.

    ``action``: ``none`` (no contradiction), ``flag`` (keep both, mark both), ``revoke``
    (revoke ``revoke_id`` into ``keep_id``) or ``skip`` (a contradiction the rules cannot
    act on: ids missing or not the pair, or a loser that may not be revoked).
    """

    action: str
    keep_id: str | None = None
    revoke_id: str | None = None
    reason: str = ""


def _important(note: Note, threshold: float) -> bool:
    return note.importance_score is not None and note.importance_score >= threshold


def resolve(
    a: Note,
    b: Note,
    decision: ContradictionDecision,
    cfg: ContradictionConfig = ContradictionConfig(),
) -> Resolution:
    """Apply the reference resolution rules to the judge's decision on ``(a, b)``."""
    reason = (decision.reason or "").strip()
    if not decision.is_contradiction:
        return Resolution("none", reason=reason)
    protected = ProtectionTier.PROTECTED.value
    if (
        _important(a, cfg.high_importance_threshold)
        and _important(b, cfg.high_importance_threshold)
    ) or protected in (a.protection_tier, b.protection_tier):
        return Resolution("flag", reason=reason)
    keep, revoke = decision.keep_note_id, decision.revoke_note_id
    by_id = {a.id: a, b.id: b}
    if not keep or not revoke or keep == revoke or {keep, revoke} != set(by_id):
        return Resolution("skip", keep, revoke, reason)
    if by_id[revoke].protection_tier in (ProtectionTier.IMMUTABLE.value, protected):
        return Resolution("skip", keep, revoke, reason)
    return Resolution("revoke", keep, revoke, reason)


def flag_comment(other_id: str, reason: str) -> str:
    """The marker appended to both notes of a flagged contradiction."""
    return f" [Contradiction flagged: conflicts with note {other_id}. {reason}]"


def resolved_comment(keep_id: str, reason: str) -> str:
    """The marker appended to the revoked note of a resolved contradiction."""
    return f"[Contradiction resolved: superseded by note {keep_id}. {reason}]"
