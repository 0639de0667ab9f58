"""Retrieval quality of ``inject`` on a LoCoMo-format file, beside BM25 and dense baselines.

``memory-pipelines bench locomo --data FILE [--k 5 10] [--limit-conversations N]
[--embedder minilm|hash] [--embedding-cache PATH] [--set FIELD=VALUE ...] [--ablation]``

Protocol (retrieval only, no LLM; see the data set's README): each conversation is one
user scope of one agent (user = ``sample_id``); each turn becomes an Active note
``"Speaker: text"`` (plus ``" [shares photo: caption]"`` when the turn has a caption) with
``source_conversation_detail_id`` = the turn's ``dia_id``, ``source_conversation_id`` =
``"<sample_id>/session_<n>"`` (each LoCoMo session is one chat) and ``created_at`` = the
session date. Every question of categories 1-4 is one ``inject(ctx, current_input=
question)`` with the agent's strategy ``Relevant`` and ``max_notes_to_inject = max(k)``:
the product path with its default :class:`~memory_pipelines.injection.InjectConfig`
(``--set`` overrides a field, for ablations). recall_any@k is the share of questions with
at least one evidence turn among the first k injected notes, recall_all@k the share with
all of them. Baselines computed in the same run over the same notes and scopes: Okapi
BM25 in numpy (k1 1.2, b 0.75), LanceDB full-text search alone, and dense MiniLM cosine
alone. Inject latency (query embedding included) is reported as p50/p95.

``--format chat`` measures the file's chat view instead
(:func:`~memory_pipelines.bench.locomo_data.chat_sample`): ``user`` and ``assistant`` turns,
the assistant's joined ``--chat-join`` at a time into long ones, and questions in the first
and second person. Each question is asked at its conversation's last session (the service
clock's time while it is asked), so the question's relative time phrases resolve as the
user would mean them.

``--cv`` (with ``--cv-grid`` settings to choose from) runs nested leave-one-conversation-out
(:func:`nested_cross_validate`) and says, per fold, whether the held-out conversation was
read while the cues were written (:data:`~memory_pipelines.bench.locomo_data.READ_WHILE_WRITING`):
such a figure is an upper estimate, not a held-out one. With the learned ranker on (the
default, MiniLM) it also runs the ranker's own nested protocol, refitting it in each outer
fold (:mod:`memory_pipelines.bench.ranker`), since the shipped one has seen every fold.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from tabulate import tabulate

from memory_pipelines.apps.progress import add_progress_flag
from memory_pipelines.apps.progress import progress as bar
from memory_pipelines.bench.locomo_cv import (
    FIXED_SPLIT,
    NESTED_PROTOCOL,
    Fold,
    NestedFold,
    _axes,
    _print_cv,
    cross_validate,
    fold_table,
    leave_one_out,
    nested_cross_validate,
    nested_table,
)
from memory_pipelines.bench.locomo_data import (
    AGENT_ID,
    CATEGORIES,
    CHAT_JOIN,
    FORMATS,
    Conversation,
    add_data_arguments,
    load_conversations,
    turn_notes,
)
from memory_pipelines.bench.ranker_cv import RecordedQuestion, nested_beside
from memory_pipelines.config import InjectConfig
from memory_pipelines.embeddings import CachedEmbedder, Embedder, HashEmbedder, MiniLMEmbedder
from memory_pipelines.errors import ValidationError
from memory_pipelines.injection.learned import ranker_for, recorded_pools
from memory_pipelines.notes import RunContext
from memory_pipelines.store import and_, eq
from memory_pipelines.text import terms

#: the cross-validation lives in :mod:`memory_pipelines.bench.locomo_cv`; named here too
__all__ = [
    "FIXED_SPLIT",
    "NESTED_PROTOCOL",
    "Fold",
    "NestedFold",
    "cross_validate",
    "fold_table",
    "leave_one_out",
    "main",
    "nested_cross_validate",
    "nested_table",
    "run_locomo",
]


class BM25:
    """Plain Okapi BM25 (k1 1.2, b 0.75) over term lists, in numpy."""

    def __init__(self, docs: Sequence[Sequence[str]], k1: float = 1.2, b: float = 0.75):
        self.vocab: dict[str, int] = {}
        rows, cols, vals = [], [], []
        for d, doc in enumerate(docs):
            for term, tf in Counter(doc).items():
                rows.append(d)
                cols.append(self.vocab.setdefault(term, len(self.vocab)))
                vals.append(tf)
        n = len(docs)
        lengths = np.array([len(d) for d in docs], dtype=np.float64)
        avg = lengths.mean() if n else 1.0
        tf = np.zeros((n, len(self.vocab)), dtype=np.float64)
        tf[rows, cols] = vals
        df = (tf > 0).sum(axis=0)
        idf = np.log1p((n - df + 0.5) / (df + 0.5))
        denom = tf + k1 * (1 - b + b * lengths[:, None] / max(avg, 1e-9))
        self.weights = idf * tf * (k1 + 1) / np.where(denom > 0, denom, 1.0)

    def scores(self, query: Sequence[str]) -> np.ndarray:
        idx = sorted({self.vocab[t] for t in query if t in self.vocab})
        if not idx:
            return np.zeros(self.weights.shape[0])
        return self.weights[:, idx].sum(axis=1)


def _top(scores: np.ndarray, k: int) -> list[int]:
    return [int(i) for i in np.argsort(-scores, kind="stable")[:k]]


@dataclass
class MethodResult:
    """Retrieved evidence hits per question for one method."""

    name: str
    hits_any: dict[int, list[tuple[int, bool]]] = field(default_factory=dict)
    hits_all: dict[int, list[tuple[int, bool]]] = field(default_factory=dict)
    #: the conversation (sample_id) of each question, in the order of the hit lists
    samples: list[str] = field(default_factory=list)

    def add(
        self,
        category: int,
        retrieved: Sequence[str | Sequence[str]],
        evidence: Sequence[str],
        ks: Sequence[int],
        sample_id: str = "",
    ) -> None:
        """One question's hits; a retrieved item is a turn id or the ids a joined turn
        stands for."""
        ev = set(evidence)
        self.samples.append(sample_id)
        for k in ks:
            got = {i for r in retrieved[:k] for i in ((r,) if isinstance(r, str) else r)}
            self.hits_any.setdefault(k, []).append((category, bool(ev & got)))
            self.hits_all.setdefault(k, []).append((category, ev <= got))

    def recall(
        self,
        k: int,
        category: int | None = None,
        kind: str = "any",
        samples: Collection[str] | None = None,
    ) -> float:
        """Share of questions (of ``category``, of the conversations ``samples``) hit at k."""
        rows = (self.hits_any if kind == "any" else self.hits_all).get(k, [])
        vals = [
            ok
            for (c, ok), sid in zip(rows, self.samples, strict=True)
            if (category is None or c == category) and (samples is None or sid in samples)
        ]
        return sum(vals) / len(vals) if vals else float("nan")

    def count(self, category: int | None = None, samples: Collection[str] | None = None) -> int:
        """How many questions (of ``category``, of the conversations ``samples``) it has."""
        rows = next(iter(self.hits_any.values()), [])
        return sum(
            1
            for (c, _), sid in zip(rows, self.samples, strict=True)
            if (category is None or c == category) and (samples is None or sid in samples)
        )


@dataclass
class LocomoResult:
    """Everything one run measured."""

    ks: tuple[int, ...]
    methods: list[MethodResult]
    counts: dict[int, int]
    latencies_ms: list[float]
    notes: int
    skipped_questions: int
    load_seconds: float

    def method(self, name: str) -> MethodResult:
        return next(m for m in self.methods if m.name == name)

    def table(self, names: Collection[str] | None = None) -> str:
        """Recall per method (of ``names``; None: all) and category."""
        headers = ["method", "category", "n"]
        for k in self.ks:
            headers += [f"any@{k}", f"all@{k}"]
        rows = []
        cats: list[int | None] = [None, *sorted(self.counts)]
        for m in self.methods:
            if names is not None and m.name not in names:
                continue
            for c in cats:
                row: list[Any] = [m.name, "overall" if c is None else f"{c} {CATEGORIES[c]}"]
                row.append(sum(self.counts.values()) if c is None else self.counts[c])
                for k in self.ks:
                    row += [f"{m.recall(k, c, 'any'):.3f}", f"{m.recall(k, c, 'all'):.3f}"]
                rows.append(row)
        return tabulate(rows, headers=headers, tablefmt="github")

    def latency(self) -> tuple[float, float]:
        lat = sorted(self.latencies_ms)
        if not lat:
            return (float("nan"), float("nan"))
        p95 = lat[min(len(lat) - 1, math.ceil(0.95 * len(lat)) - 1)]
        return (statistics.median(lat), p95)


def run_locomo(
    data: Path | str,
    *,
    ks: Sequence[int] = (5, 10),
    limit_conversations: int | None = None,
    embedder: Embedder | None = None,
    inject_config: InjectConfig | None = None,
    ablations: Sequence[tuple[str, InjectConfig]] = (),
    home: Path | None = None,
    batch_size: int = 512,
    progress: Callable[[str], None] | None = None,
    progress_bar: bool | None = None,
    format: str = "locomo",
    chat_join: int = CHAT_JOIN,
    time_probe: bool = False,
    record: list[RecordedQuestion] | None = None,
) -> LocomoResult:
    """Load the file (``format="chat"``: its chat view) into a fresh memory home, run every
    question through ``inject`` and the baselines, and return the recalls and latencies.
    Each conversation's questions are asked at its last session's time (the service clock).

    ``progress_bar``: tqdm bars on stderr for loading and querying (None: only on a TTY).
    ``record``: each question's fused candidates, as ``inject`` ranked them before the
    learned ranker and the coverage step, are appended to it (what ``bench ranker`` fits)."""
    from memory_pipelines.service import MemoryService

    ks = tuple(sorted(set(int(k) for k in ks)))
    if not ks or ks[0] < 1:
        raise ValidationError("k must be positive")
    say = progress or (lambda _msg: None)
    convs = load_conversations(
        data, limit_conversations, format=format, chat_join=chat_join, time_probe=time_probe
    )
    embedder = embedder or MiniLMEmbedder()
    clock = QuestionClock()
    with tempfile.TemporaryDirectory(prefix="locomo-bench-") as tmp:
        root = Path(home) if home else Path(tmp)
        svc = MemoryService.open(
            root / "home", embedder=embedder, inject_config=inject_config, clock=clock
        )
        try:
            svc.configure_agent(
                AGENT_ID,
                max_notes_to_inject=max(ks),
                note_injection_strategy="Relevant",
                inject_notes=True,
                inject_examples=False,
            )
            t0 = time.perf_counter()
            n_notes = _load(svc, convs, batch_size, say, progress_bar)
            load_seconds = time.perf_counter() - t0
            svc.store.notes.ensure_fts()
            methods = [MethodResult("inject (hybrid)")]
            methods += [MethodResult(f"inject [{name}]") for name, _ in ablations]
            methods += [
                MethodResult(n) for n in ("bm25 (numpy)", "fts (LanceDB)", "dense (cosine)")
            ]
            counts: Counter[int] = Counter()
            latencies: list[float] = []
            skipped = 0
            for conv in convs:
                clock.at = max((t.created_at for t in conv.turns), default=None)
                try:
                    skipped += _query(
                        svc, conv, methods, ablations, ks, counts, latencies, progress_bar, record
                    )
                finally:
                    clock.at = None
                say(f"queried {conv.sample_id}: {len(conv.questions)} questions")
        finally:
            svc.close()
    return LocomoResult(ks, methods, dict(counts), latencies, n_notes, skipped, load_seconds)


def record_questions(
    data: Path | str,
    view: str,
    embedder: Embedder,
    limit_conversations: int | None = None,
    inject_config: InjectConfig | None = None,
    progress_bar: bool | None = False,
    ks: Sequence[int] = (10,),
) -> list[RecordedQuestion]:
    """Load ``view`` of the file into a fresh home and ask its questions (``max(ks)`` notes
    each), the learned ranker off; each question's fused candidates as ``inject`` ranked
    them (what the ranker is fitted and measured on)."""
    recorded: list[RecordedQuestion] = []
    run_locomo(
        data,
        ks=ks,
        limit_conversations=limit_conversations,
        embedder=embedder,
        inject_config=replace(inject_config or InjectConfig(), learned_ranker=False),
        format=view,
        record=recorded,
        progress_bar=progress_bar,
    )
    return recorded


class QuestionClock:
    """The benchmark's service clock: the wall clock, or ``at`` while a conversation's
    questions are asked (its last session's time: the question's "now")."""

    def __init__(self) -> None:
        self.at: datetime | None = None

    def __call__(self) -> datetime:
        return self.at or datetime.now(UTC)


def _load(
    svc: Any,
    convs: Sequence[Conversation],
    batch_size: int,
    say: Callable[[str], None],
    progress_bar: bool | None,
) -> int:
    """Save every conversation's turn notes; the number saved."""
    n_notes = 0
    for conv in bar(convs, desc="locomo: load notes", enabled=progress_bar):
        notes = turn_notes(conv)
        for start in range(0, len(notes), batch_size):
            svc.save_notes(notes[start : start + batch_size])
        n_notes += len(notes)
        say(f"loaded {conv.sample_id}: {len(notes)} notes")
    return n_notes


def _query(
    svc: Any,
    conv: Conversation,
    methods: Sequence[MethodResult],
    ablations: Sequence[tuple[str, InjectConfig]],
    ks: Sequence[int],
    counts: Counter[int],
    latencies: list[float],
    progress_bar: bool | None,
    record: list[RecordedQuestion] | None = None,
) -> int:
    """Ask every question of ``conv`` of inject (and each ablation) and of the baselines,
    adding the hits to ``methods`` (and the fused candidates to ``record``); the number of
    questions skipped (no evidence)."""
    scope = and_(eq("agent_id", AGENT_ID), eq("user_id", conv.sample_id))
    frame, vectors = svc.store.notes.scan_with_vectors(
        scope, columns=["id", "note", "source_conversation_detail_id"]
    )
    stands_for = {t.dia_id: t.evidence_ids for t in conv.turns}
    dia = [stands_for.get(d, (d,)) for d in frame["source_conversation_detail_id"]]
    bm25 = BM25([terms(t) for t in frame["note"]])
    ctx = RunContext(agent_id=AGENT_ID, user_id=conv.sample_id)
    skipped = 0
    desc = f"locomo: {conv.sample_id} questions"
    for q in bar(conv.questions, desc=desc, enabled=progress_bar):
        if not q.evidence:
            skipped += 1
            continue
        counts[q.category] += 1

        def add(m: MethodResult, retrieved: Sequence[Any], q: Any = q) -> None:
            ids = [stands_for.get(r, (r,)) if isinstance(r, str) else r for r in retrieved]
            m.add(q.category, ids, q.evidence, ks, conv.sample_id)

        t1 = time.perf_counter()
        with recorded_pools() as pools:
            got = svc.inject(ctx, q.text)
        latencies.append((time.perf_counter() - t1) * 1000)
        if record is not None and pools:
            record.append(RecordedQuestion(conv.sample_id, q, pools[0][1], stands_for))
        add(methods[0], [n.source_conversation_detail_id for n in got.notes])
        qvec = svc.embed([q.text])[0]
        for m, (_, cfg) in zip(methods[1 : 1 + len(ablations)], ablations, strict=True):
            saved = svc.inject_config
            svc.inject_config = cfg
            try:
                alt = svc.inject(ctx, q.text)
            finally:
                svc.inject_config = saved
            add(m, [n.source_conversation_detail_id for n in alt.notes])
        base = 1 + len(ablations)
        add(methods[base], [dia[i] for i in _top(bm25.scores(terms(q.text)), max(ks))])
        fts = svc.store.notes.text_search(q.text, where=scope, k=max(ks))
        add(methods[base + 1], [h.item.source_conversation_detail_id for h in fts])
        add(methods[base + 2], [dia[i] for i in _top(vectors @ qvec, max(ks))])
    return skipped


def _grid(specs: Sequence[str], base: InjectConfig) -> list[tuple[str, InjectConfig]]:
    """``["text_weight=0.5,0.6", "context_weight=0,0.2"]`` -> every combination as a named
    config (``text_weight`` also sets ``vector_weight`` to 1 - it)."""
    axes: list[tuple[str, list[str]]] = []
    for spec in specs:
        key, _, values = spec.partition("=")
        if not values:
            raise SystemExit("--cv-grid expects FIELD=V1,V2,...")
        axes.append((key, [v for v in values.split(",") if v]))
    combos: list[list[tuple[str, str]]] = [[]]
    for key, values in axes:
        combos = [c + [(key, v)] for c in combos for v in values]
    out = []
    for combo in combos:
        fields_ = _overrides([f"{k}={v}" for k, v in combo])
        if "text_weight" in fields_ and "vector_weight" not in fields_:
            fields_["vector_weight"] = round(1.0 - fields_["text_weight"], 6)
        cfg = replace(base, **fields_)
        if cfg != base:
            out.append((" ".join(f"{k}={v}" for k, v in combo), cfg))
    return out


def _overrides(pairs: Sequence[str]) -> dict[str, Any]:
    known = {f.name: f.type for f in fields(InjectConfig)}
    out: dict[str, Any] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key not in known or not value:
            raise SystemExit(f"--set expects FIELD=VALUE with FIELD one of {', '.join(known)}")
        default = getattr(InjectConfig(), key)
        if isinstance(default, bool):
            out[key] = value.lower() in ("1", "true", "yes")
        else:
            out[key] = type(default)(value)
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memory-pipelines bench locomo", description=__doc__.split("\n")[0]
    )
    add_data_arguments(parser)
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override an InjectConfig field",
    )
    parser.add_argument(
        "--ablation",
        action="store_true",
        help="also run inject without the context boost and vector-only/text-only fusion",
    )
    parser.add_argument(
        "--cv",
        action="store_true",
        help="cross-validation by conversation: nested leave-one-conversation-out (each "
        "outer fold's setting chosen by inner leave-one-out folds over the other "
        "conversations; outer per-fold recall_any/recall_all and their mean), then the "
        "single-level folds and the fixed split (tune conv-26, conv-30) for comparison",
    )
    parser.add_argument(
        "--cv-grid",
        action="append",
        default=[],
        metavar="FIELD=V1,V2",
        help="with --cv: InjectConfig values to choose from on the tune folds (repeatable: "
        "every combination; text_weight also sets vector_weight = 1 - it). Default: none, "
        "i.e. today's defaults, the no-tuning baseline",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="locomo",
        help="chat: the file's chat view (user/assistant roles, the assistant's turns "
        "joined into long ones, questions in the first and second person)",
    )
    parser.add_argument(
        "--chat-join",
        type=int,
        default=CHAT_JOIN,
        metavar="N",
        help=f"with --format chat: join the assistant's turns N at a time (0: a whole "
        f"session's; default {CHAT_JOIN})",
    )
    parser.add_argument(
        "--time-probe",
        action="store_true",
        help="add how long ago to the temporal 'When ...' questions with evidence in one "
        "session ('..., about 3 weeks ago?'): a probe of the relative time windows, whose "
        "phrase is right by construction",
    )
    add_progress_flag(parser)
    return parser


def _ablations(cfg: InjectConfig) -> list[tuple[str, InjectConfig]]:
    """``--ablation``: inject without the conversation context, vector only, text only."""
    no_context = {"context_weight": 0.0, "neighbour_weight": 0.0}
    return [
        ("no conversation context", replace(cfg, **no_context)),
        ("vector only", replace(cfg, text_weight=0.0, **no_context)),
        ("text only", replace(cfg, vector_weight=0.0, **no_context)),
    ]


def _print_run(result: LocomoResult, embedder: Embedder, t0: float, fmt: str = "locomo") -> None:
    p50, p95 = result.latency()
    print(
        f"LoCoMo retrieval: {len(result.counts) and sum(result.counts.values())} questions "
        f"(categories 1-4; {result.skipped_questions} without usable evidence skipped), "
        f"{result.notes} notes, embedder {embedder.model_id}, format {fmt}"
    )
    print(result.table())
    print(
        f"\ninject latency (query embedding included): p50 {p50:.1f} ms, p95 {p95:.1f} ms; "
        f"note load {result.load_seconds:.1f} s; total {time.perf_counter() - t0:.1f} s"
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    inner: Embedder = HashEmbedder(64) if args.embedder == "hash" else MiniLMEmbedder()
    embedder: Embedder = (
        CachedEmbedder(inner, args.embedding_cache) if args.embedding_cache else inner
    )
    cfg = InjectConfig(**_overrides(args.overrides))
    ablations = _ablations(cfg) if args.ablation else []
    grid = _grid(args.cv_grid, cfg) if args.cv else []
    ablations += grid
    t0 = time.perf_counter()
    ranked = ranker_for(cfg.learned_ranker, embedder.model_id) is not None
    recorded: list[RecordedQuestion] | None = [] if args.cv and ranked else None
    result = run_locomo(
        args.data,
        ks=args.k,
        limit_conversations=args.limit_conversations,
        embedder=embedder,
        inject_config=cfg,
        ablations=ablations,
        progress=lambda msg: print(msg, file=sys.stderr),
        progress_bar=args.progress,
        format=args.format,
        chat_join=args.chat_join,
        time_probe=args.time_probe,
        record=recorded,
    )
    if args.cv:
        candidates = ["inject (hybrid)", *[f"inject [{name}]" for name, _ in grid]]
        print(
            f"format: {args.format}"
            + (
                f" (assistant turns joined {args.chat_join} at a time)"
                if args.format == "chat"
                else ""
            )
        )
        print("today's defaults and the baselines, per category (all conversations):")
        print(result.table([m.name for m in result.methods if m.name not in candidates[1:]]))
        print()
        _print_cv(result, candidates, _axes(grid, cfg), CATEGORIES)
        if recorded and not args.time_probe and len({r.sample_id for r in recorded}) >= 3:
            record_view = partial(
                record_questions, args.data, embedder=embedder, inject_config=cfg,
                limit_conversations=args.limit_conversations, ks=(max(args.k),),
            )  # fmt: skip
            print(
                "\nthe figures above rank with the shipped learned ranker, fitted on the "
                "dev conversations: for it every fold is read.\n"
                + nested_beside(args.format, recorded, record_view, embedder.model_id, args.k)
            )
        print(f"\ntotal {time.perf_counter() - t0:.1f} s")
        return 0
    _print_run(result, embedder, t0, args.format)
    return 0


if __name__ == "__main__":
    sys.exit(main())
