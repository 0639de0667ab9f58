"""Embedder throughput: offline MiniLM vs the hashing baseline vs cache hits.

``memory-pipelines bench embed [--n 2000] [--batch-size 64] [--runs 3]`` embeds ``n``
deterministic, varied short notes and prints sentences/second (median of ``runs``) for
:class:`~memory_pipelines.embeddings.MiniLMEmbedder`, the
:class:`~memory_pipelines.embeddings.HashEmbedder` baseline, and the
:class:`~memory_pipelines.embeddings.CachedEmbedder` hit path (in-memory and SQLite).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tabulate import tabulate

from memory_pipelines.embeddings import (
    CachedEmbedder,
    Embedder,
    HashEmbedder,
    MiniLMEmbedder,
    model_available,
    model_dir,
)

_SUBJECTS = ["The user", "Alice", "Bob", "The team", "Our customer", "The on-call engineer"]
_PREFS = [
    "prefers {a} over {b}",
    "wants answers about {a} to be short and concrete",
    "asked us to stop suggesting {b}",
    "usually works on {a} in the morning",
    "is migrating the {a} service to {b} this quarter",
]
_FACTS = [
    "Deployments of {a} happen on {day} after the {time} standup.",
    "The {a} database is backed up every {n} hours to {b}.",
    "Never restart {a} during the {day} batch window.",
    "Ticket #{n} about {a} latency was closed as a duplicate of the {b} issue.",
    "The {a} API key rotates every {n} days; the owner is {who}.",
    "Run the {a} tests with the {b} flag before merging.",
    "Meeting about {a} moved from {day} to {day2} at {time}.",
]
_NOUNS = [
    "tea", "coffee", "billing", "search", "Postgres", "Redis", "Kafka", "Python", "Rust",
    "the dashboard", "payments", "auth", "S3", "the mobile app", "GraphQL", "the ETL job",
    "invoices", "release notes", "dark mode", "CSV exports", "Kubernetes", "the CLI",
]  # fmt: skip
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]


def make_sentences(n: int, seed: int = 0) -> list[str]:
    """Return ``n`` varied, realistic short memory notes (deterministic for a seed)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.sample(_NOUNS, 2)
        day, day2 = rng.sample(_DAYS, 2)
        fields = {
            "a": a,
            "b": b,
            "day": day,
            "day2": day2,
            "n": rng.randint(2, 9999),
            "time": f"{rng.randint(8, 17)}:{rng.choice(['00', '15', '30', '45'])}",
            "who": rng.choice(["Alice", "Bob", "Carol", "Dan"]),
        }
        if rng.random() < 0.4:
            text = f"{rng.choice(_SUBJECTS)} {rng.choice(_PREFS).format(**fields)}."
        else:
            text = rng.choice(_FACTS).format(**fields)
        if rng.random() < 0.25:  # some longer notes
            text += f" Context: raised in session {i} while discussing {b} and {a}."
        out.append(text)
    return out


def _median_rate(fn: Callable[[], object], n: int, runs: int) -> tuple[float, float]:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return med, n / med if med > 0 else float("inf")


def run(args: argparse.Namespace) -> None:
    """Run the benchmark described by ``args`` (``n``, ``batch_size``, ``runs``) and print it."""
    n = int(getattr(args, "n", None) or 2000)
    batch = int(getattr(args, "batch_size", None) or 64)
    runs = int(getattr(args, "runs", None) or 3)
    texts = make_sentences(n)
    rows: list[list[object]] = []

    def bench(name: str, emb: Embedder, fn: Callable[[], object] | None = None) -> None:
        med, rate = _median_rate(fn or (lambda: emb.embed(texts)), n, runs)
        rows.append([name, emb.model_id, emb.dim, n, f"{med:.3f}", f"{rate:,.0f}"])

    if model_available():
        minilm = MiniLMEmbedder(batch_size=batch)
        minilm.embed(["warm up"])  # load weights outside the timing
        bench(f"MiniLMEmbedder (numpy, batch {batch})", minilm)
    else:
        print(f"MiniLM files missing in {model_dir()}: run `memory-pipelines fetch-model`.")
    hasher = HashEmbedder(dim=384)
    bench("HashEmbedder (baseline, not semantic)", hasher)

    # Cache hit path: the inner embedder is never called once the cache is primed.
    with tempfile.TemporaryDirectory(prefix="embed-bench-") as tmp:
        db = Path(tmp) / "cache.sqlite"
        with CachedEmbedder(hasher, db) as cached:
            cached.embed(texts)
            bench("CachedEmbedder hits (memory)", cached)
        with CachedEmbedder(hasher, db, max_memory_items=0) as cold:
            bench("CachedEmbedder hits (SQLite)", cold)

    headers = ["embedder", "model_id", "dim", "texts", "median s", "texts/s"]
    print(f"Embedding {n} short notes, median of {runs} runs")
    print(tabulate(rows, headers=headers, tablefmt="github"))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: ``memory-pipelines bench embed [--n N] [--batch-size B] [--runs R]``."""
    parser = argparse.ArgumentParser(prog="memory-pipelines bench embed", description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="number of notes (default 2000)")
    parser.add_argument("--batch-size", type=int, default=64, help="MiniLM batch size")
    parser.add_argument("--runs", type=int, default=3, help="runs per embedder (median)")
    run(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
