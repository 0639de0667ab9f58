"""Single writes trickling into one store, then injection before and after compaction.

``memory-pipelines bench trickle [--n 5000] [--runs 100] [--queries 100] [--k 5]
[--legacy-n 1000] [--no-legacy] [--previous] [--compact-every 32] [--embedder hash|minilm]
[--repeats 1]``

What an agent fleet does all day between two maintenance runs, through the public API:

1. ``--n`` notes added one by one with ``svc.add_note`` (the embedding cache is warmed
   first, so the model is out of the picture), timing every add;
2. ``--runs`` runs of 5 in-flight writes (``svc.write``, cache warm), timing each run;
3. ``inject`` p50/p95 for ``--queries`` user-scoped queries with the query vector given
   (query embedding excluded) on the store as the trickle left it;
4. ``svc.compact()``, then the same queries again.

It runs twice in one process: with the store as it is (new notes appended, updates
merged through the id index, small fragments compacted in the background every
``--compact-every`` commits) and, as the baseline, with today's former path forced
(``--legacy-upsert`` behaviour: every save a ``merge_insert`` without the id index, no
compaction between maintenance runs) over ``--legacy-n`` notes, since a legacy add near
5,000 fragments takes seconds. ``--previous`` adds the path before claim-protected
appends (every note save a ``merge_insert``, compaction keeping 10 minutes of versions)
over ``--n`` adds. Reported: time per add (median and mean) over the first
and the last 100 adds and their ratio, write runs per second, fragments before
compaction, inject p50/p95 before and after ``compact`` and their ratio. With
``--repeats R`` each path runs R times over a fresh home: every figure is the median of
the R runs, each ratio the median of the runs' own ratios, and the add ratio also shows
its smallest and largest run (one run's ratio moves with the machine's load).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import numpy as np
from tabulate import tabulate

from memory_pipelines.bench.embed import make_sentences
from memory_pipelines.embeddings import Embedder, HashEmbedder, MiniLMEmbedder
from memory_pipelines.injection import inject
from memory_pipelines.notes import NoteType, RunContext

AGENT = "agent-t"
USERS = 20
DIM = 384


def _pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q))


def _ms(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def force_legacy(svc) -> None:
    """Today's former write path: every save a ``merge_insert`` that reads every
    fragment (no id index), and no compaction between maintenance runs."""
    for table in (svc.store.notes, svc.store.examples):
        table.put = table.upsert
        table.compact_every = 0


def force_previous(svc) -> None:
    """The path before claim-protected appends: every save of a note a ``merge_insert``,
    and the background compaction keeping versions younger than 10 minutes."""
    for table in (svc.store.notes, svc.store.examples):
        table.put = table.upsert
        table.auto_cleanup_older_than = timedelta(minutes=10)
        table.auto_keep_versions = 0


MODES = {
    "append": "append + id index + auto-compact",
    "previous": "previous: merge_insert saves, 10-min version retention",
    "legacy": "legacy merge_insert",
}


def _open_home(home: Path, mode: str, compact_every: int, k: int, embedder: Embedder):
    """A fresh home writing as ``mode`` does, the agent configured."""
    from memory_pipelines.service import MemoryService

    svc = MemoryService.open(home, embedder=embedder)
    for table in (svc.store.notes, svc.store.examples):
        table.compact_every = compact_every
    if mode == "legacy":
        force_legacy(svc)
    elif mode == "previous":
        force_previous(svc)
    svc.configure_agent(AGENT, max_notes_to_inject=k, note_injection_strategy="Relevant")
    return svc


def _single_adds(svc, texts: list[str], mode: str, say: Callable[[str], None]) -> list[float]:
    """Each text added with ``svc.add_note``, timed (ms)."""
    adds: list[float] = []
    for i, text in enumerate(texts):
        adds.append(
            _ms(
                lambda text=text, i=i: svc.add_note(
                    text, type=NoteType.CONTEXT, agent_id=AGENT, user_id=f"u{i % USERS}"
                )
            )
        )
        if (i + 1) % 1000 == 0:
            say(f"  {mode}: {i + 1} adds, last 100 median {statistics.median(adds[-100:]):.1f} ms")
    return adds


def _write_runs(svc, run_texts: list[str], runs: int) -> list[float]:
    """``runs`` runs of 5 ``svc.write`` writes, each run timed (ms)."""
    write_ms = []
    for r in range(runs):
        ctx = RunContext(agent_id=AGENT, run_id=f"trickle-run-{r}", user_id=f"u{r % USERS}")
        batch = [{"note": t, "type": "Context"} for t in run_texts[r * 5 : r * 5 + 5]]
        write_ms.append(_ms(lambda ctx=ctx, batch=batch: svc.write(ctx, batch)))
    return write_ms


def _injects(svc, texts: list[str], queries: int) -> tuple[list[float], list[float], dict]:
    """Inject latencies (ms) of ``queries`` user-scoped queries before and after
    ``svc.compact()`` (each after one warm pass), and the compaction's report."""
    n = len(texts)
    picks = np.random.default_rng(7).integers(0, n, queries)
    qs = [(texts[i], svc.embed([texts[i]])[0], f"u{i % USERS}") for i in picks]

    def inject_all() -> list[float]:
        out = []
        for text, vec, user in qs:
            ctx = RunContext(agent_id=AGENT, run_id="q", user_id=user)
            out.append(
                _ms(
                    lambda ctx=ctx, text=text, vec=vec: inject(
                        svc.context, ctx, text, query_vector=vec
                    )
                )
            )
        return out

    inject_all()  # warm
    before = inject_all()
    report = svc.compact()
    inject_all()
    return before, inject_all(), report


def run_mode(
    *,
    n: int,
    runs: int,
    queries: int,
    k: int,
    mode: str,
    compact_every: int,
    embedder: Embedder,
    say: Callable[[str], None],
) -> dict:
    """One trickle over a fresh home; the figures of one mode."""
    texts = make_sentences(n, seed=3)
    run_texts = [
        f"Run {r} fact {j}: {t}"
        for r in range(runs)
        for j, t in enumerate(make_sentences(5, seed=100 + r))
    ]
    with tempfile.TemporaryDirectory(prefix="trickle-bench-") as tmp:
        svc = _open_home(Path(tmp) / "home", mode, compact_every, k, embedder)
        try:
            for start in range(0, n, 512):  # warm the embedding cache
                svc.embed(texts[start : start + 512])
            svc.embed(run_texts)
            adds = _single_adds(svc, texts, mode, say)
            write_ms = _write_runs(svc, run_texts, runs)
            svc.store.notes.wait_for_compaction()
            fragments = svc.store.notes.stats()["fragments"]
            before, after, report = _injects(svc, texts, queries)
        finally:
            svc.close()
    return {
        "mode": MODES[mode],
        "n": n,
        "first100_median": statistics.median(adds[:100]),
        "last100_median": statistics.median(adds[-100:]),
        "first100_mean": statistics.fmean(adds[:100]),
        "last100_mean": statistics.fmean(adds[-100:]),
        "runs_per_s": 1000 * len(write_ms) / sum(write_ms) if write_ms else float("nan"),
        "writes_per_s": 5000 * len(write_ms) / sum(write_ms) if write_ms else float("nan"),
        "fragments": fragments,
        "inject_before": (_pct(before, 50), _pct(before, 95)),
        "inject_after": (_pct(after, 50), _pct(after, 95)),
        "compact_s": report.get("notesSeconds", float("nan")),
    }


def combine(runs: Sequence[dict]) -> dict:
    """One path's figures over repeated runs: the median of each figure, the median of
    the runs' own ratios, and the smallest and largest add ratio."""
    out = dict(runs[0])
    for key in (
        "first100_median",
        "last100_median",
        "first100_mean",
        "last100_mean",
        "writes_per_s",
        "fragments",
    ):
        out[key] = statistics.median(r[key] for r in runs)
    for key in ("inject_before", "inject_after"):
        out[key] = tuple(statistics.median(r[key][i] for r in runs) for i in (0, 1))
    ratios = [r["last100_median"] / r["first100_median"] for r in runs]
    out["add_ratio"] = statistics.median(ratios)
    out["add_ratio_range"] = (min(ratios), max(ratios))
    out["add_mean_ratio"] = statistics.median(r["last100_mean"] / r["first100_mean"] for r in runs)
    out["inject_ratio"] = statistics.median(
        r["inject_before"][1] / r["inject_after"][1] for r in runs
    )
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memory-pipelines bench trickle", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--n", type=int, default=5000, help="single adds (new path)")
    parser.add_argument("--runs", type=int, default=100, help="runs of 5 svc.write writes")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--legacy-n", type=int, default=1000, help="single adds, legacy path")
    parser.add_argument("--no-legacy", action="store_true", help="skip the legacy baseline")
    parser.add_argument(
        "--legacy-upsert", action="store_true", help="run only the legacy path, over --n adds"
    )
    parser.add_argument(
        "--previous", action="store_true", help="also run the path before appends, over --n adds"
    )
    parser.add_argument("--compact-every", type=int, default=32)
    parser.add_argument("--embedder", choices=("hash", "minilm"), default="hash")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each path (medians)")
    return parser


def _modes(args: argparse.Namespace) -> list[tuple[str, int]]:
    """The paths to run, each with its number of adds."""
    if args.legacy_upsert:
        return [("legacy", args.n)]
    modes = [("append", args.n)]
    if args.previous:
        modes.append(("previous", args.n))
    if not args.no_legacy:
        modes.append(("legacy", args.legacy_n))
    return modes


def _table_row(r: dict, repeats: int) -> list[str]:
    b50, b95 = r["inject_before"]
    a50, a95 = r["inject_after"]
    lo, hi = r["add_ratio_range"]
    spread = f"; runs {lo:.2f}-{hi:.2f}x" if repeats > 1 else ""
    return [
        r["mode"],
        f"{r['n']:,}",
        f"{r['first100_median']:.1f} / {r['last100_median']:.1f} ({r['add_ratio']:.2f}x{spread})",
        f"{r['first100_mean']:.1f} / {r['last100_mean']:.1f} ({r['add_mean_ratio']:.2f}x)",
        f"{r['writes_per_s']:.1f}",
        f"{r['fragments']:g}",
        f"{b50:.1f} / {b95:.1f}",
        f"{a50:.1f} / {a95:.1f}",
        f"{r['inject_ratio']:.2f}x",
    ]


HEADERS = [
    "path",
    "adds",
    "add ms median first/last 100",
    "add ms mean first/last 100",
    "svc.write writes/s",
    "fragments",
    "inject p50/p95 ms before compact",
    "after compact",
    "p95 before/after",
]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    embedder: Embedder = MiniLMEmbedder() if args.embedder == "minilm" else HashEmbedder(DIM)
    results = []
    for mode, n in _modes(args):
        runs = []
        for repeat in range(args.repeats):
            print(
                f"trickle: {mode} path, {n} adds, run {repeat + 1}/{args.repeats}", file=sys.stderr
            )
            runs.append(
                run_mode(
                    n=n,
                    runs=args.runs,
                    queries=args.queries,
                    k=args.k,
                    mode=mode,
                    compact_every=args.compact_every,
                    embedder=embedder,
                    say=lambda msg: print(msg, file=sys.stderr),
                )
            )
        results.append(combine(runs))
    print(
        f"trickle: single adds, {args.runs} runs of 5 writes, {args.queries} injects "
        f"(query embedding excluded), k={args.k}, embedder {embedder.model_id}"
    )
    print(tabulate([_table_row(r, args.repeats) for r in results], headers=HEADERS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
