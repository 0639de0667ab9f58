"""Hybrid fusion: cosine and BM25 candidates fused into one deterministic ranking, with
the conversation-context and adjacent-turn boosts and the evidence features of
:mod:`.evidence` (pure)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from memory_pipelines.injection.evidence import rrf_base, session_best
from memory_pipelines.notes import Example, Note
from memory_pipelines.store import Hit

T = TypeVar("T", Note, Example)


@dataclass(frozen=True)
class Candidate(Generic[T]):
    """One retrieved item with its retrieval signals and fused score.

    ``base``: the weighted cosine and BM25 parts before any boost; ``boost``: the cue
    factor added as ``base * boost``; ``vector_rank`` / ``text_rank``: its place (from 0)
    among the vector / full-text hits, None when it is not one (what the learned ranker
    of :mod:`.learned` reads beside the fused score)."""

    item: T
    text: str
    cosine: float | None = None
    bm25: float | None = None
    score: float = 0.0
    base: float = 0.0
    boost: float = 0.0
    vector_rank: int | None = None
    text_rank: int | None = None

    @property
    def created_ts(self) -> float:
        created = self.item.created_at
        return created.timestamp() if created else 0.0


def rank_key(c: Candidate) -> tuple[float, float, str]:
    """Sort key: score descending, then newest, then id (total, deterministic)."""
    return (-c.score, -c.created_ts, c.item.id)


_TURN = re.compile(r"^(.*?)(\d+)$")


def turn_position(detail_id: str | None) -> tuple[str, int] | None:
    """A turn id split into its prefix and trailing number (``"D3:12" -> ("D3:", 12)``);
    None when it does not end in a number (e.g. most UUIDs)."""
    if not detail_id:
        return None
    m = _TURN.match(detail_id)
    return (m.group(1), int(m.group(2))) if m else None


def fuse(
    vector_hits: Sequence[Hit[T]],
    text_hits: Sequence[Hit[T]],
    *,
    text_of: Callable[[T], str],
    floor: float,
    vector_weight: float = 0.5,
    text_weight: float = 0.5,
    context_weight: float = 0.0,
    neighbour_weight: float = 0.0,
    conversation_of: Callable[[T], str | None] | None = None,
    turn_of: Callable[[T], str | None] | None = None,
    cosines: Mapping[str, float] | None = None,
    fusion: str = "score",
    rrf_k: float = 60.0,
    session_weight: float = 0.0,
    boosts: Callable[[Mapping[str, T]], Mapping[str, float]] | None = None,
) -> list[Candidate[T]]:
    """Fuse cosine and BM25 candidates into one ranked list (pure).

    Vector part: ``(cos - floor) / (best cos - floor)`` clipped to [0, 1], where ``best
    cos`` is the best vector hit and a text-only hit takes its cosine from ``cosines``
    (0 when absent); text part: ``bm25 / best bm25``. Conversation context then adds, to
    every candidate with a source conversation, ``context_weight`` times the best base
    score of another candidate from the same conversation, and ``neighbour_weight`` times
    the best base score of a candidate from the adjacent turn of that conversation (turn
    ids with the same prefix whose trailing numbers differ by one, see
    :func:`turn_position`). Sorted by :func:`rank_key`.

    Evidence features (:mod:`.evidence`): ``fusion="rrf"`` replaces the normalised scores
    by weighted reciprocal ranks (constant ``rrf_k``); ``session_weight`` adds that times
    the best base score of the candidate's source conversation (itself included);
    ``boosts`` maps the candidates to factors, each adding ``base * factor``.
    """
    items, cos, bm, best_cos = _merge_hits(vector_hits, text_hits, cosines, floor)
    if fusion == "rrf":
        base = rrf_base(
            cos, bm, floor=floor, vector_weight=vector_weight, text_weight=text_weight, k=rrf_k
        )
    else:
        base = _score_base(items, cos, bm, floor, best_cos, vector_weight, text_weight)
    final = dict(base)
    groups: dict[str, list[str]] = {}
    if (context_weight or neighbour_weight or session_weight) and conversation_of is not None:
        for i, item in items.items():
            key = conversation_of(item)
            if key:
                groups.setdefault(key, []).append(i)
    if session_weight:
        for i, best in session_best(base, groups.values()).items():
            final[i] += session_weight * best
    factors: dict[str, float] = {}
    if boosts is not None:
        factors = dict(boosts(items))
        for i, factor in factors.items():
            final[i] += base[i] * factor
    if context_weight or neighbour_weight:
        for members in groups.values():
            if len(members) >= 2:
                _add_context(final, base, members, items, turn_of, context_weight, neighbour_weight)
    vector_rank = _places(vector_hits)
    text_rank = _places(text_hits)
    out = [
        Candidate(
            item=items[i],
            text=text_of(items[i]),
            cosine=cos.get(i),
            bm25=bm.get(i),
            score=final[i],
            base=base[i],
            boost=factors.get(i, 0.0),
            vector_rank=vector_rank.get(i),
            text_rank=text_rank.get(i),
        )
        for i in items
    ]
    return sorted(out, key=rank_key)


def _places(hits: Sequence[Hit[T]]) -> dict[str, int]:
    """Each hit's place (from 0) by score, best first; ties keep the hits' order."""
    order = sorted(range(len(hits)), key=lambda j: -hits[j].score)
    places: dict[str, int] = {}
    for place, j in enumerate(order):
        places.setdefault(hits[j].item.id, place)
    return places


def _merge_hits(
    vector_hits: Sequence[Hit[T]],
    text_hits: Sequence[Hit[T]],
    cosines: Mapping[str, float] | None,
    floor: float,
) -> tuple[dict[str, T], dict[str, float], dict[str, float], float]:
    """The candidates by id (first hit wins), their best cosine and best BM25 score, and
    the best cosine of the vector hits (``floor`` without any); a text-only hit takes its
    cosine from ``cosines`` when there."""
    items: dict[str, T] = {}
    cos: dict[str, float] = {}
    bm: dict[str, float] = {}
    for h in vector_hits:
        items.setdefault(h.item.id, h.item)
        cos[h.item.id] = max(cos.get(h.item.id, -1.0), h.score)
    best_cos = max(cos.values(), default=floor)
    for h in text_hits:
        items.setdefault(h.item.id, h.item)
        bm[h.item.id] = max(bm.get(h.item.id, 0.0), h.score)
        if h.item.id not in cos and cosines and h.item.id in cosines:
            cos[h.item.id] = float(cosines[h.item.id])
    return items, cos, bm, best_cos


def _score_base(
    items: Mapping[str, T],
    cos: Mapping[str, float],
    bm: Mapping[str, float],
    floor: float,
    best_cos: float,
    vector_weight: float,
    text_weight: float,
) -> dict[str, float]:
    """Each candidate's base score: the weighted normalised cosine and BM25 parts."""
    span = best_cos - floor
    best_bm = max(bm.values(), default=0.0)
    base: dict[str, float] = {}
    for i in items:
        v = 0.0
        if i in cos:
            v = 1.0 if span <= 1e-9 else min(1.0, max(0.0, (cos[i] - floor) / span))
        t = bm[i] / best_bm if i in bm and best_bm > 0 else 0.0
        base[i] = vector_weight * v + text_weight * t
    return base


def _add_context(
    final: dict[str, float],
    base: Mapping[str, float],
    members: list[str],
    items: Mapping[str, T],
    turn_of: Callable[[T], str | None] | None,
    context_weight: float,
    neighbour_weight: float,
) -> None:
    """Add the conversation boosts to the candidates of one conversation: the best base
    score of another member, and that of the adjacent turn."""
    ranked = sorted(members, key=lambda i: (-base[i], i))
    first, second = ranked[0], ranked[1]
    by_turn: dict[tuple[str, int], str] = {}
    if neighbour_weight and turn_of is not None:
        for i in members:
            pos = turn_position(turn_of(items[i]))
            if pos is not None:
                by_turn.setdefault(pos, i)
    for i in members:
        final[i] += context_weight * base[second if i == first else first]
        pos = turn_position(turn_of(items[i])) if by_turn and turn_of else None
        if pos is not None:
            near = [
                base[by_turn[(pos[0], pos[1] + d)]]
                for d in (-1, 1)
                if (pos[0], pos[1] + d) in by_turn
            ]
            if near:
                final[i] += neighbour_weight * max(near)
