"""Retrieval over the scope lattice: the notes and examples each strategy selects
(Relevant/Recent/All, Semantic/Recent/Rated). The run's resolved scope and its store
filters live in :mod:`memory_pipelines.scope` and :mod:`.read_filters`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import numpy as np

from memory_pipelines.config import InjectConfig
from memory_pipelines.context import MemoryContext
from memory_pipelines.injection.cache import whole
from memory_pipelines.injection.candidates import CandidatePart, view_parts
from memory_pipelines.injection.diversity import diversify
from memory_pipelines.injection.evidence import cue_boosts
from memory_pipelines.injection.fusion import Candidate, T, fuse, rank_key
from memory_pipelines.injection.learned import LearnedRanker, ranker_for, record
from memory_pipelines.injection.lexical import prf_scores
from memory_pipelines.injection.parts import cover_parts, query_parts
from memory_pipelines.injection.read_filters import cached_scope, example_filter, note_filter
from memory_pipelines.injection.rerank import RerankerConfig, rerank
from memory_pipelines.injection.similarity import cosine_similarities
from memory_pipelines.notes import (
    TYPE_ORDER,
    AgentConfig,
    Example,
    ExampleInjectionStrategy,
    Note,
    NoteInjectionStrategy,
)
from memory_pipelines.scope import RunScope
from memory_pipelines.store import Cond, Hit, and_, cmp
from memory_pipelines.text import text_query


def _search(
    search: Callable[[int], list[Hit[T]]],
    keep: Callable[[T], bool],
    want: int,
    start: int,
    cap: int,
) -> list[Hit[T]]:
    """Run ``search(n)`` and post-filter, growing ``n`` until ``want`` hits are kept or the
    results are exhausted (fewer than ``n`` came back) or ``cap`` is reached."""
    n = max(1, start)
    while True:
        hits = search(n)
        kept = [h for h in hits if keep(h.item)]
        if len(kept) >= want or len(hits) < n or n >= cap:
            return kept
        n = min(n * 4, cap)


_SCAN_COLUMNS = (
    "id",
    "created_at",
    "primary_scope_entity_id",
    "primary_scope_record_id",
    "secondary_scopes",
)


def _ordered_ids(
    table: Any, where: Cond, scope: RunScope, sort: Callable[[dict], Any], k: int
) -> list[str]:
    """Scan only the ordering columns of the matching rows, post-filter, sort, take ``k``."""
    cols = list(_SCAN_COLUMNS)
    if table.model is Note:
        cols.append("type")
    else:
        cols.append("success_score")
    rows = table.scan(where, columns=cols).to_dict("records")
    kept = [r for r in rows if scope.keep(_RowView(r))]
    kept.sort(key=sort)
    return [r["id"] for r in kept[:k]]


class _RowView:
    """Attribute access over a scanned row, for the multi-tenant matcher."""

    def __init__(self, row: Mapping[str, Any]):
        self._row = row

    def __getattr__(self, name: str) -> Any:
        value = self._row.get(name)
        return None if _is_missing(value) else value


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN / NaT
    except Exception:
        return False


def _ts(value: Any) -> float:
    if _is_missing(value):
        return 0.0
    try:
        return float(value.timestamp())
    except Exception:
        return 0.0


_TYPE_RANK = {t.value: i for i, t in enumerate(TYPE_ORDER)}


def _newest_key(r: Mapping[str, Any]) -> tuple[float, str]:
    return (-_ts(r.get("created_at")), r["id"])


def _type_key(r: Mapping[str, Any]) -> tuple[int, float, str]:
    return (_TYPE_RANK.get(r.get("type"), len(_TYPE_RANK)), -_ts(r.get("created_at")), r["id"])


def _rated_key(r: Mapping[str, Any]) -> tuple[float, float, str]:
    score = r.get("success_score")
    return (-(0.0 if _is_missing(score) else float(score)), -_ts(r.get("created_at")), r["id"])


def _by_ids(table: Any, ids: list[str]) -> list:
    return table.get_many(ids) if ids else []


def _conversation_of(note: Note) -> str | None:
    return note.source_conversation_id


def _turn_of(note: Note) -> str | None:
    return note.source_conversation_detail_id


def relevant_notes(
    mem: MemoryContext,
    scope: RunScope,
    where: Cond | None,
    query: str,
    query_vector: np.ndarray | None,
    k: int,
    reranker: RerankerConfig,
    now: datetime | None = None,
) -> list[Note]:
    """The hybrid ``Relevant`` path: fused vector + full-text candidates, reranked when the
    agent configures a reranker; at most ``k`` notes.

    When the read cache (:mod:`.cache`) holds the scope's rows, both sides run in process
    over them, through the same ranking as time travel (:func:`relevant_candidates`):
    cosine in numpy and BM25 over the entry's lexical index (``lexical_stemmer``, with
    pseudo-relevance feedback when ``prf_weight`` > 0). Scopes too large for the cache take
    LanceDB's vector and full-text searches, filtered by ``where`` (None: the
    :func:`note_filter` at ``now``). ``now`` must be the time ``where`` was built with
    (default: the clock)."""
    cfg: InjectConfig = mem.inject_config
    table = mem.store.notes
    now = now or mem.now()
    learned = learned_ranker(mem)
    cached = cached_scope(table, scope)
    if cached is not None:
        parts = [p for view in cached for p in view_parts(view, now, cfg.lexical_stemmer)]
        return relevant_candidates(
            cfg, scope, query, query_vector, parts, k, reranker, now, learned=learned
        )
    if where is None:
        where = note_filter(scope, now)
    fetch_k = k * reranker.retrieval_multiplier if reranker.enabled else k
    pool = max(cfg.candidate_pool, fetch_k)
    start = pool * 4 if scope.needs_post_filter else pool
    vector_hits, text_hits, cosines = _store_hits(
        table, scope, where, query, query_vector, pool, start, cfg
    )
    candidates = _fused(
        vector_hits, text_hits, cosines, query, query_vector is not None, cfg, reranker, fetch_k, k,
        now or mem.now(), learned,
    )
    return [c.item for c in candidates]


def learned_ranker(mem: MemoryContext) -> LearnedRanker | None:
    """The learned ranker for this context's settings and embedder, or None."""
    return ranker_for(mem.inject_config.learned_ranker, mem.embedder.model_id)


def _fused(
    vector_hits: list[Hit[Note]],
    text_hits: list[Hit[Note]],
    cosines: dict[str, float],
    query: str,
    has_vector: bool,
    cfg: InjectConfig,
    reranker: Any,
    fetch_k: int,
    k: int,
    now: datetime | None = None,
    learned: LearnedRanker | None = None,
) -> list[Any]:
    """The first ``k`` candidates: vector and text hits fused (the first ``fetch_k``),
    reordered by the ``learned`` ranker when given and the input has a vector (its
    ``mmr_lambda`` then replaces the setting's), then reranked when the agent has a
    reranker. ``now`` resolves the input's relative time phrases (time awareness)."""
    candidates = fuse(
        vector_hits,
        text_hits,
        cosines=cosines,
        text_of=lambda n: n.note,
        floor=cfg.min_similarity,
        vector_weight=cfg.vector_weight if has_vector else 0.0,
        text_weight=cfg.text_weight,
        context_weight=cfg.context_weight,
        neighbour_weight=cfg.neighbour_weight,
        conversation_of=_conversation_of,
        turn_of=_turn_of,
        fusion=cfg.fusion,
        rrf_k=cfg.rrf_k,
        session_weight=cfg.session_weight,
        boosts=cue_boosts(
            query,
            now,
            speaker_weight=cfg.speaker_weight,
            entity_weight=cfg.entity_weight,
            time_weight=cfg.time_weight,
            role_weight=cfg.role_weight,
            time_window_weight=cfg.time_window_weight,
            text_of=lambda n: n.note,
            created_of=lambda n: n.created_at,
        ),
    )
    record(query, candidates)
    mmr_lambda = cfg.mmr_lambda
    if learned is not None and has_vector:
        candidates = learned.rank(query, candidates)
        mmr_lambda = learned.mmr_lambda
    candidates = diversify(  # the ranking as it is when every coverage step is off
        candidates,
        fetch_k,
        mmr_lambda=mmr_lambda,
        session_cap=cfg.session_cap,
        score_of=lambda c: c.score,
        text_of=lambda c: c.text,
        group_of=lambda c: _conversation_of(c.item),
        pool=cfg.candidate_pool,
        update_similarity=cfg.update_similarity,
        created_of=lambda c: c.created_ts,
        session_penalty=cfg.session_penalty,
    )
    if cfg.cover_parts:
        candidates = cover_parts(
            candidates,
            fetch_k,
            query_parts(query),
            text_of=lambda c: c.text,
            pool=cfg.candidate_pool,
        )
    candidates = candidates[:fetch_k]
    if reranker.enabled:
        candidates = rerank(query, candidates, k, reranker, timeout_s=cfg.reranker_timeout_s)
    return candidates[:k]


def _detached(note: Note) -> Note:
    """A copy of a cached note that a caller may change without changing the cache."""
    copy = note.model_copy()
    for name, value in note.__dict__.items():
        if isinstance(value, (list, dict)):
            copy.__dict__[name] = type(value)(value)
    return copy


_Hits = tuple[list[Hit[Note]], list[Hit[Note]], dict[str, float]]


def _store_hits(
    table: Any,
    scope: RunScope,
    where: Cond,
    query: str,
    query_vector: np.ndarray | None,
    pool: int,
    start: int,
    cfg: InjectConfig,
) -> _Hits:
    """The vector and text candidates from LanceDB (scopes too large for the cache)."""
    vector_hits: list[Hit[Note]] = []
    if query_vector is not None:
        vector_hits = _search(
            lambda n: table.vector_search(
                query_vector, where=where, k=n, min_similarity=cfg.min_similarity
            ),
            scope.keep,
            pool,
            start,
            cfg.max_fetch,
        )[:pool]
    fts = text_query(query)
    text_hits = _search(
        lambda n: table.text_search(fts, where=where, k=n), scope.keep, pool, start, cfg.max_fetch
    )[:pool]
    cosines: dict[str, float] = {}
    if query_vector is not None:
        seen = {h.item.id for h in vector_hits}
        missing = [h.item.id for h in text_hits if h.item.id not in seen]
        if missing:
            for note_id, vec in table.vectors(missing).items():
                cosines[note_id] = float(np.dot(vec, query_vector))
    return vector_hits, text_hits, cosines


def select_notes(
    mem: MemoryContext,
    scope: RunScope,
    agent: AgentConfig,
    query: str | None,
    query_vector: np.ndarray | None,
    now: datetime,
) -> list[Note]:
    """The notes to inject, in ranked order, by the agent's note strategy."""
    k = agent.max_notes_to_inject
    if k <= 0:
        return []
    table = mem.store.notes
    strategy = agent.note_injection_strategy
    if strategy == NoteInjectionStrategy.RELEVANT.value and query:
        reranker = RerankerConfig.from_value(agent.reranker_config)
        found = relevant_notes(mem, scope, None, query, query_vector, k, reranker, now)
        if found or query_vector is not None:
            return found
        # embedding failed and the text found nothing: degrade to the All order
    where = note_filter(scope, now)
    sort = _newest_key if strategy == NoteInjectionStrategy.RECENT.value else _type_key
    return _by_ids(table, _ordered_ids(table, where, scope, sort, k))


def select_examples(
    mem: MemoryContext,
    scope: RunScope,
    agent: AgentConfig,
    query: str | None,
    query_vector: np.ndarray | None,
    now: datetime,
    *,
    created_before: datetime | None = None,
) -> list[Example]:
    """The examples to inject, in ranked order, by the agent's example strategy.

    ``Semantic`` with an input: nearest examples (by ``example_input``) above
    ``example_min_similarity``, reranked when ``rerankExamples`` is set; without an input
    (or a query vector) it falls back to the ``Rated`` order. ``created_before``: only
    examples created at or before it (time travel).
    """
    k = agent.max_examples_to_inject
    if k <= 0:
        return []
    cfg: InjectConfig = mem.inject_config
    where = example_filter(scope, now)
    if created_before is not None:
        where = and_(where, cmp("created_at", "<=", created_before))
    table = mem.store.examples
    strategy = agent.example_injection_strategy
    if strategy == ExampleInjectionStrategy.SEMANTIC.value and query and query_vector is not None:
        reranker = RerankerConfig.from_value(agent.reranker_config)
        use_rerank = reranker.enabled and reranker.rerank_examples
        fetch_k = k * reranker.retrieval_multiplier if use_rerank else k
        start = fetch_k * 4 if scope.needs_post_filter else fetch_k
        hits = _search(
            lambda n: table.vector_search(
                query_vector, where=where, k=n, min_similarity=cfg.example_min_similarity
            ),
            scope.keep,
            fetch_k,
            start,
            cfg.max_fetch,
        )
        candidates = [
            Candidate(item=h.item, text=h.item.example_input, cosine=h.score, score=h.score)
            for h in hits
        ]
        candidates = sorted(candidates, key=rank_key)[:fetch_k]
        if use_rerank:
            candidates = rerank(query, candidates, k, reranker, timeout_s=cfg.reranker_timeout_s)
        return [c.item for c in candidates[:k]]
    sort = _newest_key if strategy == ExampleInjectionStrategy.RECENT.value else _rated_key
    return _by_ids(table, _ordered_ids(table, where, scope, sort, k))


# --------------------------------------------------------------------------- in-memory sets



class _Positions:
    """Global positions over the parts of a candidate set."""

    def __init__(self, parts: list[CandidatePart], scope: RunScope, ranked: bool = False):
        self.parts = parts
        self.scope = scope
        #: rows as the ranking sees them (:meth:`ScopeRows.ranked`), turned into notes by
        #: :func:`whole` once picked; the post-filter needs whole notes
        self.ranked = ranked and not scope.needs_post_filter
        self.offsets = np.cumsum([0] + [len(p.ids) for p in parts])
        self.keep = np.concatenate([p.keep for p in parts]) if parts else np.zeros(0, bool)

    def concat(self, arrays: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(arrays) if arrays else np.zeros(0)

    def models(self, positions: list[int]) -> list[Note | None]:
        """The (shared) notes of these positions, in order, built once per part (None for
        a row no longer readable, :meth:`ScopeRows.models`)."""
        which = np.searchsorted(self.offsets, positions, side="right") - 1
        found: dict[int, Note] = {}
        for i in dict.fromkeys(which.tolist()):
            local = [g for g, w in zip(positions, which.tolist(), strict=True) if w == i]
            base = int(self.offsets[i])
            part = self.parts[i]
            build = part.ranked if self.ranked and part.ranked is not None else part.models
            built = build([g - base for g in local])
            found.update(zip(local, built, strict=True))
        return [found[g] for g in positions]

    def take(self, ranked: np.ndarray, want: int) -> list[tuple[int, Note]]:
        """The first ``want`` notes of ``ranked`` positions that the scope's post-filter
        keeps (materialised in chunks of ``want``)."""
        out: list[tuple[int, Note]] = []
        step = max(want, 1)
        for start in range(0, len(ranked), step):
            chunk = [int(p) for p in ranked[start : start + step]]
            for g, note in zip(chunk, self.models(chunk), strict=True):
                if note is not None and self.scope.keep(note):  # None: gone since read
                    out.append((g, note))
                    if len(out) >= want:
                        return out
        return out

    def best(self, scores: np.ndarray, among: np.ndarray, want: int) -> list[tuple[int, Note]]:
        """:meth:`take` over ``among`` ranked by ``scores`` (descending, stable): the best
        ``want`` kept ones (the whole order is sorted only when the post-filter drops too
        many of the first)."""
        first = _top(scores, among, want * 4 if self.scope.needs_post_filter else want)
        taken = self.take(first, want)
        if len(taken) >= want or len(first) == len(among):
            return taken
        return self.take(among[np.argsort(-scores[among], kind="stable")], want)


def _top(scores: np.ndarray, among: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` of ``among`` by ``scores`` descending, ties by position: exactly the
    prefix of a stable sort, found by partition (every tie of the n-th score is kept)."""
    if n <= 0 or len(among) == 0:
        return among[:0]
    values = scores[among]
    if n < len(among):
        nth = np.partition(values, len(values) - n)[len(values) - n]
        keep = values >= nth
        among, values = among[keep], values[keep]
    return among[np.argsort(-values, kind="stable")][:n]


def _lexical_scores(cfg: InjectConfig, query: str, parts: list[CandidatePart]) -> list[np.ndarray]:
    """BM25 of the query over the parts' kept texts, with pseudo-relevance feedback."""
    return prf_scores(
        text_query(query),
        [(p.lexical, p.keep) for p in parts],
        n_docs=cfg.prf_docs,
        n_terms=cfg.prf_terms,
        weight=cfg.prf_weight,
        passage_words=cfg.passage_words,
        passage_min_words=cfg.passage_min_words,
    )


def relevant_candidates(
    cfg: InjectConfig,
    scope: RunScope,
    query: str,
    query_vector: np.ndarray | None,
    parts: list[CandidatePart],
    k: int,
    reranker: RerankerConfig,
    now: datetime,
    *,
    learned: LearnedRanker | None = None,
) -> list[Note]:
    """The ``Relevant`` ranking over an in-memory candidate set: the best ``pool`` kept
    positions by cosine (at least ``min_similarity``) and by BM25 (above 0), fused,
    reordered by the ``learned`` ranker and reranked as :func:`_fused` does (``now``
    resolves the input's relative time phrases); at most ``k`` notes, copies a caller may
    change."""
    pos = _Positions(parts, scope, ranked=True)
    kept = np.flatnonzero(pos.keep)
    fetch_k = k * reranker.retrieval_multiplier if reranker.enabled else k
    pool = max(cfg.candidate_pool, fetch_k)
    sims = np.zeros(len(pos.keep))
    vector_hits: list[Hit[Note]] = []
    if query_vector is not None and len(kept):
        sims = pos.concat(
            [cosine_similarities(p.vectors, p.norms, query_vector) for p in parts]
        )
        above = kept[sims[kept] >= cfg.min_similarity]
        vector_hits = [Hit(n, float(sims[g])) for g, n in pos.best(sims, above, pool)]
    bm = pos.concat(_lexical_scores(cfg, query, parts))
    text_taken = pos.best(bm, kept[bm[kept] > 0], pool)
    text_hits = [Hit(n, float(bm[g])) for g, n in text_taken]
    cosines = {n.id: float(sims[g]) for g, n in text_taken} if query_vector is not None else {}
    candidates = _fused(
        vector_hits, text_hits, cosines, query, query_vector is not None, cfg, reranker, fetch_k, k,
        now, learned,
    )
    return [_detached(n) for n in whole([c.item for c in candidates])]


def rank_candidates(
    mem: MemoryContext,
    scope: RunScope,
    agent: AgentConfig,
    query: str | None,
    query_vector: np.ndarray | None,
    parts: list[CandidatePart],
    now: datetime | None = None,
) -> list[Note]:
    """:func:`select_notes` over an in-memory candidate set instead of the note table: the
    same strategies, candidate pools, fusion, reranking and tie breaks, and for
    ``Relevant`` the very ranking of the present path over cached rows
    (:func:`relevant_candidates`). Every kept position must already be injectable and
    unexpired. ``now`` is the instant the set is ranked as of (time travel: the past instant;
    default the clock): relative time phrases of the input resolve against it."""
    k = agent.max_notes_to_inject
    if k <= 0:
        return []
    strategy = agent.note_injection_strategy
    if strategy == NoteInjectionStrategy.RELEVANT.value and query:
        reranker = RerankerConfig.from_value(agent.reranker_config)
        found = relevant_candidates(
            mem.inject_config,
            scope,
            query,
            query_vector,
            parts,
            k,
            reranker,
            now or mem.now(),
            learned=learned_ranker(mem),
        )
        if found or query_vector is not None:
            return found
    pos = _Positions(parts, scope)
    kept = np.flatnonzero(pos.keep)
    created = pos.concat([p.created for p in parts])
    ids = [i for p in parts for i in p.ids]
    if strategy == NoteInjectionStrategy.RECENT.value:
        order = sorted(kept.tolist(), key=lambda g: (-created[g], ids[g]))
    else:
        types = [t for p in parts for t in p.types]
        order = sorted(
            kept.tolist(),
            key=lambda g: (_TYPE_RANK.get(types[g], len(_TYPE_RANK)), -created[g], ids[g]),
        )
    return [_detached(n) for _, n in pos.take(np.asarray(order, dtype=np.int64), k)]
