"""Maintenance phase timings on synthetic pools of 10k and 100k notes.

``memory-pipelines bench maintenance [--sizes 10000 100000] [--dim 384] [--seed 0]``
builds, for each size, a fresh memory home holding a realistic pool, then runs the five
maintenance phases with the offline judge and prints the seconds of each phase, the
total (wall-clock and process CPU seconds: CPU time is the steadier figure on a shared
machine), what each phase did, and the ratio of the largest size's total to the smallest's.

The pool (vectors built directly, never embedded; texts templated so the offline judge
can work on them):

- many agents (``n / 2500``, at least 4), users (``n / 50``) and companies, each note in
  a user scope or an agent-wide scope;
- about 30% of the notes in paraphrase clusters of 3-6 (a random centroid plus
  perturbations, cosine ~0.85 within a cluster), texts "The user prefers X" variants;
- 1% in contradiction pairs ("The deploy day is Friday." / "... Monday.", 10-40 days
  apart, cosine ~0.8);
- 3% stale (deleted users, deleted source conversations, an inactive agent), 2% expired
  provisional notes, 5% human / Protected / Immutable notes, the rest singletons;
- ``n / 20`` examples, some with low success scores or expired;
- creation dates spread over the last 60 days, access counts 0-4.

Only the phases are timed (not building the pool). The embedder (for the text of new
consolidated notes and the offline judge's own comparisons) is the hashing embedder by
default; ``--embedder default`` uses the offline MiniLM model.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from sqlalchemy import insert
from tabulate import tabulate

from memory_pipelines.apps.progress import add_progress_flag
from memory_pipelines.apps.progress import progress as bar
from memory_pipelines.clock import FakeClock
from memory_pipelines.embeddings import HashEmbedder, embedder_from_name
from memory_pipelines.notes import Example, Note, new_id
from memory_pipelines.phases import consolidation, contradictions, decay, importance, pruning
from memory_pipelines.service import MemoryService
from memory_pipelines.sources import companies, conversations, deleted_entities, users

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)

_THINGS = [
    "green tea",
    "dark mode",
    "short answers",
    "Python examples",
    "metric units",
    "CSV exports",
    "morning meetings",
    "email summaries",
    "bullet points",
    "Postgres",
    "Rust",
    "the CLI",
    "weekly reports",
    "Slack updates",
    "code snippets",
    "plain English",
    "video calls",
]
_PARAPHRASES = [
    "The user prefers {x}.",
    "The user likes {x}.",
    "User prefers {x} most of the time.",
    "The user usually prefers {x}.",
    "The user really likes {x}.",
    "The user prefers {x} when possible.",
]
_ATTRS = {
    "deploy day": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"],
    "standup time": ["9am", "10am", "11am", "2pm"],
    "primary database": ["Postgres", "MySQL", "SQLite", "MongoDB"],
    "billing currency": ["EUR", "USD", "GBP", "JPY"],
    "on-call lead": ["Alice", "Bob", "Carol", "Dave"],
}
_FACTS = [
    "Ticket {i} about {x} was closed.",
    "The team reviewed {x} in sprint {i}.",
    "Invoice {i} mentions {x}.",
    "The user asked about {x} on day {i}.",
    "Runbook {i} covers {x}.",
]


def _unit(m: np.ndarray) -> np.ndarray:
    return (m / np.linalg.norm(m, axis=-1, keepdims=True)).astype(np.float32)


class PoolBuilder:
    """Builds one synthetic pool of ``n`` notes into ``svc`` (deterministic for a seed)."""

    def __init__(
        self,
        svc: MemoryService,
        n: int,
        dim: int,
        seed: int,
        progress_bar: bool | None = None,
        n_agents: int | None = None,
    ):
        self.svc, self.n, self.dim = svc, n, dim
        #: tqdm bars on stderr while filling and writing the pool (None: only on a TTY)
        self.progress_bar = progress_bar
        self.rng = np.random.default_rng(seed)
        #: agents ``agent-0`` .. (default: one per 2,500 notes, at least 4)
        self.n_agents = n_agents or max(4, n // 2500)
        self.n_users = max(20, n // 50)
        self.notes: list[Note] = []
        self.vectors: list[np.ndarray] = []

    def _scope(self) -> dict:
        u = int(self.rng.integers(self.n_users))
        agent = f"agent-{u % self.n_agents}"
        if self.rng.random() < 0.1:  # agent-wide note
            return {"agent_id": agent, "user_id": None, "company_id": None}
        return {"agent_id": agent, "user_id": f"user-{u}", "company_id": f"company-{u // 10}"}

    def _age(self, low: float = 0.0, high: float = 60.0) -> datetime:
        return NOW - timedelta(days=float(self.rng.uniform(low, high)))

    def _add(self, text: str, vec: np.ndarray, **fields) -> None:
        created = fields.pop("created_at", None) or self._age()
        fields.setdefault("is_auto_generated", True)
        fields.setdefault("access_count", int(self.rng.integers(0, 5)))
        self.notes.append(
            Note(
                note=text,
                created_at=created,
                updated_at=created,
                embedding_model_id="bench",
                **fields,
            )
        )
        self.vectors.append(vec)

    def build(self) -> dict[str, int]:
        """Fill the pool (every kind of note the phases act on, in a fixed order so a
        seed gives the same pool), then write sources, notes and examples."""
        counts = {
            "clusters": self._clusters(),
            "contradictionPairs": self._contradictions(),
            "stale": self._stale(),
            "expired": self._expired(),
        }
        self._policies()
        self._fillers()
        self._write_sources()
        counts["notes"] = self._write_notes()
        self._write_examples()
        return counts

    def _clusters(self) -> int:
        """Near-duplicate clusters of 3-6 paraphrases (30% of the pool)."""
        rng, dim = self.rng, self.dim
        clusters = 0
        while len(self.notes) < int(self.n * 0.30):
            size = int(rng.integers(3, 7))
            scope = self._scope()
            centroid = _unit(rng.normal(size=dim))
            thing = f"{_THINGS[int(rng.integers(len(_THINGS)))]} for project {int(rng.integers(10_000))}"
            for k in range(size):
                noise = _unit(rng.normal(size=dim))
                self._add(
                    _PARAPHRASES[k % len(_PARAPHRASES)].format(x=thing),
                    _unit(centroid + 0.4 * noise),
                    **scope,
                )
            clusters += 1
        return clusters

    def _contradictions(self) -> int:
        """Pairs of notes giving one attribute two values, 8-10 days apart."""
        rng, dim = self.rng, self.dim
        pairs = int(self.n * 0.005)
        for _ in range(pairs):
            scope = self._scope()
            attr = list(_ATTRS)[int(rng.integers(len(_ATTRS)))]
            v1, v2 = rng.choice(_ATTRS[attr], size=2, replace=False)
            centroid = _unit(rng.normal(size=dim))
            old = self._age(10, 40)
            self._add(
                f"The {attr} is {v1}.",
                _unit(centroid + 0.5 * _unit(rng.normal(size=dim))),
                created_at=old,
                **scope,
            )
            self._add(
                f"The {attr} is {v2}.",
                _unit(centroid + 0.5 * _unit(rng.normal(size=dim))),
                created_at=old + timedelta(days=float(rng.uniform(8, 10))),
                **scope,
            )
        return pairs

    def _stale(self) -> int:
        """Notes of deleted users, retired agents and deleted conversations (3%)."""
        stale = int(self.n * 0.03)
        for i in range(stale):
            scope = self._scope()
            kind = i % 3
            if kind == 0:
                scope = {**scope, "user_id": f"deleted-user-{i}"}
            elif kind == 1:
                scope = {**scope, "agent_id": "agent-retired", "user_id": None}
            self._add(
                f"Stale note {i} about {_THINGS[i % len(_THINGS)]}.",
                _unit(self.rng.normal(size=self.dim)),
                source_conversation_id=f"deleted-conv-{i}" if kind == 2 else None,
                **scope,
            )
        return stale

    def _expired(self) -> int:
        """Provisional agent notes already past their expiry (2%)."""
        expired = int(self.n * 0.02)
        for i in range(expired):
            self._add(
                f"Temporary note {i}: the user is travelling.",
                _unit(self.rng.normal(size=self.dim)),
                status="Provisional",
                author_type="Agent",
                expires_at=NOW - timedelta(days=float(self.rng.uniform(0.1, 5))),
                **self._scope(),
            )
        return expired

    def _policies(self) -> None:
        """User-written policy notes across the protection tiers (5%)."""
        for i in range(int(self.n * 0.05)):
            tier = ("Protected", "Immutable", "Standard")[i % 3]
            self._add(
                f"Policy {i}: always confirm {_THINGS[i % len(_THINGS)]}.",
                _unit(self.rng.normal(size=self.dim)),
                is_auto_generated=False,
                author_type="User",
                protection_tier=tier,
                **self._scope(),
            )

    def _fillers(self) -> None:
        """Plain facts up to the pool's size."""
        n = self.n
        for i in bar(
            range(max(0, n - len(self.notes))),
            desc=f"pool {n}: fill notes",
            enabled=self.progress_bar,
        ):
            template = _FACTS[i % len(_FACTS)]
            self._add(
                template.format(i=i, x=_THINGS[i % len(_THINGS)]),
                _unit(self.rng.normal(size=self.dim)),
                **self._scope(),
            )

    def _write_notes(self) -> int:
        """The pool's notes in a shuffled order, appended in batches; how many."""
        order = self.rng.permutation(len(self.notes))
        notes = [self.notes[k] for k in order]
        vecs = np.stack([self.vectors[k] for k in order])
        for start in bar(
            range(0, len(notes), 10_000),
            desc=f"pool {self.n}: write notes",
            enabled=self.progress_bar,
        ):
            self.svc.store.notes.add(notes[start : start + 10_000], vecs[start : start + 10_000])
        return len(notes)

    def _write_sources(self) -> None:
        svc = self.svc
        for a in range(self.n_agents):
            svc.configure_agent(f"agent-{a}")
        svc.configure_agent("agent-retired", status="Inactive")
        with svc.sources.begin() as conn:
            conn.execute(
                insert(companies),
                [
                    {"company_id": f"company-{c}", "created_at": NOW}
                    for c in range(self.n_users // 10 + 1)
                ],
            )
            conn.execute(
                insert(users),
                [
                    {"user_id": f"user-{u}", "company_id": f"company-{u // 10}", "created_at": NOW}
                    for u in range(self.n_users)
                ],
            )
            conn.execute(
                insert(conversations),
                [
                    {
                        "conversation_id": f"conv-{c}",
                        "agent_id": "agent-0",
                        "created_at": NOW,
                        "last_activity_at": NOW,
                    }
                    for c in range(100)
                ],
            )
            # the stale notes' users and conversations were registered and later deleted
            # (pruning archives only those, CONTRACT §2.9)
            stale = int(self.n * 0.03)
            conn.execute(
                insert(deleted_entities),
                [
                    {"kind": "user", "id": f"deleted-user-{i}", "deleted_at": NOW}
                    for i in range(0, stale, 3)
                ]
                + [
                    {"kind": "conversation", "id": f"deleted-conv-{i}", "deleted_at": NOW}
                    for i in range(2, stale, 3)
                ],
            )

    def _write_examples(self) -> None:
        rng = self.rng
        examples = []
        for i in range(self.n // 20):
            low = i % 4 == 0
            examples.append(
                Example(
                    id=new_id(),
                    agent_id=f"agent-{i % self.n_agents}",
                    example_input=f"How do I export report {i}?",
                    example_output="Use the CSV export in the reports menu.",
                    success_score=float(rng.uniform(5, 45)) if low else float(rng.uniform(70, 100)),
                    is_auto_generated=True,
                    access_count=int(rng.integers(0, 3)),
                    created_at=self._age(),
                    expires_at=NOW - timedelta(days=1) if i % 50 == 0 else None,
                )
            )
        vecs = _unit(rng.normal(size=(len(examples), self.dim)))
        for start in range(0, len(examples), 10_000):
            self.svc.store.examples.add(
                examples[start : start + 10_000], vecs[start : start + 10_000]
            )


PHASE_FUNCS = [
    ("importance", importance.run, "notesScored"),
    ("consolidation", consolidation.run, "consolidatedClusterCount"),
    ("contradictions", contradictions.run, "contradictionsResolved"),
    ("pruning", pruning.run, "notesArchived"),
    ("decay", decay.run, "notesArchived"),
]


def run_size(
    n: int,
    dim: int,
    seed: int,
    embedder_name: str,
    home: Path,
    progress_bar: bool | None = None,
) -> dict:
    """Build a pool of ``n`` notes in ``home`` and time each maintenance phase
    (``progress_bar``: pool-generation bars on stderr; None: only on a TTY)."""
    embedder = HashEmbedder(dim) if embedder_name == "hash" else embedder_from_name(embedder_name)
    clock = FakeClock(NOW)
    with MemoryService.open(home, embedder=embedder, clock=clock) as svc:
        t0 = time.perf_counter()
        built = PoolBuilder(svc, n, svc.embedder.dim, seed, progress_bar).build()
        build_s = time.perf_counter() - t0
        run_id = f"bench-{n}"
        seconds: dict[str, float] = {}
        cpu: dict[str, float] = {}
        did: dict[str, object] = {}
        for name, fn, key in PHASE_FUNCS:
            t, c = time.perf_counter(), time.process_time()
            report = fn(svc.context, run_id)
            seconds[name] = time.perf_counter() - t
            cpu[name] = time.process_time() - c
            did[name] = report.get(key)
            if name == "importance":
                did[name] = f"{report['notesScored']} ({report['tierPromotions']} promoted)"
        did["decay"] = (
            f"{report['notesExpired']} expired, {report['notesArchived']} decayed "
            f"(+{report['examplesExpired']}/{report['examplesArchived']} examples)"
        )
        return {
            "n": n,
            "build_s": build_s,
            "seconds": seconds,
            "cpu": cpu,
            "did": did,
            "built": built,
        }


def main(argv: list[str] | None = None) -> int:
    """``memory-pipelines bench maintenance``: seconds per maintenance phase by pool size."""
    parser = argparse.ArgumentParser(
        prog="memory-pipelines bench maintenance", description=main.__doc__
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--dim", type=int, default=384, help="vector width (default 384, MiniLM's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--embedder", default="hash", help="'hash' (default) or 'default' (MiniLM)")
    parser.add_argument("--home", type=Path, default=None, help="keep the pools under this folder")
    add_progress_flag(parser)
    args = parser.parse_args(argv)

    rows, results = [], []
    base = args.home or Path(tempfile.mkdtemp(prefix="bench-maintenance-"))
    try:
        for n in args.sizes:
            res = run_size(n, args.dim, args.seed, args.embedder, base / f"pool-{n}", args.progress)
            results.append(res)
            for label, key in (("wall s", "seconds"), ("cpu s", "cpu")):
                s = res[key]
                rows.append(
                    [
                        n,
                        label,
                        *(round(s[name], 2) for name, _, _ in PHASE_FUNCS),
                        round(sum(s.values()), 2),
                    ]
                )
            did = res["did"]
            print(
                f"n={n}: built in {res['build_s']:.1f}s ({res['built']}); scored {did['importance']}, "
                f"consolidated {did['consolidation']} clusters, resolved {did['contradictions']} "
                f"contradictions, pruned {did['pruning']}, {did['decay']}",
                flush=True,
            )
    finally:
        if args.home is None:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print(tabulate(rows, headers=["notes", "time", *(name for name, _, _ in PHASE_FUNCS), "total"]))
    if len(results) >= 2:
        small, large = results[0], results[-1]
        for label, key in (("wall", "seconds"), ("cpu", "cpu")):
            ratio = sum(large[key].values()) / max(1e-9, sum(small[key].values()))
            print(
                f"{large['n']}/{small['n']} {label}-time ratio: {ratio:.1f}"
                f" (size ratio {large['n'] / small['n']:.0f})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
