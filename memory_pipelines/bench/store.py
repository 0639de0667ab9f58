"""LanceDB note-store timings against a numpy brute-force baseline.

``memory-pipelines bench store [--sizes 10000 100000] [--dim 384] [--queries 50] [--k 8]
[--merge-rows 1000] [--uri DIR]``

For each size N a fresh local LanceDB store (a temporary folder unless ``--uri``) gets N
synthetic notes: realistic short texts over 4 agents, N/20 users and 50 companies (80%
Active, 10% Provisional, 10% Archived) with clustered unit vectors of ``--dim`` floats
(256 centres plus noise, so neighbours exist). Measured, through :class:`NoteStore` as
the application uses it:

- bulk ``add`` of the N rows (pydantic rows to Arrow included);
- ``upsert`` (``merge_insert``) of ``--merge-rows`` rows, half updates, half new (3 times);
- the read back of all rows with their vectors (``scan_with_vectors``, what an in-RAM
  index would load), which is also the exact baseline's matrix;
- vector search, k nearest by cosine: unfiltered, and with the injection-style prefilter
  (agent, injectable status, the user's or agent-wide notes); p50 and p95 over
  ``--queries`` queries, with recall@k against the exact numpy answer;
- the same searches over the RAM matrix with numpy (mask + ``M @ q`` + argpartition);
- the prefiltered search again after ``ensure_scalar_indexes`` (Bitmap on agent, status
  and user);
- after ``ensure_vector_index`` when the store provides one: build time, p50/p95, recall;
- full-text (BM25) index build and filtered ``text_search`` p50/p95, and ``hybrid_search``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tabulate import tabulate

from memory_pipelines.bench.embed import make_sentences
from memory_pipelines.notes import INJECTABLE_STATUSES, Note
from memory_pipelines.store import NoteStore, RowTable, and_, eq, injectable, is_null, or_

AGENTS = ("agent-0", "agent-1", "agent-2", "agent-3")
N_COMPANIES = 50
NOTES_PER_USER = 20
CENTRES = 256
_INJECTABLE = {s.value for s in INJECTABLE_STATUSES}


@dataclass(frozen=True)
class Dataset:
    """Synthetic notes and their unit vectors."""

    notes: list[Note]
    vectors: np.ndarray


@dataclass(frozen=True)
class Query:
    """One search: a vector near an existing note, the note's text, agent and user."""

    vector: np.ndarray
    text: str
    agent_id: str
    user_id: str


def make_dataset(n: int, dim: int, seed: int) -> Dataset:
    """``n`` notes with clustered unit vectors (deterministic for a seed)."""
    rng = np.random.default_rng(seed)
    pyrng = random.Random(seed)
    texts = make_sentences(n, seed=seed)
    n_users = max(1, n // NOTES_PER_USER)
    centres = rng.normal(size=(CENTRES, dim)).astype(np.float32)
    vecs = centres[rng.integers(0, CENTRES, size=n)] + 0.6 * rng.normal(size=(n, dim)).astype(
        np.float32
    )
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    notes: list[Note] = []
    for i, text in enumerate(texts):
        u = pyrng.randrange(n_users)
        r = pyrng.random()
        status = "Active" if r < 0.8 else ("Provisional" if r < 0.9 else "Archived")
        user_id = None if pyrng.random() < 0.1 else f"user-{u}"  # some agent-wide notes
        notes.append(
            Note(
                id=f"note-{i}",
                agent_id=AGENTS[u % len(AGENTS)],
                user_id=user_id,
                company_id=f"company-{u % N_COMPANIES}",
                note=text,
                status=status,
                type="Preference" if i % 3 else "Context",
            )
        )
    return Dataset(notes=notes, vectors=vecs)


def make_queries(data: Dataset, count: int, seed: int) -> list[Query]:
    """Queries near existing user-scoped notes (so the scope filter is never empty)."""
    rng = np.random.default_rng(seed + 1)
    picks = [i for i in rng.permutation(len(data.notes)) if data.notes[i].user_id][:count]
    out = []
    for i in picks:
        v = data.vectors[i] + 0.3 * rng.normal(size=data.vectors.shape[1]).astype(np.float32)
        note = data.notes[i]
        out.append(
            Query(
                vector=(v / np.linalg.norm(v)).astype(np.float32),
                text=" ".join(note.note.split()[:6]),
                agent_id=note.agent_id or "",
                user_id=note.user_id or "",
            )
        )
    return out


def scope_filter(q: Query):
    """The injection-style prefilter: the agent, injectable, the user's or agent-wide."""
    return and_(
        eq("agent_id", q.agent_id),
        injectable(),
        or_(eq("user_id", q.user_id), is_null("user_id")),
    )


def numpy_top_k(
    mat: np.ndarray, q: np.ndarray, k: int, mask: np.ndarray | None, ids: np.ndarray
) -> list[str]:
    """Exact cosine top-k over unit rows (ids of the best first)."""
    if mask is not None:
        rows = np.flatnonzero(mask)
        sims = mat[rows] @ q
    else:
        rows = None
        sims = mat @ q
    if sims.size == 0:
        return []
    kk = min(k, sims.size)
    top = np.argpartition(-sims, kk - 1)[:kk]
    top = top[np.argsort(-sims[top], kind="stable")]
    picked = top if rows is None else rows[top]
    return [str(x) for x in ids[picked]]


def _pcts(samples: Sequence[float]) -> tuple[float, float]:
    ms = sorted(s * 1000 for s in samples)
    p95 = ms[min(len(ms) - 1, int(round(0.95 * (len(ms) - 1))))]
    return statistics.median(ms), p95


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _recall(got: list[list[str]], exact: list[list[str]]) -> float:
    hits = sum(len(set(g) & set(e)) for g, e in zip(got, exact, strict=True))
    total = sum(len(e) for e in exact)
    return hits / total if total else 1.0


class SizeBench:
    """The measurements of one store size, as named steps over one table; each step adds
    its rows to :attr:`rows`."""

    def __init__(self, n: int, args: argparse.Namespace, root: Path):
        self.n = n
        self.args = args
        self.k = args.k
        self.rows: list[list[Any]] = []
        self.data = make_dataset(n, args.dim, args.seed)
        self.queries = make_queries(self.data, args.queries, args.seed)
        self.store = NoteStore(str(root / f"lance-{n}"), args.dim)
        self.table: RowTable[Note] = self.store.notes
        self.exact_all: list[list[str]] = []
        self.exact_scoped: list[list[str]] = []

    def row(self, what: str, value: str, p95: str = "", extra: str = "") -> None:
        self.rows.append([f"{self.n:,}", what, value, p95, extra])

    def bulk_add(self) -> None:
        secs, _ = _timed(lambda: self.table.add(self.data.notes, self.data.vectors))
        self.row(
            "bulk add (rows -> LanceDB)", f"{secs:.2f} s", extra=f"{self.n / secs:,.0f} rows/s"
        )

    def upserts(self) -> None:
        """Three ``merge_insert`` batches, half updates of stored rows and half new ones."""
        n, dim, notes = self.n, self.args.dim, self.data.notes
        m = min(self.args.merge_rows, n)
        rng = np.random.default_rng(self.args.seed + 2)
        times = []
        for rep in range(3):
            upd = [
                notes[i].model_copy(update={"access_count": rep + 1})
                for i in rng.choice(n, m // 2, replace=False)
            ]
            new = [Note(id=f"new-{rep}-{j}", note=f"new note {j}") for j in range(m - m // 2)]
            vecs = rng.normal(size=(m, dim)).astype(np.float32)
            vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
            secs, _ = _timed(lambda upd=upd, new=new, vecs=vecs: self.table.upsert(upd + new, vecs))
            times.append(secs)
        med = statistics.median(times)
        self.row(f"upsert (merge_insert) {m:,} rows", f"{med * 1000:.0f} ms", extra="median of 3")

    def numpy_baseline(self) -> None:
        """Every row read back into RAM, and the exact (brute-force numpy) top-k of each
        query over all rows and under its scope: the recall reference."""
        secs, (loaded, mat) = _timed(lambda: self.table.scan_with_vectors())
        self.row(
            "scan_with_vectors (all rows)", f"{secs:.2f} s", extra=f"{mat.nbytes / 2**20:.0f} MiB"
        )
        ids = np.array([nt.id for nt in loaded], dtype=object)
        agent = np.array([nt.agent_id for nt in loaded], dtype=object)
        user = np.array([nt.user_id or "" for nt in loaded], dtype=object)
        inj = np.array([nt.status in _INJECTABLE for nt in loaded])
        np_all, np_scoped = [], []
        for q in self.queries:
            secs, top = _timed(lambda q=q: numpy_top_k(mat, q.vector, self.k, None, ids))
            np_all.append(secs)
            self.exact_all.append(top)
            mask_secs, mask = _timed(
                lambda q=q: (agent == q.agent_id) & inj & ((user == q.user_id) | (user == ""))
            )
            secs, top = _timed(lambda q=q, mask=mask: numpy_top_k(mat, q.vector, self.k, mask, ids))
            np_scoped.append(secs + mask_secs)
            self.exact_scoped.append(top)
        self.table.vector_search(self.queries[0].vector, k=self.k)  # warm the file cache
        self.search_rows("(flat)")
        for name, lat in (("", np_all), (" + scope mask", np_scoped)):
            p50, p95 = _pcts(lat)
            self.row(
                f"numpy brute force k={self.k}{name}", f"{p50:.1f} ms", f"{p95:.1f} ms", "exact"
            )

    def search_rows(self, label: str, unfiltered: bool = True) -> None:
        """``vector_search`` latency and recall, over all rows and under each query's scope."""
        for name, scoped, exact in (
            ("", False, self.exact_all),
            (" + scope prefilter", True, self.exact_scoped),
        ):
            if not scoped and not unfiltered:
                continue
            lat, got = [], []
            for q in self.queries:
                cond = scope_filter(q) if scoped else None
                secs, hits = _timed(
                    lambda q=q, cond=cond: self.table.vector_search(q.vector, where=cond, k=self.k)
                )
                lat.append(secs)
                got.append([h.item.id for h in hits])
            p50, p95 = _pcts(lat)
            self.row(
                f"vector_search k={self.k} {label}{name}",
                f"{p50:.1f} ms",
                f"{p95:.1f} ms",
                f"recall@{self.k} {_recall(got, exact):.3f}",
            )

    def indexes(self) -> None:
        """The scalar indexes of the scope columns, then the vector index, each followed
        by the searches again."""
        table = self.table
        secs, _ = _timed(lambda: table.ensure_scalar_indexes(("agent_id", "status", "user_id")))
        self.row("scalar indexes (agent_id, status, user_id)", f"{secs:.2f} s")
        self.search_rows("(flat, scalar indexes)", unfiltered=False)
        ensure_index = getattr(table, "ensure_vector_index", None)
        if callable(ensure_index):
            secs, _ = _timed(ensure_index)
            self.row("ensure_vector_index (build)", f"{secs:.2f} s")
            self.search_rows("(indexed)")
        else:
            self.row(
                "ensure_vector_index", "n/a", extra="store has no vector index helper: flat only"
            )

    def text_searches(self) -> None:
        """The full-text index, then BM25 and hybrid searches under each query's scope."""
        table, k = self.table, self.k
        secs, _ = _timed(table.ensure_fts)
        self.row("FTS index build", f"{secs:.2f} s")
        lat_fts, lat_hyb, found = [], [], 0
        for q in self.queries:
            cond = scope_filter(q)
            secs, hits = _timed(lambda q=q, cond=cond: table.text_search(q.text, where=cond, k=k))
            lat_fts.append(secs)
            found += bool(hits)
            secs, _ = _timed(
                lambda q=q, cond=cond: table.hybrid_search(q.text, q.vector, where=cond, k=k)
            )
            lat_hyb.append(secs)
        p50, p95 = _pcts(lat_fts)
        self.row(
            f"text_search (BM25) k={k} + scope prefilter",
            f"{p50:.1f} ms",
            f"{p95:.1f} ms",
            f"{found}/{len(self.queries)} queries with hits",
        )
        p50, p95 = _pcts(lat_hyb)
        self.row(f"hybrid_search (RRF) k={k} + scope prefilter", f"{p50:.1f} ms", f"{p95:.1f} ms")


def bench_size(n: int, args: argparse.Namespace, root: Path) -> list[list[Any]]:
    """All measurements for one store size; returns table rows."""
    bench = SizeBench(n, args, root)
    bench.bulk_add()
    bench.upserts()
    bench.numpy_baseline()
    bench.indexes()
    bench.text_searches()
    return bench.rows


def run(args: argparse.Namespace) -> None:
    """Run every size and print one table."""
    rows: list[list[Any]] = []
    with tempfile.TemporaryDirectory(prefix="store-bench-") as tmp:
        root = Path(args.uri) if args.uri else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        for n in args.sizes:
            print(f"measuring {n:,} rows ...", flush=True)
            rows += bench_size(n, args, root)
    print(
        f"\nLanceDB note store, {args.dim}-d vectors, {args.queries} queries per search, "
        f"k={args.k} (p50/p95 per query)"
    )
    print(
        tabulate(
            rows, headers=["rows", "operation", "p50 / time", "p95", "notes"], tablefmt="github"
        )
    )


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: ``memory-pipelines bench store [--sizes N ...] [options]``."""
    parser = argparse.ArgumentParser(prog="memory-pipelines bench store", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--dim", type=int, default=384, help="vector width (default 384)")
    parser.add_argument("--queries", type=int, default=50, help="queries per search kind")
    parser.add_argument("--k", type=int, default=8, help="results per search (default 8)")
    parser.add_argument("--merge-rows", type=int, default=1000, help="rows per upsert")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--uri", default=None, help="folder for the tables (default: temporary)")
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.sizes) or args.queries < 1 or args.k < 1:
        parser.error("--sizes, --queries and --k must be positive")
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
