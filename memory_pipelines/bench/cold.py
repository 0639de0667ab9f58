"""Cold reads: a scope's first injection, against the warm one in the same run.

``memory-pipelines bench cold [--sizes 100000] [--users 20] [--restarts 3] [--homes 10]
[--notes 500] [--store-dir DIR]``

Two measures, the query embedding excluded (the query vector is given):

* **a scope's first read at N notes**: the corpus of ``bench inject`` (10 agents,
  N/1000 users, 2.5% agent-wide or global; synthetic texts, clustered 384-d vectors,
  bulk-loaded, with the full-text and scope-column indexes). ``--users`` users of
  ``agent-0`` not read before each inject once (their first read: their own notes, the
  agent's shared notes already held), then again (warm, the baseline). ``--restarts``
  times the home is closed and opened again and one user injects: the first read after a
  restart, which reads the shared notes too; then again after a warm start
  (``svc.warm_scopes(users)``: the scopes injected last, read before the inject, its own
  time shown beside it). ``--store-dir`` reuses ``bench inject``'s
  stores (``inject-N``).
* **a fresh home's first inject**: ``--homes`` homes, each filled with ``--notes`` single
  ``add_note`` calls (hashing embedder, 384-d, five users) and injected once for one user
  (the product path: this process wrote every row, so nothing is scanned; what a process
  pays once, such as compiling the audit statements, is paid by another agent first),
  then the same first inject with every scope read from the table (the path of a process
  that did not write them), then warm.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tabulate import tabulate

from memory_pipelines.bench.inject import (
    AGENTS,
    DIM,
    _ctx,
    _open_store,
    _pct,
    make_corpus,
    make_queries,
)

Say = Callable[[str], None]


def _ms(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def _f(p: tuple[float, float]) -> str:
    return f"{p[0]:.1f} / {p[1]:.1f}"


def _inject(svc, q) -> None:
    from memory_pipelines.injection import inject

    inject(svc.context, _ctx(q), q.text, query_vector=q.vector)


def _users_queries(corpus, users: int) -> list:
    """One query per distinct user of ``agent-0`` (``users`` of them at most)."""
    by_user: dict[int, object] = {}
    for q in make_queries(corpus, users * 8, seed=7, scope="user"):
        by_user.setdefault(q.user, q)
    return list(by_user.values())[:users]


def scope_first_reads(size: int, users: int, restarts: int, home: Path, say: Say) -> list[list]:
    """Rows for one size: first read of a user (shared notes held), warm, and the first
    read after a restart."""
    from memory_pipelines.embeddings import HashEmbedder

    corpus = make_corpus(size)
    queries = _users_queries(corpus, users + 1)
    embedder = HashEmbedder(DIM)
    svc = _open_store(size, corpus, home, embedder, say)
    try:
        svc.configure_agent(AGENTS[0], max_notes_to_inject=5, note_injection_strategy="Relevant")
        _inject(svc, queries[0])  # the agent's shared notes, lazily opened indexes
        first = [_ms(lambda q=q: _inject(svc, q)) for q in queries[1 : users + 1]]
        warm = [_ms(lambda q=q: _inject(svc, q)) for q in queries[1 : users + 1]]
        indexes = svc.store.notes.indexes_read(_scope_cell(svc, queries[1]))
    finally:
        svc.close()
    restarted, warmed, warm_ups = [], [], []
    for n in range(restarts):  # a home opened again holds nothing: any user's first read
        q = queries[1 + n % max(1, len(queries) - 1)]
        svc = _open_store(size, corpus, home, embedder, lambda _msg: None)
        try:
            restarted.append(_ms(lambda q=q, svc=svc: _inject(svc, q)))
        finally:
            svc.close()
        # the same after a warm start of the scopes injected last (off the request path)
        svc = _open_store(size, corpus, home, embedder, lambda _msg: None)
        try:
            warm_ups.append(_ms(lambda svc=svc: svc.warm_scopes(users)))
            warmed.append(_ms(lambda q=q, svc=svc: _inject(svc, q)))
        finally:
            svc.close()
    say(f"{size}: first reads measured (indexes read: {', '.join(indexes) or 'none'})")
    return [
        [
            f"{size:,} notes",
            f"user's first read ({len(first)} users)",
            _f(_pct(first)),
            _f(_pct(warm)),
        ],
        [
            f"{size:,} notes",
            f"first read after a restart ({len(restarted)})",
            _f(_pct(restarted)),
            "",
        ],
        [
            f"{size:,} notes",
            f"the same after warm_scopes({users}) (took {_f(_pct(warm_ups))} ms)",
            _f(_pct(warmed)),
            "",
        ],
    ]


def _scope_cell(svc, q):
    from memory_pipelines.injection.read_filters import RunScope, scope_cells

    return scope_cells(RunScope.of(_ctx(q), svc.get_agent(AGENTS[0])))[0]


def _fill_home(home: Path, notes: int, n: int):
    from memory_pipelines.embeddings import HashEmbedder
    from memory_pipelines.service import MemoryService

    svc = MemoryService.open(home, embedder=HashEmbedder(dim=DIM))
    svc.configure_agent("bench", note_injection_strategy="Relevant")
    for i in range(notes):
        svc.add_note(
            f"Home {n} note {i}: the user prefers option {i % 17} for topic {i % 29}.",
            agent_id="bench",
            user_id=f"u{i % 5}",
        )
    return svc


def fresh_home_first_injects(homes: int, notes: int, say: Say) -> list[list]:
    """Rows: a fresh home's first inject (as written), the same read from the table, and
    warm, over ``homes`` homes."""
    from memory_pipelines.injection import inject
    from memory_pipelines.injection.cache import read_cache
    from memory_pipelines.notes import RunContext

    first, scanned, warm = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-cold-") as tmp:
        for n in range(homes):
            svc = _fill_home(Path(tmp) / f"home{n}", notes, n)
            try:
                ctx = RunContext(agent_id="bench", user_id="u0", run_id=f"run-{n}")
                vector = svc.embed(["which option does the user prefer?"])[0]
                # what any first inject of a process pays once (the judge, the audit
                # statements) paid by an agent without notes, before timing
                svc.configure_agent("warm-up")
                inject(
                    svc.context,
                    RunContext(agent_id="warm-up", run_id="w"),
                    "warm up",
                    query_vector=vector,
                )

                def once(text: str, svc=svc, ctx=ctx, vector=vector) -> None:
                    inject(svc.context, ctx, text, query_vector=vector)

                first.append(_ms(lambda: once("which option does the user prefer?")))
                read_cache(svc.store.notes).clear()
                svc.store.notes.journal.clear()  # as a process that did not write them
                scanned.append(_ms(lambda: once("which option, read from the table?")))
                warm.append(_ms(lambda: once("which option, again?")))
            finally:
                svc.close()
    say(f"{homes} fresh homes measured")
    label = f"fresh {notes}-note home ({homes} homes)"
    return [
        [label, "first inject", _f(_pct(first)), _f(_pct(warm))],
        [label, "first inject, scopes read from the table", _f(_pct(scanned)), ""],
    ]


HEADERS = ["store", "measure", "p50 / p95 ms", "same run: warm p50 / p95 ms"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="memory-pipelines bench cold", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--sizes", type=int, nargs="*", default=[100_000], help="notes per store (none: skip)"
    )
    parser.add_argument(
        "--users", type=int, default=20, help="users whose first read is timed, per size"
    )
    parser.add_argument("--restarts", type=int, default=3, help="close/open cycles per size")
    parser.add_argument("--homes", type=int, default=10, help="fresh homes (0: skip)")
    parser.add_argument(
        "--notes", type=int, default=500, help="single add_note calls per fresh home"
    )
    parser.add_argument(
        "--store-dir", type=Path, default=None, help="keep and reuse each size's store here"
    )
    args = parser.parse_args(argv)
    say: Say = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    rows: list[list] = []
    for size in args.sizes:
        with tempfile.TemporaryDirectory(prefix="bench-cold-") as tmp:
            home = (args.store_dir / f"inject-{size}") if args.store_dir else Path(tmp) / "home"
            rows += scope_first_reads(size, args.users, args.restarts, home, say)
    if args.homes > 0:
        rows += fresh_home_first_injects(args.homes, args.notes, say)
    print(
        "cold reads: inject with the query vector given (embedding excluded), k=5;"
        f" load average {load:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(tabulate(rows, headers=HEADERS, tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
