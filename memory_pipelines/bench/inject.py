"""Injection latency at scale, beside an exact numpy scan of the same vectors and scopes.

``memory-pipelines bench inject [--sizes 10000 100000 1000000] [--queries 200]
[--baseline-queries N] [--k 5] [--index auto|none|ivf_hnsw_sq|ivf_flat|ivf_pq]
[--index-min-rows 50000] [--embedder minilm|hash] [--store-dir DIR]
[--attribution buffered|sync]``

Multi-tenant shape: each size is spread over 10 agents and ``size / 1000`` users (1M
notes: 1,000 users), 2.5% of the notes without a user (agent-wide; a fifth of those
global, without an agent either). Synthetic data at every size: short generated texts for
the full-text index and clustered unit vectors (384-d, one cluster per 500 notes) instead
of embeddings. Queries are of ``agent-0``, half in one user's scope (a user's run sees
that user's notes and the agent-wide and global ones), half agent-wide (a run without a
user sees only notes without one): a noisy cluster centre near one of the scope's notes
as the vector and four of that note's words as the text. ``--store-dir`` keeps each
size's store there and reuses it on the next run (the corpus is regenerated, same seed).

Measured per size and scope kind, in the same run, with the query vector given (the
internal ``injection.inject(..., query_vector=)``, query embedding excluded): ``inject``
through the read cache (the product path), the same ``inject`` with the read cache off
(LanceDB searches: the path before the cache, ``--baseline-queries`` of the queries), the
scoped LanceDB ``vector_search`` alone, and an exact numpy scan of the same vectors
under the same scope. "same ids" is the share of queries whose injected ids (and order)
are identical on both paths; "cache miss" the first ``inject`` of a scope after the
cache was dropped (what the first call after a write costs); ``inject`` itself is timed
with every scope of the queries read once before (the warm path). With an approximate vector
index (``--index``; it serves only the uncached path), the LanceDB side is measured again
with its recall@k against the exact scan. Attribution is buffered as in ``serve``
(``--attribution sync``: each inject commits its rows, an embedded service's default). Finally ``svc.inject(ctx, text)`` with the
query embedding included (unique texts, so the embedding cache never hits).
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from tabulate import tabulate

from memory_pipelines.bench.embed import make_sentences
from memory_pipelines.config import InjectConfig
from memory_pipelines.embeddings import Embedder, HashEmbedder, MiniLMEmbedder
from memory_pipelines.injection import RunScope, inject, note_filter
from memory_pipelines.injection.attribution import buffer_attribution
from memory_pipelines.injection.cache import read_cache
from memory_pipelines.notes import Note, NoteType, RunContext

AGENTS = tuple(f"agent-{i}" for i in range(10))
DIM = 384
NOTES_PER_USER = 1000
SCOPES = ("user", "agent-wide")


@dataclass(frozen=True)
class Corpus:
    """The synthetic notes' vectors and scope columns as numpy arrays (the exact-scan side)."""

    vectors: np.ndarray  # (n, dim) float32, unit rows
    agent: np.ndarray  # int8: index into AGENTS, -1 for NULL
    user: np.ndarray  # int32: user number, -1 for NULL
    cluster: np.ndarray  # int32
    centres: np.ndarray  # (clusters, dim)
    texts: list[str]


def make_corpus(size: int, dim: int = DIM, seed: int = 0) -> Corpus:
    """Clustered unit vectors and multi-tenant scope columns for ``size`` notes
    (deterministic): 10 agents, ``size / 1000`` users (at least 2), 2.5% agent-wide and
    0.5% global."""
    rng = np.random.default_rng(seed)
    clusters = max(8, size // 500)
    centres = rng.normal(size=(clusters, dim)).astype(np.float32)
    cluster = rng.integers(0, clusters, size).astype(np.int32)
    vectors = np.empty((size, dim), dtype=np.float32)
    for start in range(0, size, 100_000):
        end = min(size, start + 100_000)
        block = centres[cluster[start:end]] + rng.normal(size=(end - start, dim)).astype(np.float32)
        vectors[start:end] = block / np.linalg.norm(block, axis=1, keepdims=True)
    users = max(2, size // NOTES_PER_USER)
    user = rng.integers(0, users, size).astype(np.int32)
    agent = rng.integers(0, len(AGENTS), size).astype(np.int8)
    roll = rng.random(size)
    user[roll < 0.025] = -1  # agent-wide (2%) and global (0.5%)
    agent[roll < 0.005] = -1
    return Corpus(vectors, agent, user, cluster, centres, make_sentences(size, seed=seed))


def load_corpus(svc, corpus: Corpus, batch: int = 50_000) -> float:
    """Append the corpus to the note table (bulk ``add``); returns seconds."""
    t0 = time.perf_counter()
    base = datetime(2026, 1, 1, tzinfo=UTC)
    for start in range(0, len(corpus.texts), batch):
        end = min(len(corpus.texts), start + batch)
        notes = [
            Note(
                id=f"n{i:08d}",
                agent_id=None if corpus.agent[i] < 0 else AGENTS[corpus.agent[i]],
                user_id=None if corpus.user[i] < 0 else f"u{corpus.user[i]}",
                note=corpus.texts[i],
                type=NoteType.CONTEXT,
                created_at=base + timedelta(minutes=i),
                updated_at=base + timedelta(minutes=i),
            )
            for i in range(start, end)
        ]
        svc.store.notes.add(notes, corpus.vectors[start:end])
    return time.perf_counter() - t0


@dataclass(frozen=True)
class Query:
    user: int  # -1: an agent-wide run (no user)
    text: str
    vector: np.ndarray


def make_queries(corpus: Corpus, n: int, seed: int = 1, scope: str = "user") -> list[Query]:
    """Queries of ``agent-0``: a noisy centre of one scope note's cluster and four words of
    that note. ``scope="user"``: runs of users that own notes of the agent;
    ``"agent-wide"``: runs without a user, near the agent's notes without one."""
    rng = np.random.default_rng(seed)
    if scope == "user":
        owned = np.flatnonzero((corpus.user >= 0) & (corpus.agent == 0))
    else:
        owned = np.flatnonzero((corpus.user < 0) & (corpus.agent == 0))
    out = []
    for _ in range(n):
        i = int(rng.choice(owned))
        v = corpus.centres[corpus.cluster[i]] + rng.normal(size=corpus.vectors.shape[1]).astype(
            np.float32
        )
        words = corpus.texts[i].rstrip(".").split()
        out.append(
            Query(
                int(corpus.user[i]), " ".join(words[:4]), (v / np.linalg.norm(v)).astype(np.float32)
            )
        )
    return out


def exact_top(corpus: Corpus, q: Query, k: int) -> list[str]:
    """Exact scoped top-k: agent-0 or NULL, the query's user (none: agent-wide) or NULL,
    by cosine."""
    users = corpus.user < 0 if q.user < 0 else (corpus.user == q.user) | (corpus.user < 0)
    mask = ((corpus.agent == 0) | (corpus.agent < 0)) & users
    idx = np.flatnonzero(mask)
    scores = corpus.vectors[idx] @ q.vector
    top = idx[np.argsort(-scores, kind="stable")[:k]]
    return [f"n{i:08d}" for i in top]


def _pct(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    s = sorted(values)
    return statistics.median(s), s[min(len(s) - 1, math.ceil(0.95 * len(s)) - 1)]


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


def _ctx(q: Query) -> RunContext:
    return RunContext(agent_id=AGENTS[0], user_id=None if q.user < 0 else f"u{q.user}")


def _inject_ids(svc, q: Query) -> list[str]:
    return [n.id for n in inject(svc.context, _ctx(q), q.text, query_vector=q.vector).notes]


def measure(svc, corpus: Corpus, queries: list[Query], k: int, baseline: int) -> dict:
    """Latencies of inject (read cache / LanceDB path) / vector search / exact scan, the
    search recall@k and the share of queries with the same injected ids on both paths."""
    agent = svc.get_agent(AGENTS[0])
    cache = read_cache(svc.store.notes)
    inj_ms, base_ms, vs_ms, ex_ms, miss_ms, recall, same = [], [], [], [], [], [], []
    cached_ids: list[list[str]] = []
    cache.enabled = True
    for q in queries[:3]:  # warm caches and lazily opened indexes
        _inject_ids(svc, q)
    for q in queries[:5]:  # the first call of a scope after a write (the cache is read again)
        cache.clear()
        ms, _ = _timed(lambda q=q: _inject_ids(svc, q))
        miss_ms.append(ms)
    for q in {q.user: q for q in queries}.values():  # every scope warm: misses are above
        _inject_ids(svc, q)
    for q in queries:
        ms, got = _timed(lambda q=q: _inject_ids(svc, q))
        inj_ms.append(ms)
        cached_ids.append(got)
        ms, exact = _timed(lambda q=q: exact_top(corpus, q, k))
        ex_ms.append(ms)
    cache.enabled = False
    try:
        for q in queries[:3]:
            _inject_ids(svc, q)
        for q, got in zip(queries[:baseline], cached_ids, strict=False):
            ms, ids = _timed(lambda q=q: _inject_ids(svc, q))
            base_ms.append(ms)
            same.append(ids == got)
            where = note_filter(RunScope.of(_ctx(q), agent), svc.now())
            ms, hits = _timed(
                lambda q=q, where=where: svc.store.notes.vector_search(q.vector, where=where, k=k)
            )
            vs_ms.append(ms)
            exact = exact_top(corpus, q, k)
            recall.append(len({h.item.id for h in hits} & set(exact)) / max(1, len(exact)))
    finally:
        cache.enabled = True
    return {
        "inject": _pct(inj_ms),
        "baseline": _pct(base_ms),
        "search": _pct(vs_ms),
        "exact": _pct(ex_ms),
        "miss": _pct(miss_ms),
        "recall": float(np.mean(recall)) if recall else math.nan,
        "same": float(np.mean(same)) if same else math.nan,
        "injected": cached_ids,
    }


def measure_with_embedding(svc, queries: list[Query]) -> tuple[float, float]:
    """``svc.inject(ctx, text)`` latencies with unique texts (the query is embedded), each
    scope read once first: the row adds the query embedding to the warm path (the misses
    are measured above; the last scope's miss measurement emptied the cache, and at 1M
    notes each user's first read then made this row 41 ms instead of the warm path's)."""
    svc.embed([f"load the model before timing {time.perf_counter_ns()}"])
    for q in {q.user: q for q in queries}.values():
        svc.inject(_ctx(q), q.text)
    times = []
    for i, q in enumerate(queries):
        text = f"{q.text} (question {i} {time.perf_counter_ns()})"
        ms, _ = _timed(lambda q=q, text=text: svc.inject(_ctx(q), text))
        times.append(ms)
    return _pct(times)


def _open_store(
    size: int, corpus: Corpus, home: Path, embedder: Embedder, say, inject_config=None
) -> object:
    """The size's memory home at ``home``: reused when a previous run finished it."""
    from memory_pipelines.service import MemoryService

    ready = home / "bench-inject-ready"
    if home.exists() and not ready.exists():
        shutil.rmtree(home)
    fresh = not ready.exists()
    svc = MemoryService.open(home, embedder=embedder, inject_config=inject_config)
    svc.configure_agent(AGENTS[0], max_notes_to_inject=5, note_injection_strategy="Relevant")
    if fresh:
        load_s = load_corpus(svc, corpus)
        t0 = time.perf_counter()
        svc.store.notes.ensure_fts()
        svc.store.notes.ensure_scalar_indexes(("agent_id", "status", "user_id"))
        say(
            f"{size}: loaded in {load_s:.1f} s, FTS + scalar indexes {time.perf_counter() - t0:.1f} s"
        )
        ready.touch()
    else:
        say(f"{size}: reusing the store at {home}")
    return svc


def run_size(
    size: int,
    *,
    queries: int,
    baseline: int,
    k: int,
    index: str,
    index_min_rows: int,
    embedder: Embedder,
    say: Callable[[str], None],
    store_dir: Path | None = None,
    attribution: str = "buffered",
    inject_config: InjectConfig | None = None,
) -> list[list]:
    """All measurements of one size; rows for the table."""
    rows: list[list] = []
    with tempfile.TemporaryDirectory(prefix="inject-bench-") as tmp:
        home = (store_dir / f"inject-{size}") if store_dir else Path(tmp) / "home"
        corpus = make_corpus(size)
        svc = _open_store(size, corpus, home, embedder, say, inject_config)
        if attribution == "buffered":
            buffer_attribution(svc.context)
        try:
            svc.configure_agent(
                AGENTS[0], max_notes_to_inject=k, note_injection_strategy="Relevant"
            )
            per_scope = {
                kind: make_queries(corpus, max(1, queries // 2), seed=1 + n, scope=kind)
                for n, kind in enumerate(SCOPES)
            }
            flat: dict[str, dict] = {}
            for kind, qs in per_scope.items():
                flat[kind] = measure(svc, corpus, qs, k, max(1, baseline // 2))
                rows.append(_row(size, kind, "flat (exact)", flat[kind], None))
                say(f"{size}: {kind} measured")
            final = "flat (exact)"
            want = (
                index if index != "auto" else ("ivf_hnsw_sq" if size >= index_min_rows else "none")
            )
            if want != "none":
                t0 = time.perf_counter()
                svc.store.notes.ensure_vector_index(min_rows=0, index_type=want, replace=True)
                build_s = time.perf_counter() - t0
                say(f"{size}: {want} built in {build_s:.1f} s")
                for kind, qs in per_scope.items():
                    ann = measure(svc, corpus, qs, k, max(1, baseline // 2))
                    rows.append(_row(size, kind, want, ann, build_s))
                final = want
                if store_dir:  # keep the reusable store without the index
                    for idx in svc.store.notes.lance.list_indices():
                        if "vector" in list(getattr(idx, "columns", [])):
                            svc.store.notes.lance.drop_index(idx.name)
            emb = measure_with_embedding(svc, per_scope["user"][: max(1, min(queries, 50))])
            rows.append(
                [size, "user", f"{final} + query embedding", f"{emb[0]:.1f} / {emb[1]:.1f}"]
                + [""] * (len(HEADERS) - 4)
            )
        finally:
            svc.close()
    return rows


def _f(p: tuple[float, float]) -> str:
    return "" if math.isnan(p[0]) else f"{p[0]:.1f} / {p[1]:.1f}"


def _row(size: int, kind: str, name: str, m: dict, build_s: float | None) -> list:
    return [
        size,
        kind,
        name,
        _f(m["inject"]),
        _f(m["baseline"]),
        _f(m["exact"]),
        _f(m["search"]),
        f"{m['recall']:.3f}",
        f"{m['same']:.3f}",
        _f(m["miss"]),
        "" if build_s is None else f"{build_s:.1f}",
    ]


HEADERS = [
    "notes",
    "scope",
    "configuration",
    "inject p50 / p95 ms",
    "inject, cache off p50 / p95 ms",
    "numpy exact p50 / p95 ms",
    "LanceDB vector search p50 / p95 ms",
    "search recall@k",
    "same ids as cache off",
    "cache miss p50 / p95 ms",
    "index build s",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="memory-pipelines bench inject", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200, help="per size (half per scope kind)")
    parser.add_argument(
        "--baseline-queries",
        type=int,
        default=None,
        help="queries for the cache-off path (default: --queries)",
    )
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument(
        "--index", choices=("auto", "none", "ivf_hnsw_sq", "ivf_flat", "ivf_pq"), default="none"
    )
    parser.add_argument("--index-min-rows", type=int, default=50_000)
    parser.add_argument(
        "--embedder",
        choices=("minilm", "hash"),
        default="minilm",
        help="embedder for the query-embedding-included run (hash: 384-d, not semantic)",
    )
    parser.add_argument(
        "--store-dir", type=Path, default=None, help="keep and reuse each size's store here"
    )
    parser.add_argument(
        "--attribution",
        choices=("buffered", "sync"),
        default="buffered",
        help="injection events and steps buffered as in serve, or committed by each inject",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override an InjectConfig field (e.g. session_cap=2, to price an option)",
    )
    args = parser.parse_args(argv)
    from memory_pipelines.bench.locomo import _overrides

    inject_config = InjectConfig(**_overrides(args.overrides))
    embedder: Embedder = MiniLMEmbedder() if args.embedder == "minilm" else HashEmbedder(DIM)
    rows = []
    for size in args.sizes:
        rows += run_size(
            size,
            queries=args.queries,
            baseline=args.baseline_queries or args.queries,
            k=args.k,
            index=args.index,
            index_min_rows=args.index_min_rows,
            embedder=embedder,
            say=lambda msg: print(msg, file=sys.stderr),
            store_dir=args.store_dir,
            attribution=args.attribution,
            inject_config=inject_config,
        )
    print(
        f"inject latency, query embedding excluded, {args.queries} queries per size"
        f" (half one user's scope, half agent-wide), k={args.k}, attribution {args.attribution};"
        " synthetic texts and vectors"
        + (f"; InjectConfig {', '.join(args.overrides)}" if args.overrides else "")
    )
    print(tabulate(rows, headers=HEADERS, tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
