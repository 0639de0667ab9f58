"""Memory that comes back: resident size over open / fill / inject / close cycles.

``memory-pipelines bench memory [--cycles 60] [--notes 500]`` opens a fresh home in this
process ``cycles`` times, fills it with ``notes`` single ``add_note`` calls (the hashing
embedder, 384-d, so the model is out of the picture), injects once and closes it. It
prints the resident set size (RSS) after the first cycle and after the last, their
difference (the target: within 200 MB), the growth per cycle over the second half, and
how many closed services are still reachable and how many threads are left (both should
be none beyond the process's own, such as LanceDB's one event loop thread).
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

#: threads a process keeps once, whatever number of homes it opens (LanceDB's event loop)
PROCESS_THREADS = frozenset({"LanceDBBackgroundEventLoop"})


def _status_mb(field: str) -> float:
    """A size line of ``/proc/self/status`` (``VmRSS``, ``RssAnon`` ...) in MB; 0 where
    there is none (not Linux)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def rss_mb() -> float:
    """This process's resident set size in MB (Linux ``/proc``; 0 elsewhere)."""
    return _status_mb("VmRSS")


def anon_rss_mb() -> float:
    """The anonymous (private) part of this process's resident size in MB: what it
    allocated, without the pages of mapped files such as its shared libraries' code, which
    the kernel can drop and reread (Linux ``/proc``; 0 elsewhere)."""
    return _status_mb("RssAnon")


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "n/a"


def one_cycle(home: Path, notes: int, cycle: int) -> weakref.ref:
    """Open ``home``, add ``notes`` notes one by one, inject once, close; a weak
    reference to the closed service."""
    from memory_pipelines.embeddings import HashEmbedder
    from memory_pipelines.service import MemoryService

    svc = MemoryService.open(home, embedder=HashEmbedder(dim=384))
    try:
        svc.configure_agent("bench")
        for i in range(notes):
            svc.add_note(
                f"Cycle {cycle} note {i}: the user prefers option {i % 17} for topic {i % 29}.",
                agent_id="bench",
                user_id=f"u{i % 5}",
            )
        svc.inject({"agent_id": "bench", "user_id": "u0", "run_id": f"run-{cycle}"}, "which option?")
    finally:
        svc.close()
    return weakref.ref(svc)


def measure(cycles: int = 60, notes: int = 500, progress: bool = False) -> dict[str, Any]:
    """RSS after the first and the last of ``cycles`` cycles, and what outlived them."""
    threads_before = {t.ident for t in threading.enumerate()}
    rss: list[float] = []
    refs: list[weakref.ref] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        for c in range(cycles):
            refs.append(one_cycle(Path(tmp) / f"home{c}", notes, c))
            gc.collect()
            rss.append(rss_mb())
            if progress:
                print(f"  cycle {c + 1}: {rss[-1]:.0f} MB", flush=True)
    half = max(1, cycles // 2)
    tail = rss[half - 1 :]
    per_cycle = (tail[-1] - tail[0]) / max(1, len(tail) - 1)
    left = [
        t.name
        for t in threading.enumerate()
        if t.ident not in threads_before and t.name not in PROCESS_THREADS
    ]
    return {
        "cycles": cycles,
        "notes": notes,
        "rss_first_mb": rss[0],
        "rss_last_mb": rss[-1],
        "rss_peak_mb": max(rss),
        "growth_mb": rss[-1] - rss[0],
        "per_cycle_mb": per_cycle,
        "services_alive": sum(r() is not None for r in refs),
        "threads_left": left,
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: ``memory-pipelines bench memory [--cycles N] [--notes M]``."""
    parser = argparse.ArgumentParser(prog="memory-pipelines bench memory", description=__doc__)
    parser.add_argument("--cycles", type=int, default=60, help="homes opened one after another")
    parser.add_argument("--notes", type=int, default=500, help="notes added to each home")
    parser.add_argument("--progress", action="store_true", help="print RSS after every cycle")
    args = parser.parse_args(argv)
    load = _load()
    out = measure(args.cycles, args.notes, args.progress)
    print(
        f"{out['cycles']} open / fill ({out['notes']} add_note, hashing embedder) / inject / close"
        f" cycles in one process, {out['seconds']:.0f} s (load average {load} before, {_load()} after)"
    )
    print(f"RSS after the first cycle: {out['rss_first_mb']:.0f} MB")
    print(f"RSS after the last cycle:  {out['rss_last_mb']:.0f} MB (peak {out['rss_peak_mb']:.0f} MB)")
    print(f"growth: {out['growth_mb']:+.0f} MB (target: within 200 MB);"
          f" {out['per_cycle_mb']:+.1f} MB per cycle over the second half")
    print(f"closed services still reachable: {out['services_alive']};"
          f" threads left: {len(out['threads_left'])} {out['threads_left'] or ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
