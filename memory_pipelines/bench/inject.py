"""Injection latency at scale, beside an exact numpy scan of the same vectors and scopes.

``memory-pipelines bench inject [--sizes 10000 100000] [--queries 200] [--k 5]
[--index auto|none|ivf_hnsw_sq|ivf_flat|ivf_pq] [--index-min-rows 50000] [--embedder
minilm|hash]`` (add ``1000000`` to ``--sizes`` for the opt-in 1M run).

For each size, a fresh memory home gets that many Active notes of two agents spread over
``size / 50`` users (2% agent-wide, 0.5% global): short synthetic texts for the full-text
index and synthetic clustered unit vectors (384-d, 1 cluster per 500 notes) instead of
embeddings. Queries come from one user each: a noisy cluster centre near one of the
user's notes as the vector and a few of that note's words as the text.

Measured per size, in the same run: ``inject`` p50/p95 with the query vector given (the
internal ``injection.inject(..., query_vector=)``), the scoped ``vector_search`` alone,
and an exact numpy brute-force scan of the same vectors under the same scope filter.
With an approximate vector index (``RowTable.ensure_vector_index``, built when the table
has ``--index-min-rows`` rows, or forced by ``--index TYPE``), the same measurements are
repeated and the index's recall@k against the exact scan is reported, together with
how many of the k injected notes agree with the flat (exact) run. Finally ``inject``
with the query embedding included (``svc.inject(ctx, text)`` with unique texts, so the
embedding cache never hits) is measured on the final configuration.
"""

from __future__ import annotations

import argparse
import math
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
from memory_pipelines.embeddings import Embedder, HashEmbedder, MiniLMEmbedder
from memory_pipelines.injection import RunScope, inject, note_filter
from memory_pipelines.notes import Note, NoteType, RunContext

AGENTS = ("agent-a", "agent-b")
DIM = 384


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
    """Clustered unit vectors and scope columns for ``size`` notes (deterministic)."""
    rng = np.random.default_rng(seed)
    clusters = max(8, size // 500)
    centres = rng.normal(size=(clusters, dim)).astype(np.float32)
    cluster = rng.integers(0, clusters, size).astype(np.int32)
    vectors = np.empty((size, dim), dtype=np.float32)
    for start in range(0, size, 100_000):
        end = min(size, start + 100_000)
        block = centres[cluster[start:end]] + rng.normal(size=(end - start, dim)).astype(np.float32)
        vectors[start:end] = block / np.linalg.norm(block, axis=1, keepdims=True)
    users = max(1, size // 50)
    user = rng.integers(0, users, size).astype(np.int32)
    agent = np.where(rng.random(size) < 0.9, 0, 1).astype(np.int8)
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
    user: int
    text: str
    vector: np.ndarray


def make_queries(corpus: Corpus, n: int, seed: int = 1) -> list[Query]:
    """Queries of agent-a users that own notes: a noisy centre of one of their notes'
    clusters and four words of that note."""
    rng = np.random.default_rng(seed)
    owned = np.flatnonzero((corpus.user >= 0) & (corpus.agent == 0))
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
    """Exact scoped top-k: agent-a or NULL, the query's user or NULL, by cosine."""
    mask = ((corpus.agent == 0) | (corpus.agent < 0)) & (
        (corpus.user == q.user) | (corpus.user < 0)
    )
    idx = np.flatnonzero(mask)
    scores = corpus.vectors[idx] @ q.vector
    top = idx[np.argsort(-scores, kind="stable")[:k]]
    return [f"n{i:08d}" for i in top]


def _pct(values: Sequence[float]) -> tuple[float, float]:
    s = sorted(values)
    return statistics.median(s), s[min(len(s) - 1, math.ceil(0.95 * len(s)) - 1)]


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


def _ctx(q: Query) -> RunContext:
    return RunContext(agent_id=AGENTS[0], user_id=f"u{q.user}")


def measure(svc, corpus: Corpus, queries: list[Query], k: int) -> dict:
    """Latencies of inject / vector search / exact scan and the search recall@k."""
    agent = svc.get_agent(AGENTS[0])
    inj_ms, vs_ms, ex_ms, recall, injected = [], [], [], [], []
    for q in queries[:3]:  # warm caches and lazily opened indexes
        inject(svc.context, _ctx(q), q.text, query_vector=q.vector)
    for q in queries:
        ctx = _ctx(q)
        ms, got = _timed(lambda ctx=ctx, q=q: inject(svc.context, ctx, q.text, query_vector=q.vector))
        inj_ms.append(ms)
        injected.append([n.id for n in got.notes])
        where = note_filter(RunScope.of(ctx, agent), svc.now())
        ms, hits = _timed(
            lambda q=q, where=where: svc.store.notes.vector_search(q.vector, where=where, k=k)
        )
        vs_ms.append(ms)
        ms, exact = _timed(lambda q=q: exact_top(corpus, q, k))
        ex_ms.append(ms)
        recall.append(len({h.item.id for h in hits} & set(exact)) / max(1, len(exact)))
    return {
        "inject": _pct(inj_ms),
        "search": _pct(vs_ms),
        "exact": _pct(ex_ms),
        "recall": float(np.mean(recall)),
        "injected": injected,
    }


def measure_with_embedding(svc, queries: list[Query]) -> tuple[float, float]:
    """``svc.inject(ctx, text)`` latencies with unique texts (the query is embedded)."""
    svc.embed(["load the model before timing"])
    times = []
    for i, q in enumerate(queries):
        text = f"{q.text} (question {i} {time.perf_counter_ns()})"
        ms, _ = _timed(lambda q=q, text=text: svc.inject(_ctx(q), text))
        times.append(ms)
    return _pct(times)


def run_size(
    size: int,
    *,
    queries: int,
    k: int,
    index: str,
    index_min_rows: int,
    embedder: Embedder,
    say: Callable[[str], None],
) -> list[list]:
    """All measurements of one size; rows for the table."""
    from memory_pipelines.service import MemoryService

    rows: list[list] = []
    with tempfile.TemporaryDirectory(prefix="inject-bench-") as tmp:
        svc = MemoryService.open(Path(tmp) / "home", embedder=embedder)
        try:
            svc.configure_agent(
                AGENTS[0], max_notes_to_inject=k, note_injection_strategy="Relevant"
            )
            corpus = make_corpus(size)
            qs = make_queries(corpus, queries)
            load_s = load_corpus(svc, corpus)
            t0 = time.perf_counter()
            svc.store.notes.ensure_fts()
            svc.store.notes.ensure_scalar_indexes(("agent_id", "status", "user_id"))
            fts_s = time.perf_counter() - t0
            say(f"{size}: loaded in {load_s:.1f} s, FTS + scalar indexes {fts_s:.1f} s")
            flat = measure(svc, corpus, qs, k)
            rows.append(_row(size, "flat (exact)", flat, None, None))
            say(f"{size}: flat measured")
            final = "flat (exact)"
            want = (
                index if index != "auto" else ("ivf_hnsw_sq" if size >= index_min_rows else "none")
            )
            if want != "none":
                t0 = time.perf_counter()
                svc.store.notes.ensure_vector_index(min_rows=0, index_type=want)
                build_s = time.perf_counter() - t0
                say(f"{size}: {want} built in {build_s:.1f} s")
                ann = measure(svc, corpus, qs, k)
                agree = np.mean(
                    [
                        len(set(a) & set(b)) / max(1, len(b))
                        for a, b in zip(ann["injected"], flat["injected"], strict=True)
                    ]
                )
                rows.append(_row(size, want, ann, build_s, float(agree)))
                final = want
            emb = measure_with_embedding(svc, qs)
            rows.append(
                [
                    size,
                    f"{final} + query embedding",
                    f"{emb[0]:.1f} / {emb[1]:.1f}",
                    "",
                    "",
                    "",
                    "",
                    "",
                ]
            )
        finally:
            svc.close()
    return rows


def _row(size: int, name: str, m: dict, build_s: float | None, agree: float | None) -> list:
    return [
        size,
        name,
        f"{m['inject'][0]:.1f} / {m['inject'][1]:.1f}",
        f"{m['search'][0]:.1f} / {m['search'][1]:.1f}",
        f"{m['exact'][0]:.1f} / {m['exact'][1]:.1f}",
        f"{m['recall']:.3f}",
        "" if agree is None else f"{agree:.3f}",
        "" if build_s is None else f"{build_s:.1f}",
    ]


HEADERS = [
    "notes",
    "configuration",
    "inject p50 / p95 ms",
    "vector search p50 / p95 ms",
    "numpy exact p50 / p95 ms",
    "search recall@k",
    "inject agreement",
    "index build s",
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="memory-pipelines bench inject", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument(
        "--index", choices=("auto", "none", "ivf_hnsw_sq", "ivf_flat", "ivf_pq"), default="auto"
    )
    parser.add_argument("--index-min-rows", type=int, default=50_000)
    parser.add_argument(
        "--embedder",
        choices=("minilm", "hash"),
        default="minilm",
        help="embedder for the query-embedding-included run (hash: 384-d, not semantic)",
    )
    args = parser.parse_args(argv)
    embedder: Embedder = MiniLMEmbedder() if args.embedder == "minilm" else HashEmbedder(DIM)
    rows = []
    for size in args.sizes:
        rows += run_size(
            size,
            queries=args.queries,
            k=args.k,
            index=args.index,
            index_min_rows=args.index_min_rows,
            embedder=embedder,
            say=lambda msg: print(msg, file=sys.stderr),
        )
    print(f"inject latency, {args.queries} queries per size, k={args.k}, one user scope per query")
    print(tabulate(rows, headers=HEADERS, tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
