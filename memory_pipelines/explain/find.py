"""Finding the notes about a topic: vector, full-text and substring matches, fused as
injection fuses them, limited to what a run scope may see."""

from __future__ import annotations

import numpy as np

from memory_pipelines.config import InjectConfig
from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import EmbeddingError
from memory_pipelines.explain.models import MatchInfo
from memory_pipelines.injection import fuse
from memory_pipelines.notes import Note
from memory_pipelines.scope import RunScope, agent_filter, visible
from memory_pipelines.store import Hit, and_
from memory_pipelines.text import text_query

#: a note found by the plain substring scan ranks above any search-only match
SUBSTRING_BONUS = 1.0


def embed_or_none(mem: MemoryContext, text: str) -> np.ndarray | None:
    try:
        return np.asarray(mem.embed([text])[0], dtype=np.float32)
    except EmbeddingError:
        return None


def find_notes(
    mem: MemoryContext,
    agent_id: str,
    topic: str,
    limit: int,
    *,
    all_agents: bool = False,
    scope: RunScope | None = None,
) -> list[tuple[Note, MatchInfo]]:
    """The notes about ``topic`` in any status, best first, at most ``limit``.

    Searched: with a ``scope``, only the notes it may see (:func:`visible`, prefiltered
    in the store); without one, the agent's notes and the cross-agent ones (every
    agent's with ``all_agents``). By cosine above the injection floor, by BM25 full
    text, and by a plain case-insensitive substring scan (the guide's
    ``LIKE '%topic%'``). Cosine and BM25 are fused as injection fuses them; a substring
    match adds :data:`SUBSTRING_BONUS`. Ties break by newest, then id.
    """
    cfg: InjectConfig = mem.inject_config
    table = mem.store.notes
    pool = max(limit * 5, 50)
    if scope is not None:
        where = and_(scope.lattice(), scope.prefilter())
        pool = pool * 4 if scope.needs_post_filter else pool
    else:
        where = None if all_agents else agent_filter(agent_id)
    vec = embed_or_none(mem, topic)
    vector_hits: list[Hit[Note]] = []
    if vec is not None:
        vector_hits = table.vector_search(
            vec, where=where, k=pool, min_similarity=cfg.min_similarity
        )
    text_hits = table.text_search(text_query(topic), where=where, k=pool) if table.count() else []
    fused = fuse(
        vector_hits,
        text_hits,
        text_of=lambda n: n.note,
        floor=cfg.min_similarity,
        vector_weight=cfg.vector_weight if vec is not None else 0.0,
        text_weight=cfg.text_weight,
    )
    found: dict[str, tuple[Note, MatchInfo]] = {
        c.item.id: (c.item, MatchInfo(score=c.score, cosine=c.cosine, bm25=c.bm25)) for c in fused
    }
    needle = topic.strip().lower()
    frame = table.scan(where, columns=["id", "note"])
    if len(frame) and needle:
        hits = frame[frame["note"].fillna("").str.lower().str.contains(needle, regex=False)]
        ids = hits["id"].tolist()
        missing = [i for i in ids if i not in found]
        vectors = table.vectors(missing) if vec is not None and missing else {}
        for n in table.get_many(missing):
            v = vectors.get(n.id)
            cos = float(np.dot(v, vec)) if v is not None and vec is not None else None
            found[n.id] = (n, MatchInfo(score=0.0, cosine=cos))
        for i in ids:
            if i in found:
                note, m = found[i]
                found[i] = (
                    note,
                    m.model_copy(update={"substring": True, "score": m.score + SUBSTRING_BONUS}),
                )
    if scope is not None:
        found = {i: item for i, item in found.items() if visible(item[0], scope)}

    def key(item: tuple[Note, MatchInfo]) -> tuple[float, float, str]:
        n, m = item
        return (-m.score, -(n.created_at.timestamp() if n.created_at else 0.0), n.id)

    return sorted(found.values(), key=key)[:limit]
