"""Notes listing latency (``svc.list_notes``, one page) at scale.

``memory-pipelines bench notes [--size 100000] [--limit 50] [--repeats 30] [--dim 384]``

Bulk-loads ``--size`` synthetic notes like ``bench inject`` does (10 agents, ``size /
1000`` users, generated texts, one ``created_at`` per minute), compacts the table once
(what the maintenance job does), then times one page of ``svc.list_notes`` for: no
filter, an agent filter, a user filter, a ``q`` search of two words of one note, and the
5th page reached through cursors (the time of the 5th call only). Prints p50/p95 in
milliseconds per case and how many notes each page held.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from tabulate import tabulate

from memory_pipelines.bench.inject import load_corpus, make_corpus
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.service import MemoryService


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return statistics.median(ordered), p95


def _time(fn: Callable[[], object], repeats: int) -> tuple[list[float], object]:
    fn()  # warm
    samples, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return samples, result


def run(size: int, limit: int, repeats: int, dim: int, folder: Path) -> list[list[object]]:
    corpus = make_corpus(size, dim=dim)
    with MemoryService.open(folder, embedder=HashEmbedder(dim)) as svc:
        load_s = load_corpus(svc, corpus)
        t0 = time.perf_counter()
        svc.compact()
        compact_s = time.perf_counter() - t0
        print(f"{size} notes loaded in {load_s:.1f}s, compacted in {compact_s:.1f}s")
        users, counts = np.unique(corpus.user[corpus.user >= 0], return_counts=True)
        user = f"u{users[int(np.argmax(counts))]}"
        words = " ".join(corpus.texts[size // 2].rstrip(".").split()[2:4])

        def page5():
            cursor = None
            for _ in range(4):
                cursor = svc.list_notes(limit=limit, cursor=cursor).next_cursor
            return cursor

        cursor5 = page5()
        cases: list[tuple[str, Callable[[], object]]] = [
            ("no filter", lambda: svc.list_notes(limit=limit)),
            ("agent filter", lambda: svc.list_notes(agent_id="agent-0", limit=limit)),
            (f"user filter ({user})", lambda: svc.list_notes(user_id=user, limit=limit)),
            (f"q search ({words!r})", lambda: svc.list_notes(q=words, limit=limit)),
            ("page 5 via cursor", lambda: svc.list_notes(limit=limit, cursor=cursor5)),
        ]
        rows = []
        for name, fn in cases:
            samples, page = _time(fn, repeats)
            p50, p95 = _percentiles(samples)
            rows.append([name, len(page.notes), f"{p50:.1f}", f"{p95:.1f}"])  # type: ignore[attr-defined]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memory-pipelines bench notes", description=__doc__)
    parser.add_argument("--size", type=int, default=100_000, help="notes to load (default 100000)")
    parser.add_argument("--limit", type=int, default=50, help="page size (default 50)")
    parser.add_argument("--repeats", type=int, default=30, help="timed calls per case")
    parser.add_argument("--dim", type=int, default=384, help="vector dimension of the table")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-notes-") as tmp:
        rows = run(args.size, args.limit, args.repeats, args.dim, Path(tmp) / "home")
    print(tabulate(rows, headers=["case", "notes", "p50 ms", "p95 ms"], tablefmt="github"))
    return 0
