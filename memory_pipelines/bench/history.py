"""What lifecycle events and time travel cost, in one run.

``memory-pipelines bench history [--notes 10000] [--writes 200] [--injects 30] [--seed 0]``:

(a) single ``svc.write`` calls with events vs with the journal disabled
    (``svc.notebook.journal = None``), interleaved call by call, median seconds and ratio;
(b) the five maintenance phases over a synthetic pool of ``--notes`` notes (the pool of
    ``bench maintenance``), with events vs without, in two fresh homes, total seconds and
    ratio;
(c) ``svc.inject(ctx, input, as_of=t0)`` vs the present ``svc.inject(ctx, input)`` at
    ``--notes`` notes after 1% of them changed since ``t0`` (edited, archived), median
    seconds and ratio (both warm: the read cache and the embed cache are filled first).

The issue's targets: (a) and (b) at most 1.10, (c) at most 3.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

from memory_pipelines.bench.maintenance import NOW, PHASE_FUNCS, PoolBuilder
from memory_pipelines.clock import FakeClock
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.service import MemoryService


def bench_writes(home: Path, n: int) -> tuple[float, float]:
    """Median seconds of one single-item write with and without the journal."""
    clock = FakeClock(NOW)
    with MemoryService.open(home, embedder=HashEmbedder(384), clock=clock) as svc:
        svc.configure_agent("bench-agent")
        journal = svc.notebook.journal
        on: list[float] = []
        off: list[float] = []
        for i in range(2 * n + 10):
            enabled = i % 2 == 0
            svc.notebook.journal = journal if enabled else None
            ctx = {"agent_id": "bench-agent", "run_id": f"run-{i}", "user_id": f"u{i % 7}"}
            item = [{"note": f"User {i} prefers topic number {i * 7919 % 100003}", "type": "Preference"}]
            clock.advance(seconds=1)
            t = time.perf_counter()
            svc.write(ctx, item)
            took = time.perf_counter() - t
            if i >= 10:  # warm-up
                (on if enabled else off).append(took)
        svc.notebook.journal = journal
    return statistics.median(on), statistics.median(off)


def bench_maintenance(root: Path, n: int, seed: int, events: bool) -> float:
    """Seconds of the five maintenance phases over a fresh pool of ``n`` notes."""
    home = root / f"maint-{'on' if events else 'off'}"
    with MemoryService.open(home, embedder=HashEmbedder(384), clock=FakeClock(NOW)) as svc:
        PoolBuilder(svc, n, svc.embedder.dim, seed, False).build()
        if not events:
            svc.notebook.journal = None
        t = time.perf_counter()
        for _, fn, _ in PHASE_FUNCS:
            fn(svc.context, f"bench-{n}")
        return time.perf_counter() - t


def bench_as_of(root: Path, n: int, seed: int, repeats: int) -> tuple[float, float, int]:
    """Median seconds of a present and an as_of injection at ``n`` notes."""
    clock = FakeClock(NOW)
    with MemoryService.open(root / "as-of", embedder=HashEmbedder(384), clock=clock) as svc:
        PoolBuilder(svc, n, svc.embedder.dim, seed, False, n_agents=1).build()
        clock.advance(hours=1)
        t0 = clock()
        clock.advance(hours=1)
        notes = svc.notes(agent_id="agent-0", status="Active").head(max(1, n // 100))
        changes = [
            (svc.get_note(i), {"note": f"edited {k}"} if k % 2 else {"status": "Archived"})
            for k, i in enumerate(notes["id"])
        ]
        svc.update_notes([c for c in changes if c[0] is not None])
        clock.advance(hours=1)
        user = svc.notes(agent_id="agent-0")["user_id"].dropna().iloc[0]
        company = svc.notes(agent_id="agent-0", user_id=user)["company_id"].iloc[0]
        ctx = {"agent_id": "agent-0", "user_id": user, "company_id": company}
        query = "The user prefers green tea and dark mode"
        svc.inject(ctx, query)
        svc.inject(ctx, query, as_of=t0)
        present, past = [], []
        for _ in range(repeats):
            t = time.perf_counter()
            svc.inject(ctx, query)
            present.append(time.perf_counter() - t)
            t = time.perf_counter()
            svc.inject(ctx, query, as_of=t0)
            past.append(time.perf_counter() - t)
        return statistics.median(present), statistics.median(past), len(changes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memory-pipelines bench history", description=__doc__)
    parser.add_argument("--notes", type=int, default=10_000, help="pool size for (b) and (c)")
    parser.add_argument("--writes", type=int, default=200, help="writes per side for (a)")
    parser.add_argument("--injects", type=int, default=30, help="injections per side for (c)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-history-"))
    try:
        w_on, w_off = bench_writes(root / "writes", args.writes)
        m_on = bench_maintenance(root, args.notes, args.seed, True)
        m_off = bench_maintenance(root, args.notes, args.seed, False)
        present, past, changed = bench_as_of(root, args.notes, args.seed, args.injects)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = [
        ["(a) single write, median s", f"{w_on:.5f}", f"{w_off:.5f}", f"{w_on / w_off:.3f}", "<= 1.10"],
        [f"(b) maintenance, {args.notes} notes, s", f"{m_on:.3f}", f"{m_off:.3f}", f"{m_on / m_off:.3f}", "<= 1.10"],
        [f"(c) inject at {args.notes} notes ({changed} changed), median s", f"{past:.5f}", f"{present:.5f}", f"{past / present:.3f}", "<= 3"],
    ]
    print(tabulate(rows, headers=["", "events / as_of", "no events / present", "ratio", "target"]))
    return 0
