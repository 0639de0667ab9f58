"""Memory Manager cycle timings: hardening a provisional backlog, and a cycle on the demo store.

``memory-pipelines bench cycle [--provisional 1000] [--active 500] [--duplicates 0.2]
[--max-per-run 200] [--embedder minilm|hash] [--skip-demo]``

1. **Backlog**: a temporary home with ``--active`` Active notes and ``--provisional``
   agent-written Provisional notes across 3 agents x 20 users (a ``--duplicates``
   fraction are near-exact restatements of an Active note of the same scope, so the
   offline judge archives them). Hardening runs as the cycle does, ``--max-per-run``
   oldest notes per call (reference: 200), until the backlog is empty; every call and the
   total are timed. Then one full ``run_cycle`` (fold, extraction, hardening and the
   maintenance it triggers) on the hardened store.
2. **Demo store**: the ``memory-pipelines demo`` seed in a temporary home, then one
   ``run_cycle`` in process (no Dagster) and a second, idle one.

The embedder is the offline MiniLM by default (real semantics; its cache is per home, so
nothing is reused between runs); the judge is the offline one.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from tabulate import tabulate

from memory_pipelines.bench.embed import make_sentences
from memory_pipelines.clock import FakeClock
from memory_pipelines.config import ManagerConfig
from memory_pipelines.embeddings import HashEmbedder, MiniLMEmbedder, model_available
from memory_pipelines.memory_manager import DEFAULT_CONFIG, MemoryManager
from memory_pipelines.notes import Note
from memory_pipelines.service import MemoryService

AGENTS = ("code-helper", "support-desk", "travel-planner")
USERS = tuple(f"user-{i:02d}" for i in range(20))


def _restate(text: str, rng: random.Random) -> str:
    """A near-exact restatement the offline judge calls a duplicate (case, spacing, a
    trailing period)."""
    variants = (text.upper(), f"  {text}  ", text.rstrip(".") + ".", text.lower())
    return rng.choice(variants)


def seed_backlog(
    svc: MemoryService, provisional: int, active: int, duplicates: float, seed: int = 7
) -> dict[str, int]:
    """Active notes plus a Provisional backlog (some of it duplicates), timestamps spread."""
    rng = random.Random(seed)
    now = svc.now()
    texts = make_sentences(active + provisional, seed=seed)
    scopes = [(a, u, "acme" if i % 2 else "globex") for a in AGENTS for i, u in enumerate(USERS)]
    actives = []
    for k, text in enumerate(texts[:active]):
        agent, user, company = scopes[k % len(scopes)]
        actives.append(
            Note(note=text, agent_id=agent, user_id=user, company_id=company, author_type="Agent",
                 created_at=now.replace(microsecond=0) - timedelta(days=30 - k % 30))
        )  # fmt: skip
    backlog = []
    dup_count = 0
    for k, text in enumerate(texts[active:]):
        if actives and rng.random() < duplicates:
            source = rng.choice(actives)
            text, scope = (
                _restate(source.note, rng),
                (source.agent_id, source.user_id, source.company_id),
            )
            dup_count += 1
        else:
            scope = scopes[rng.randrange(len(scopes))]
        backlog.append(
            Note(note=text.strip(), agent_id=scope[0], user_id=scope[1], company_id=scope[2],
                 status="Provisional", author_type="Agent", created_at=now - timedelta(days=7) + timedelta(seconds=k),
                 expires_at=now + timedelta(days=7))
        )  # fmt: skip
    svc.save_notes(actives + backlog)
    return {"active": len(actives), "provisional": len(backlog), "near-duplicates": dup_count}


def _embedder(name: str):
    if name == "hash":
        return HashEmbedder(dim=384)
    if not model_available():
        raise SystemExit("the MiniLM weights are missing: run `memory-pipelines fetch-model`")
    return MiniLMEmbedder()


def bench_backlog(args: argparse.Namespace, embedder: Any) -> list[list[Any]]:
    rows: list[list[Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        clock = FakeClock()
        with MemoryService.open(Path(tmp) / "home", embedder=embedder, clock=clock) as svc:
            for agent in AGENTS:
                svc.configure_agent(agent)
            t0 = time.perf_counter()
            seeded = seed_backlog(svc, args.provisional, args.active, args.duplicates)
            rows.append(["seed (embed + save)", round(time.perf_counter() - t0, 2), str(seeded)])
            manager = MemoryManager(svc.context, ManagerConfig(hardening_max_notes=args.max_per_run))
            total = 0.0
            calls = 0
            totals = {"hardened": 0, "deduped": 0, "failed": 0}
            while True:
                t0 = time.perf_counter()
                report = manager.harden()
                took = time.perf_counter() - t0
                if not report["provisionalCount"]:
                    break
                calls += 1
                total += took
                for k in totals:
                    totals[k] += report[k]
                rows.append(
                    [f"harden call {calls}", round(took, 2),
                     f"{report['provisionalCount']} notes, {1000 * took / report['provisionalCount']:.1f} ms/note, "
                     f"hardened {report['hardened']}, deduped {report['deduped']}, failed {report['failed']}"]
                )  # fmt: skip
                clock.advance(seconds=1)
            rows.append(
                [f"harden total ({calls} calls of ≤{args.max_per_run})", round(total, 2),
                 f"{args.provisional} notes, {1000 * total / max(args.provisional, 1):.1f} ms/note, {totals}"]
            )  # fmt: skip
            t0 = time.perf_counter()
            report = svc.manager.run_cycle()
            rows.append(
                ["run_cycle after the backlog", round(time.perf_counter() - t0, 2),
                 f"maintenance {report.get('maintenanceTrigger')}: ran={report.get('maintenanceRan')}"]
            )  # fmt: skip
    return rows


def bench_fresh_cycle(args: argparse.Namespace, embedder: Any) -> list[list[Any]]:
    """One run_cycle that hardens a fresh backlog with the reference cap (200)."""
    rows: list[list[Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        with MemoryService.open(Path(tmp) / "home", embedder=embedder, clock=FakeClock()) as svc:
            for agent in AGENTS:
                svc.configure_agent(agent)
            seed_backlog(svc, args.provisional, args.active, args.duplicates)
            t0 = time.perf_counter()
            report = svc.manager.run_cycle()
            took = time.perf_counter() - t0
            rows.append(
                [f"run_cycle with {args.provisional} provisional (cap {DEFAULT_CONFIG.hardening_max_notes})",
                 round(took, 2),
                 f"hardened {report['hardened']}, deduped {report['deduped']}, maintenance ran="
                 f"{report.get('maintenanceRan')} ({report.get('maintenanceTrigger')})"]
            )  # fmt: skip
    return rows


def bench_demo(embedder: Any) -> list[list[Any]]:
    from memory_pipelines.apps.demo import seed

    rows: list[list[Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        with MemoryService.open(Path(tmp) / "home", embedder=embedder) as svc:
            t0 = time.perf_counter()
            seeded = seed(svc)
            rows.append(
                ["demo seed", round(time.perf_counter() - t0, 2), f"{seeded['messages']} messages"]
            )
            for label in ("demo run_cycle (first)", "demo run_cycle (idle)"):
                t0 = time.perf_counter()
                report = svc.manager.run_cycle()
                rows.append(
                    [label, round(time.perf_counter() - t0, 2),
                     f"notes created {report['notesCreated']}, examples {report['examplesCreated']}, "
                     f"hardened {report['hardened']}, deduped {report['deduped']}, "
                     f"maintenance {report.get('maintenanceTrigger')}"]
                )  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    """``memory-pipelines bench cycle``: time hardening and whole cycles (see module doc)."""
    parser = argparse.ArgumentParser(prog="memory-pipelines bench cycle", description=main.__doc__)
    parser.add_argument("--provisional", type=int, default=1000, help="provisional notes to harden")
    parser.add_argument("--active", type=int, default=500, help="Active notes already stored")
    parser.add_argument("--duplicates", type=float, default=0.2, help="share of near-duplicates")
    parser.add_argument("--max-per-run", type=int, default=DEFAULT_CONFIG.hardening_max_notes)
    parser.add_argument("--embedder", choices=("minilm", "hash"), default="minilm")
    parser.add_argument("--skip-demo", action="store_true", help="skip the demo-store cycle")
    args = parser.parse_args(argv)
    embedder = _embedder(args.embedder)
    rows = bench_backlog(args, embedder)
    rows += bench_fresh_cycle(args, embedder)
    if not args.skip_demo:
        rows += bench_demo(embedder)
    print(tabulate(rows, headers=["measure", "seconds", "detail"], tablefmt="github"))
    return 0
