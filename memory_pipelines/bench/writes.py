"""In-flight write throughput and latency over a pre-populated note store.

``memory-pipelines bench writes [--sizes 10000 100000] [--runs 40] [--embedder minilm|hash]
[--prefill random|hash|embedder] [--index] [--no-compact] [--unbatched] [--repeats 1]
[--agents 1] [--home DIR]``

For each size N the store is filled with N existing notes (synthetic text over N/20 users,
50 companies and 4 agents; 80% Active, 10% Provisional, 10% Archived), added in bulk
with ``store.notes.add``. Their vectors come from ``--prefill``: ``random`` unit vectors
(default; fast, but no existing note is then a semantic neighbour of a new write),
``hash`` (HashEmbedder of the text) or ``embedder`` (the write embedder itself: real
neighbours, slow with MiniLM, about 65 s per 10k notes). The table says which was used.
The store is then compacted once as the daily maintenance does (``svc.compact()``: one
fragment, the id index and the scalar indexes of a table that large), so the runs see a
live store's state; ``--no-compact`` skips it (the background compaction then merges the
runs' own small fragments, never the prefill's large ones).

Then ``--runs`` agent runs of 5 writes each go through the write path twice, alternating
run by run on the same store: batched (what ``svc.write(ctx, writes)`` does: one
embedding call, one fetch per scope, one note commit, one ledger claim, one audit
transaction) and per-write (``execute_writes(..., batched=False)``: the same guards, each
write embedding, searching and committing on its own, the path before batching;
``--unbatched`` runs only this one). Each run is: 3 new facts, 1 verbatim
restatement of one of the user's existing notes (``deduped`` when the prefill vectors
share the write embedder's space) and 1 light edit of the run's first write
(``superseded-own``). Writes/s is 5 runs' writes over their summed wall time; p50/p95 are
per run of 5. Every run's wall time is split into embedding (the model
itself, timed inside the embedding cache), search (the scope's candidate fetch, or the
per-write vector searches), note save (LanceDB append or upsert), ledger (the run's
ledger read and claim), events (the lifecycle-event insert), audit (the audit steps) and
the rest (guard logic, planning, note and result objects). The batched path fetches the
run's scope while it embeds, so there search overlaps embed and ``other`` (the run less
every part) can be below zero. Baselines measured in the same process: a bare
``store.notes.add`` of one row, a bare filtered ``vector_search`` and a bare embedding.

``--agents K`` (K > 1) then also measures K agents of the process writing at once through
``svc.write``, with group commit (concurrent calls share rounds) and without, alternating
(:mod:`memory_pipelines.bench.writes_agents`): writes/s there is over the wall time.

``--repeats R`` measures each size R times, each in a fresh store, and reports the
median of every figure (writes/s also with its smallest and largest repeat): one
repeat's writes/s moves by about 10% on these machines.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tabulate import tabulate

from memory_pipelines.bench.embed import make_sentences
from memory_pipelines.bench.writes_agents import measure_agents
from memory_pipelines.clock import FakeClock
from memory_pipelines.config import INDEXED_NOTE_COLUMNS
from memory_pipelines.embeddings import Embedder, HashEmbedder, MiniLMEmbedder, l2_normalize
from memory_pipelines.notes import AuthorType, Note, NoteStatus, RunContext
from memory_pipelines.service import MemoryService
from memory_pipelines.store import eq
from memory_pipelines.writes import WriteScope, execute_writes, near_dup_filter

AGENTS = ("agent-0", "agent-1", "agent-2", "agent-3")
N_COMPANIES = 50
NOTES_PER_USER = 20
ADD_BATCH = 10_000
#: the parts a run's wall time is split into (``other``: the guard logic, planning,
#: building notes and results)
PARTS = ("embed", "search", "save", "ledger", "events", "audit", "other")


class Timer:
    """Accumulated seconds of the calls made through :meth:`wrap`."""

    def __init__(self) -> None:
        self.total = 0.0
        self._lock = threading.Lock()  # ``--agents`` threads add at once

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.total += time.perf_counter() - t0

        return timed


class TimedEmbedder:
    """An embedder that adds the time spent in the model to a :class:`Timer`."""

    def __init__(self, inner: Embedder, timer: Timer) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.dim = inner.dim
        self.embed = timer.wrap(inner.embed)


def _user_of(i: int, n_users: int) -> str:
    return f"user-{i % n_users}"


def _company_of(user: str) -> str:
    return f"company-{int(user.split('-')[1]) % N_COMPANIES}"


def prefill(
    svc: MemoryService, n: int, mode: str, write_embedder: Embedder, seed: int = 0
) -> tuple[list[Note], float]:
    """Add ``n`` existing notes in bulk; return them and the seconds it took."""
    rng = np.random.default_rng(seed)
    texts = make_sentences(n, seed=seed)
    n_users = max(1, n // NOTES_PER_USER)
    now = svc.now()
    statuses = rng.choice(
        [NoteStatus.ACTIVE.value, NoteStatus.PROVISIONAL.value, NoteStatus.ARCHIVED.value],
        size=n,
        p=[0.8, 0.1, 0.1],
    )
    notes = []
    for i, text in enumerate(texts):
        user = _user_of(i, n_users)
        notes.append(
            Note(
                id=f"pre-{i}",
                agent_id=AGENTS[i % len(AGENTS)],
                user_id=user if i % 5 else None,  # every 5th note is agent-wide
                company_id=_company_of(user),
                note=f"{text} [{i}]",
                type="Context" if i % 3 else "Preference",
                status=str(statuses[i]),
                author_type=AuthorType.MEMORY_MANAGER,
                access_count=int(rng.integers(0, 5)),
                created_at=now,
                updated_at=now,
                embedding_model_id=mode,
            )
        )
    hasher = HashEmbedder(dim=svc.embedder.dim)
    t0 = time.perf_counter()
    for start in range(0, n, ADD_BATCH):
        chunk = notes[start : start + ADD_BATCH]
        if mode == "random":
            vecs = l2_normalize(
                rng.standard_normal((len(chunk), svc.embedder.dim)).astype(np.float32)
            )
        elif mode == "hash":
            vecs = hasher.embed([c.note for c in chunk])
        else:
            vecs = write_embedder.embed([c.note for c in chunk])
        svc.store.notes.add(chunk, vecs)
    return notes, time.perf_counter() - t0


def run_writes(texts: Sequence[str], existing: str, r: int) -> list[dict[str, str]]:
    """One run's 5 writes: 3 new facts (from ``texts``), a verbatim restatement of the
    user's ``existing`` note and a light edit of the first write."""
    new = [f"{t.rstrip('.')} (run {r})." for t in texts]
    return [
        {"note": new[0], "type": "Preference"},
        {"note": new[1], "type": "Context"},
        {"note": existing, "type": "Context"},
        {"note": new[2], "type": "Context"},
        {"note": new[0][:-1] + "!", "type": "Preference"},
    ]


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def _instrument(svc: MemoryService, timers: dict[str, Timer]) -> None:
    """Time the note table's searches and saves, the ledger, the audit steps and the
    events through ``timers`` (the parts of a write)."""
    notes_table = svc.store.notes
    for name in ("vector_search", "scan_with_vectors"):
        setattr(notes_table, name, timers["search"].wrap(getattr(notes_table, name)))
    for name in ("upsert", "add", "put"):
        setattr(notes_table, name, timers["save"].wrap(getattr(notes_table, name)))
    sources = svc.context.sources
    for name in ("ledger_rows", "ledger_claim"):
        setattr(sources, name, timers["ledger"].wrap(getattr(sources, name)))
    sources.add_step_batch = timers["audit"].wrap(sources.add_step_batch)
    svc.context.notebook.journal = timers["events"].wrap(svc.context.notebook.journal)


def _notes_by_user(notes: list[Note]) -> dict[str, list[Note]]:
    """The live user-scoped notes by ``agent|user``."""
    by_user: dict[str, list[Note]] = {}
    for note in notes:
        if note.user_id and note.status != NoteStatus.ARCHIVED:
            by_user.setdefault(f"{note.agent_id}|{note.user_id}", []).append(note)
    return by_user


def _one_run(
    svc, ctx: RunContext, batch: list, mode: str, st: _ModeStats, timers: dict[str, Timer]
) -> None:
    """One run's writes in ``mode``, its time and each part's share added to ``st``."""
    before = {k: t.total for k, t in timers.items()}
    t0 = time.perf_counter()
    results = execute_writes(svc.context, ctx, batch, batched=mode == "batched")
    total = time.perf_counter() - t0
    st.runs_ms.append(total * 1000)
    st.dispositions.update(res.disposition for res in results)
    spent = {k: (timers[k].total - before[k]) * 1000 for k in timers}
    for k, v in spent.items():
        st.parts[k].append(v)
    st.parts["other"].append(total * 1000 - sum(spent.values()))


def _measure_modes(
    svc, n: int, args: argparse.Namespace, by_user: dict[str, list[Note]], rng, timers
) -> dict[str, _ModeStats]:
    """``args.runs`` runs of 5 writes in each mode (batched and per-write, alternating
    over the same run shapes)."""
    fresh = make_sentences(args.runs * 8, seed=99)
    keys = sorted(by_user)
    modes = ["per-write"] if args.unbatched else ["batched", "per-write"]
    stats = {m: _ModeStats() for m in modes}
    for r in range(args.runs):
        agent, user = rng.choice(keys).split("|")
        # each mode restates its own existing note: a note one mode wrote must not be
        # the other mode's restatement target
        mine = by_user[f"{agent}|{user}"]
        targets = rng.sample(mine, len(modes)) if len(mine) >= len(modes) else mine * 2
        for m, mode in enumerate(modes):
            existing = targets[m].note  # the same run shape in both modes, alternating
            ctx = RunContext(
                agent_id=agent,
                run_id=f"bench-{n}-{r}-{mode}",
                user_id=user,
                company_id=_company_of(user),
                conversation_id=f"conv-{r}",
            )
            k = r * len(modes) + m
            batch = run_writes(fresh[k * 4 : k * 4 + 3], existing, r)
            _one_run(svc, ctx, batch, mode, stats[mode], timers)
    return stats


def run_size(n: int, args: argparse.Namespace, base: Embedder, home: Path) -> _Repeat:
    """Benchmark one store size once, in a fresh store at ``home``."""
    timers = {k: Timer() for k in PARTS[:-1]}
    embedder = TimedEmbedder(base, timers["embed"])
    clock = FakeClock()
    with MemoryService.open(home, embedder=embedder, clock=clock) as svc:
        for agent in AGENTS:
            svc.configure_agent(agent)
        notes, fill_s = prefill(svc, n, args.prefill, base)
        if args.index:
            svc.store.notes.ensure_scalar_indexes(INDEXED_NOTE_COLUMNS)
        if args.compact:  # the state the daily maintenance leaves (a live store's)
            svc.compact()
        _instrument(svc, timers)
        rng = random.Random(1)
        n_users = max(1, n // NOTES_PER_USER)
        by_user = _notes_by_user(notes)
        stats = _measure_modes(svc, n, args, by_user, rng, timers)
        if args.agents > 1:
            stats.update(
                measure_agents(
                    svc,
                    agents=args.agents,
                    runs=args.runs,
                    n=n,
                    targets=by_user,
                    company_of=_company_of,
                    run_writes=run_writes,
                    timers=timers,
                    new_stats=_ModeStats,
                    parts=PARTS,
                )
            )
        baseline = _baselines(svc, base, n_users, rng)
        return _Repeat(stats, baseline, fill_s)


@dataclass
class _ModeStats:
    runs_ms: list[float] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in PARTS})
    dispositions: Counter[str] = field(default_factory=Counter)
    #: the wall time of runs made at once (``--agents``); 0: runs one after another
    wall_ms: float = 0.0

    def figures(self) -> dict[str, float]:
        """Writes/s, run p50/p95 and each part's p50 (ms) of one repeat."""
        n_writes = 5 * len(self.runs_ms)
        out = {
            "writes_s": n_writes / ((self.wall_ms or sum(self.runs_ms)) / 1000),
            "p50": _pct(self.runs_ms, 50),
            "p95": _pct(self.runs_ms, 95),
        }
        out.update({k: _pct(self.parts[k], 50) for k in PARTS})
        return out


@dataclass
class _Repeat:
    """One size measured once: each path's stats, the baselines (ms) and the prefill."""

    stats: dict[str, _ModeStats]
    baseline: list[float]
    fill_s: float


def combine(n: int, prefill: str, repeats: Sequence[_Repeat]) -> tuple[list[list[Any]], list[Any]]:
    """The table rows of one size over its repeats: per path the median of each figure
    (writes/s with its smallest and largest repeat when there are several), and the
    median baselines."""
    rows = []
    for mode in repeats[0].stats:
        figs = [r.stats[mode].figures() for r in repeats]
        med = {k: statistics.median(f[k] for f in figs) for k in figs[0]}
        n_writes = sum(5 * len(r.stats[mode].runs_ms) for r in repeats)
        rate = f"{med['writes_s']:.1f}"
        if len(repeats) > 1:
            rate += (
                f" ({min(f['writes_s'] for f in figs):.1f}-{max(f['writes_s'] for f in figs):.1f})"
            )
        rows.append(
            [
                f"{n:,}",
                mode,
                prefill,
                n_writes,
                rate,
                f"{med['p50']:.1f}",
                f"{med['p95']:.1f}",
                *(_ms(med[k]) for k in PARTS),
                f"{statistics.median(r.fill_s for r in repeats):.1f}",
            ]
        )
    base = [statistics.median(r.baseline[i] for r in repeats) for i in range(3)]
    return rows, [f"{n:,}", *(f"{v:.1f}" for v in base)]


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def _baselines(svc: MemoryService, base: Embedder, n_users: int, rng: random.Random) -> list[float]:
    """Median ms of a bare one-row add, a bare filtered search and a bare embedding."""
    dim = svc.embedder.dim
    add_ms, search_ms, embed_ms = [], [], []
    texts = make_sentences(30, seed=7)
    for i in range(30):
        vec = l2_normalize(np.random.default_rng(i).standard_normal((1, dim)).astype(np.float32))
        note = Note(id=f"baseline-{i}", agent_id="agent-baseline", note=f"baseline row {i}")
        t0 = time.perf_counter()
        svc.store.notes.add([note], vec)
        add_ms.append((time.perf_counter() - t0) * 1000)
        user = f"user-{rng.randrange(n_users)}"
        scope = WriteScope(AGENTS[i % len(AGENTS)], user, _company_of(user))
        ctx = RunContext(agent_id=scope.agent_id, user_id=user, company_id=scope.company_id)
        t0 = time.perf_counter()
        svc.store.notes.vector_search(
            vec[0], where=near_dup_filter(scope, ctx), k=3, min_similarity=0.92
        )
        search_ms.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        base.embed([f"{texts[i]} (baseline {i})"])
        embed_ms.append((time.perf_counter() - t0) * 1000)
    svc.store.notes.delete(eq("agent_id", "agent-baseline"))
    return [statistics.median(v) for v in (add_ms, search_ms, embed_ms)]


def run(args: argparse.Namespace) -> None:
    """Run the benchmark for every size in ``args.sizes`` and print the tables."""
    if args.embedder == "minilm":
        base: Embedder = MiniLMEmbedder()
        base.embed(["warm up"])  # load the weights outside the timings
    else:
        base = HashEmbedder(dim=384)
    write_rows, base_rows = [], []
    all_dispositions: list[str] = []
    with ExitStack() as stack:
        root = (
            Path(args.home)
            if args.home
            else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-writes-")))
        )
        for n in args.sizes:
            repeats = [
                run_size(n, args, base, root / f"n{n}-{r}-{time.time_ns()}")
                for r in range(args.repeats)
            ]
            rows, base_row = combine(n, args.prefill, repeats)
            write_rows.extend(rows)
            base_rows.append(base_row)
            for mode in repeats[0].stats:
                counts = sum((r.stats[mode].dispositions for r in repeats), Counter())
                label = f"{n:,}" if mode == "batched" else f"{n:,} {mode}"
                all_dispositions.append(
                    f"{label}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
                )
    medians = (
        f"; medians of {args.repeats} repeats, each in a fresh store" if args.repeats > 1 else ""
    )
    print(
        f"In-flight writes: {args.runs} runs x 5 writes per size and mode{medians}, write embedder "
        f"{base.model_id}, scalar indexes {'on' if args.index else 'off'}, compacted after"
        f" prefill {'yes' if args.compact else 'no'}; times in ms per"
        " run of 5 (batched: one svc.write of the run; per-write: the same guards, each"
        " write embedding, searching and committing on its own)"
    )
    print(
        tabulate(
            write_rows,
            headers=[
                "notes",
                "path",
                "prefill vectors",
                "writes",
                "writes/s",
                "run p50",
                "run p95",
                *(f"{k} p50" for k in PARTS),
                "prefill s",
            ],
            tablefmt="github",
        )
    )
    print()
    print(
        "Baselines in the same process (median ms of 30"
        + (", median of the repeats" if args.repeats > 1 else "")
        + "):"
    )
    print(
        tabulate(
            base_rows,
            headers=["notes", "bare add 1 row", "bare filtered search k=3", "bare embed 1 text"],
            tablefmt="github",
        )
    )
    print()
    print("Dispositions: " + "; ".join(all_dispositions))


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: ``memory-pipelines bench writes [options]``."""
    parser = argparse.ArgumentParser(
        prog="memory-pipelines bench writes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--runs", type=int, default=40, help="agent runs of 5 writes per size")
    parser.add_argument("--home", default=None, help="folder for the stores (default: a temp dir)")
    parser.add_argument("--embedder", choices=["minilm", "hash"], default="minilm")
    parser.add_argument("--prefill", choices=["random", "hash", "embedder"], default="random")
    parser.add_argument("--index", action="store_true", help="build scalar indexes after prefill")
    parser.add_argument(
        "--no-compact",
        dest="compact",
        action="store_false",
        help="skip the background compaction after prefill (its indexes are then missing)",
    )
    parser.add_argument(
        "--unbatched",
        action="store_true",
        help="measure only the per-write path (by default both paths run, alternating)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="measure each size this many times, each in a fresh store (medians)",
    )
    parser.add_argument(
        "--agents",
        type=int,
        default=1,
        help="also measure this many agents writing at once through svc.write, with group"
        " commit and without (1: only the runs one after another)",
    )
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.sizes) or min(args.runs, args.repeats, args.agents) < 1:
        parser.error("--sizes, --runs, --repeats and --agents must be positive")
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
