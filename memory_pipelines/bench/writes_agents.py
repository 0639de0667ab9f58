"""``bench writes --agents K``: K agents of one process writing at once.

Each agent is a thread that calls ``svc.write`` (the public call) with runs of 5 writes,
one after another, for distinct random users. The two modes alternate phase by phase on
the same store, so drift hits both: ``grouped`` (group commit on, the default:
concurrent calls share a round, :mod:`memory_pipelines.writes.combine`) and ``alone``
(``WriteConfig(group_commit=False)``: each call runs on its caller's thread, as before
group commit). In a phase each agent runs ``per_phase`` runs back to back (a closed
loop). Writes/s is the phase's writes over its wall time, summed over phases; run
p50/p95 are the latencies one agent sees per ``svc.write``; each part is the time spent
in it per run, summed over the agents' threads (they overlap, so there is no ``other``).
"""

from __future__ import annotations

import dataclasses
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from memory_pipelines.bench.embed import make_sentences
from memory_pipelines.notes import Note, RunContext
from memory_pipelines.service import MemoryService

#: the modes, each with its ``group_commit`` setting
MODES = {"grouped": True, "alone": False}
#: runs each agent makes in one phase of a mode
PER_PHASE = 5


def measure_agents(
    svc: MemoryService,
    *,
    agents: int,
    runs: int,
    n: int,
    targets: dict[str, list[Note]],
    company_of: Callable[[str], str],
    run_writes: Callable[[Sequence[str], str, int], list[dict[str, str]]],
    timers: dict[str, Any],
    new_stats: Callable[[], Any],
    parts: Sequence[str],
) -> dict[str, Any]:
    """Measure both modes with ``agents`` threads and about ``runs`` runs each; the stats
    of each mode (label ``"K agents, grouped"`` and ``"K agents, alone"``)."""
    rng = random.Random(2)
    keys = sorted(targets)
    per = max(1, min(PER_PHASE, runs // agents))
    phases = max(1, math.ceil(runs / (agents * per)))
    fresh = make_sentences(phases * len(MODES) * agents * per * 3, seed=123)
    stats = {mode: new_stats() for mode in MODES}
    original = svc.write_config
    counter = iter(range(len(fresh)))
    with ThreadPoolExecutor(agents, thread_name_prefix="bench-agent") as pool:
        try:
            for p in range(phases):
                for mode, grouped in MODES.items():
                    svc.write_config = dataclasses.replace(original, group_commit=grouped)
                    jobs = []
                    for a in range(agents):
                        calls = []
                        for r in range(per):
                            agent, user = rng.choice(keys).split("|")
                            run = f"bench-{n}-agents-{mode}-{p}-{a}-{r}"
                            texts = [fresh[next(counter)] for _ in range(3)]
                            ctx = RunContext(
                                agent_id=agent,
                                run_id=run,
                                user_id=user,
                                company_id=company_of(user),
                                conversation_id=run,
                            )
                            existing = rng.choice(targets[f"{agent}|{user}"]).note
                            calls.append((ctx, run_writes(texts, existing, p * per + r)))
                        jobs.append(calls)
                    _phase(svc, pool, jobs, stats[mode], timers, parts)
        finally:
            svc.write_config = original
    return {f"{agents} agents, {mode}": st for mode, st in stats.items()}


def _phase(
    svc: MemoryService,
    pool: ThreadPoolExecutor,
    jobs: list[list[tuple[RunContext, list[dict[str, str]]]]],
    st: Any,
    timers: dict[str, Any],
    parts: Sequence[str],
) -> None:
    """Run one phase: every agent's calls at once; add its figures to ``st``."""
    start = threading.Barrier(len(jobs))

    def agent(calls: list[tuple[RunContext, list[dict[str, str]]]]) -> list[tuple[float, list]]:
        start.wait()
        out = []
        for ctx, writes in calls:
            t0 = time.perf_counter()
            results = svc.write(ctx, writes)
            out.append(((time.perf_counter() - t0) * 1000.0, results))
        return out

    before = {k: t.total for k, t in timers.items()}
    t0 = time.perf_counter()
    done = [f.result() for f in [pool.submit(agent, calls) for calls in jobs]]
    st.wall_ms += (time.perf_counter() - t0) * 1000.0
    n_runs = sum(len(calls) for calls in jobs)
    for ms, results in (row for rows in done for row in rows):
        st.runs_ms.append(ms)
        st.dispositions.update(r.disposition for r in results)
    for k in parts:
        spent = (timers[k].total - before[k]) * 1000.0 if k in timers else math.nan
        st.parts[k].extend([spent / n_runs] * n_runs)
