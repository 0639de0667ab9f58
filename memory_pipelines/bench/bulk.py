"""Bulk loading: ``svc.add_notes`` against the embedder alone, on the same texts.

``memory-pipelines bench bulk [--n 2000] [--runs 3] [--single 200] [--hash]`` embeds ``n``
deterministic, distinct short notes with the offline MiniLM model (``--hash``: the hashing
embedder), then adds the same texts with one ``svc.add_notes`` call into a fresh home
(its embedding cache empty, so every text is embedded), ``runs`` times, alternating which
of the two goes first so both see the same machine load. It prints the medians, notes per second, and the
ratio of the bulk path's throughput to the embedder's (the target is at least 0.9), then
the throughput of ``--single`` notes added one ``add_note`` at a time, for comparison.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

from memory_pipelines.bench.embed import make_sentences
from memory_pipelines.embeddings import Embedder, HashEmbedder, MiniLMEmbedder, model_available


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "n/a"


def _embedder(use_hash: bool) -> Embedder:
    if use_hash or not model_available():
        if not use_hash:
            print("MiniLM files missing: run `memory-pipelines fetch-model`; using the hashing embedder.")
        return HashEmbedder(dim=384)
    minilm = MiniLMEmbedder()
    minilm.embed(["warm up"])  # load weights outside the timing
    return minilm


def distinct_sentences(n: int) -> list[str]:
    """``n`` distinct notes of ``bench embed``'s kind: the embedding cache cannot then skip
    a repeated text, so both paths embed every one."""
    texts: list[str] = []
    size = n
    while len(texts) < n:
        size *= 2
        texts = list(dict.fromkeys(make_sentences(size)))
    return texts[:n]


def measure(n: int = 2000, runs: int = 3, single: int = 200, use_hash: bool = False) -> dict[str, float]:
    """Median seconds of embedding ``n`` texts, of ``add_notes`` of them and of ``single``
    ``add_note`` calls, with the throughputs and the bulk/embed ratio."""
    from memory_pipelines.service import MemoryService

    emb = _embedder(use_hash)
    texts = distinct_sentences(n)
    rows = [{"note": t, "agent_id": "bench", "user_id": f"u{i % 50}"} for i, t in enumerate(texts)]
    embed_s: list[float] = []
    bulk_s: list[float] = []
    ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-bulk-") as tmp:
        def embed_alone() -> None:
            t0 = time.perf_counter()
            emb.embed(texts)
            embed_s.append(time.perf_counter() - t0)

        def bulk_add(r: int) -> None:
            with MemoryService.open(Path(tmp) / f"bulk{r}", embedder=emb) as svc:
                t0 = time.perf_counter()
                saved = svc.add_notes(rows)
                bulk_s.append(time.perf_counter() - t0)
                assert len(saved) == n

        for r in range(runs):  # which goes first alternates, so neither gets the quieter slot
            if r % 2:
                bulk_add(r)
                embed_alone()
            else:
                embed_alone()
                bulk_add(r)
            ratios.append(embed_s[-1] / bulk_s[-1])
        single_s = 0.0
        if single:
            with MemoryService.open(Path(tmp) / "single", embedder=emb) as svc:
                t0 = time.perf_counter()
                for row in rows[:single]:
                    svc.add_note(**row)
                single_s = time.perf_counter() - t0
    embed_med = statistics.median(embed_s)
    bulk_med = statistics.median(bulk_s)
    return {
        "n": n,
        "embed_s": embed_med,
        "bulk_s": bulk_med,
        "embed_per_s": n / embed_med,
        "bulk_per_s": n / bulk_med,
        "ratio": statistics.median(ratios),
        "single_n": single,
        "single_per_s": single / single_s if single_s else 0.0,
        "model": emb.model_id,
    }


def run(args: argparse.Namespace) -> dict[str, float]:
    load_before = _load()
    out = measure(args.n, args.runs, args.single, args.hash)
    rows = [
        ["embedder alone", out["n"], f"{out['embed_s']:.3f}", f"{out['embed_per_s']:,.0f}"],
        ["svc.add_notes", out["n"], f"{out['bulk_s']:.3f}", f"{out['bulk_per_s']:,.0f}"],
    ]
    if out["single_n"]:
        rows.append(["add_note, one by one", out["single_n"], "", f"{out['single_per_s']:,.0f}"])
    print(f"Bulk load of {out['n']} notes with {out['model']}, median of {args.runs} runs"
          f" (load average {load_before} before, {_load()} after)")
    print(tabulate(rows, headers=["path", "notes", "median s", "notes/s"], tablefmt="github"))
    print(f"add_notes / embedder throughput: {out['ratio']:.2f} (median of per-run ratios; target >= 0.90)")
    return out


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: ``memory-pipelines bench bulk [--n N] [--runs R] [--single S] [--hash]``."""
    parser = argparse.ArgumentParser(prog="memory-pipelines bench bulk", description=__doc__)
    parser.add_argument("--n", type=int, default=2000, help="notes per run (default 2000)")
    parser.add_argument("--runs", type=int, default=3, help="runs (median; default 3)")
    parser.add_argument("--single", type=int, default=200, help="notes added one by one (0: skip)")
    parser.add_argument("--hash", action="store_true", help="the hashing embedder, not MiniLM")
    run(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
