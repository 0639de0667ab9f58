"""The learned ranker of ``inject``, fitted and measured by nested leave-one-conversation-out
on the LoCoMo format and the chat view of a LoCoMo-format file.

``memory-pipelines bench ranker --data FILE [--k 5 10] [--embedding-cache PATH]
[--embedder minilm|hash] [--fit PATH]``

Both views are loaded as ``bench locomo`` loads them and every question is asked of
``inject``; each question's fused candidates (before the learned ranker and the coverage
step) are recorded with their :data:`~memory_pipelines.injection.learned.FEATURES`, a
candidate being positive when it is one of the question's evidence turns. Nested
protocol: each conversation is held out once (outer fold, in both views); a ranker is
fitted on the other conversations' questions of both views for every setting of the grid
(strength x the coverage step's ``mmr_lambda``), each setting is scored by inner
leave-one-out folds over them (mean recall_any at the first k of the two views), the best
is fitted on all of them and only then scored on the held-out conversation. Beside it, the
fused order with the default coverage step on the same candidates: the ranking without
the learned ranker. ``--fit PATH`` writes a ranker fitted on every conversation, with the
setting chosen by leave-one-out over them all (the shipped ``ranker.json`` is this).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tabulate import tabulate

from memory_pipelines.bench.locomo import RecordedQuestion, run_locomo
from memory_pipelines.config import InjectConfig
from memory_pipelines.embeddings.cache import CachedEmbedder
from memory_pipelines.embeddings.hashing import HashEmbedder
from memory_pipelines.embeddings.minilm import MiniLMEmbedder
from memory_pipelines.embeddings.protocol import Embedder
from memory_pipelines.errors import ValidationError
from memory_pipelines.injection.diversity import diversify
from memory_pipelines.injection.learned import LearnedRanker, features

#: L2 strengths offered (on the mean loss of class-balanced examples)
STRENGTHS = (0.0001, 0.001, 0.01, 0.1)
#: the coverage step's mmr_lambda offered with the ranker (1: off)
MMR_GRID = (1.0, 0.85, 0.7, 0.5, 0.4)
VIEWS = ("locomo", "chat")
Setting = tuple[float, float]


@dataclass(frozen=True)
class Pool:
    """One question's recorded candidates: features, labels, and what each stands for."""

    sample_id: str
    category: int
    x: np.ndarray
    y: np.ndarray
    evidence: frozenset[str]
    covers: list[frozenset[str]]
    texts: list[str]
    created: list[float]
    ids: list[str]
    fused: np.ndarray


def pools_of(recorded: Iterable[RecordedQuestion]) -> list[Pool]:
    """The recorded questions as :class:`Pool` s (a question without candidates is kept:
    it counts as missed)."""
    out = []
    for r in recorded:
        cands = r.candidates
        covers = [
            frozenset(r.stands_for.get(d, (d,)))
            for d in (c.item.source_conversation_detail_id or c.item.id for c in cands)
        ]
        evidence = frozenset(r.question.evidence)
        out.append(
            Pool(
                r.sample_id,
                r.question.category,
                features(r.question.text, cands),
                np.array([bool(c & evidence) for c in covers], dtype=np.float64),
                evidence,
                covers,
                [c.text for c in cands],
                [c.created_ts for c in cands],
                [c.item.id for c in cands],
                np.array([c.score for c in cands], dtype=np.float64),
            )
        )
    return out


def fit_ranker(
    pools: Sequence[Pool], strength: float, model_id: str, mmr_lambda: float = 1.0
) -> LearnedRanker:
    """A logistic regression over the pools' candidates: features scaled to mean 0 and
    spread 1, positives weighted so both classes weigh alike, L2 ``strength`` on the mean
    loss (bias not penalised), fitted by Newton's method."""
    x = np.vstack([p.x for p in pools if len(p.x)])
    y = np.concatenate([p.y for p in pools if len(p.x)])
    if not y.any() or y.all():
        raise ValidationError("the ranker needs both evidence and other candidates to fit")
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    weight = np.where(y > 0, (len(y) - y.sum()) / y.sum(), 1.0)
    weight /= weight.mean() * len(y)
    reg = np.full(z.shape[1], strength)
    reg[-1] = 0.0
    w = np.zeros(z.shape[1])
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-np.clip(z @ w, -30, 30)))
        grad = z.T @ (weight * (p - y)) + reg * w
        hess = (z * (weight * p * (1 - p))[:, None]).T @ z + np.diag(reg) + 1e-9 * np.eye(len(w))
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-7:
            break
    return LearnedRanker(w[:-1], float(w[-1]), mean, scale, model_id, mmr_lambda)


def top(pool: Pool, scores: np.ndarray, k: int, mmr_lambda: float) -> frozenset[str]:
    """The evidence ids the first ``k`` of ``pool`` stand for when ranked by ``scores``
    (ties: newest, then id) and re-picked by the coverage step."""
    order = sorted(range(len(pool.ids)), key=lambda i: (-scores[i], -pool.created[i], pool.ids[i]))
    picked = diversify(
        order,
        k,
        mmr_lambda=mmr_lambda,
        session_cap=0,
        score_of=lambda i: float(scores[i]),
        text_of=lambda i: pool.texts[i],
        group_of=lambda i: None,
    )[:k]
    return frozenset().union(*(pool.covers[i] for i in picked))


def recall(
    pools: Sequence[Pool], k: int, mmr_lambda: float, ranker: LearnedRanker | None
) -> tuple[float, float]:
    """(recall_any, recall_all) at ``k`` over ``pools``: ranked by ``ranker``, or by the
    fused score when None."""
    if not pools:
        return float("nan"), float("nan")
    hit_any = hit_all = 0
    for p in pools:
        scores = p.fused if ranker is None else ranker.probabilities(p.x)
        got = top(p, scores, k, mmr_lambda)
        hit_any += bool(got & p.evidence)
        hit_all += p.evidence <= got
    return hit_any / len(pools), hit_all / len(pools)


def by_sample(pools: Iterable[Pool]) -> dict[str, list[Pool]]:
    out: dict[str, list[Pool]] = {}
    for p in pools:
        out.setdefault(p.sample_id, []).append(p)
    return out


def choose(
    views: Mapping[str, Mapping[str, list[Pool]]],
    samples: Sequence[str],
    model_id: str,
    k: int,
) -> tuple[Setting, float]:
    """The setting with the best mean recall_any@k over leave-one-out folds of
    ``samples`` (each fold: the mean over the views), and that mean; ties keep the
    earlier setting of the grid."""
    best: tuple[Setting, float] | None = None
    fitted: dict[tuple[float, str], LearnedRanker] = {}
    for strength in STRENGTHS:
        for held in samples:
            train = [p for v in views.values() for s in samples if s != held for p in v.get(s, [])]
            fitted[(strength, held)] = fit_ranker(train, strength, model_id)
    for strength in STRENGTHS:
        for mmr in MMR_GRID:
            scores = [
                np.mean(
                    [
                        recall(v.get(held, []), k, mmr, fitted[(strength, held)])[0]
                        for v in views.values()
                    ]
                )
                for held in samples
            ]
            mean = float(np.mean(scores))
            if best is None or mean > best[1] + 1e-12:
                best = ((strength, mmr), mean)
    assert best is not None
    return best


@dataclass(frozen=True)
class RankerFold:
    """One outer fold: the held-out conversation, the setting its inner folds chose (with
    their mean), and per view (recall_any, recall_all) at each k with the ranker and with
    the fused order."""

    held_out: str
    setting: Setting
    inner: float
    learned: Mapping[str, Mapping[int, tuple[float, float]]]
    fused: Mapping[str, Mapping[int, tuple[float, float]]]


def nested_ranker(
    views: Mapping[str, Sequence[Pool]],
    model_id: str,
    ks: Sequence[int] = (5, 10),
    fused_mmr_lambda: float = InjectConfig().mmr_lambda,
) -> list[RankerFold]:
    """Nested leave-one-conversation-out over the views' conversations (see the module)."""
    split = {name: by_sample(pools) for name, pools in views.items()}
    samples = sorted({s for v in split.values() for s in v})
    if len(samples) < 3:
        raise ValidationError("the nested protocol needs at least 3 conversations")
    folds = []
    for held in samples:
        rest = [s for s in samples if s != held]
        (strength, mmr), inner = choose(split, rest, model_id, ks[0])
        train = [p for v in split.values() for s in rest for p in v.get(s, [])]
        ranker = fit_ranker(train, strength, model_id, mmr)
        learned = {
            name: {k: recall(v.get(held, []), k, mmr, ranker) for k in ks}
            for name, v in split.items()
        }
        fused = {
            name: {k: recall(v.get(held, []), k, fused_mmr_lambda, None) for k in ks}
            for name, v in split.items()
        }
        folds.append(RankerFold(held, (strength, mmr), inner, learned, fused))
    return folds


def ranker_table(folds: Sequence[RankerFold], ks: Sequence[int]) -> str:
    """Per outer fold and view: the chosen setting, the ranker's and the fused order's
    recalls; then the means (the protocol's estimate)."""
    views = list(folds[0].learned) if folds else []
    headers = ["outer fold (held out)", "chosen (strength, mmr_lambda)", "view"]
    for k in ks:
        headers += [f"learned any@{k}", f"learned all@{k}", f"fused any@{k}", f"fused all@{k}"]
    rows = []
    for f in folds:
        for view in views:
            row: list[object] = [f.held_out, f"{f.setting[0]:g}, {f.setting[1]:g}", view]
            for k in ks:
                row += [*f.learned[view][k], *f.fused[view][k]]
            rows.append(row)
    for view in views:
        row = ["mean (protocol estimate)", "", view]
        for k in ks:
            for side in ("learned", "fused"):
                for j in (0, 1):
                    row.append(float(np.mean([getattr(f, side)[view][k][j] for f in folds])))
        rows.append(row)
    return tabulate(rows, headers=headers, tablefmt="github", floatfmt=".3f")


def record_views(
    data: Path | str,
    embedder: Embedder,
    limit_conversations: int | None = None,
    progress_bar: bool | None = False,
    views: Sequence[str] = VIEWS,
) -> dict[str, list[Pool]]:
    """Load each view into a fresh home, ask its questions, and return the recorded pools."""
    out = {}
    for view in views:
        recorded: list[RecordedQuestion] = []
        run_locomo(
            data,
            ks=(10,),
            limit_conversations=limit_conversations,
            embedder=embedder,
            inject_config=InjectConfig(learned_ranker=False),
            format=view,
            record=recorded,
            progress_bar=progress_bar,
        )
        out[view] = pools_of(recorded)
    return out


def nested_beside(
    data: Path | str,
    view: str,
    recorded: Sequence[RecordedQuestion],
    embedder: Embedder,
    ks: Sequence[int],
    limit_conversations: int | None = None,
) -> str:
    """``bench locomo --cv``'s part: the learned ranker's nested protocol with ``view``'s
    questions as recorded by that run and the other view recorded now, as a printable
    text."""
    views = {view: pools_of(recorded)}
    others = [v for v in VIEWS if v != view]
    views.update(record_views(data, embedder, limit_conversations, views=others))
    folds = nested_ranker(views, embedder.model_id, ks)
    return (
        "learned ranker, nested leave-one-conversation-out on both views (each outer "
        "fold's ranker fitted on the other conversations; `bench ranker` runs this alone):\n"
        + ranker_table(folds, ks)
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memory-pipelines bench ranker", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--data", required=True, help="LoCoMo-format JSON file")
    parser.add_argument("--k", type=int, nargs="+", default=[5, 10])
    parser.add_argument("--limit-conversations", type=int, default=None)
    parser.add_argument(
        "--embedder",
        choices=("minilm", "hash"),
        default="minilm",
        help="hash: the non-semantic test embedder (smoke runs; its ranker applies to it alone)",
    )
    parser.add_argument(
        "--embedding-cache", default=None, help="SQLite file to reuse embeddings between runs"
    )
    parser.add_argument(
        "--fit",
        default=None,
        metavar="PATH",
        help="also write a ranker fitted on every conversation (the setting chosen by "
        "leave-one-out over them all) to PATH",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    ks = sorted(set(args.k))
    if ks[0] < 1:
        raise ValidationError("k must be positive")
    t0 = time.perf_counter()
    inner: Embedder = HashEmbedder(64) if args.embedder == "hash" else MiniLMEmbedder()
    embedder = CachedEmbedder(inner, args.embedding_cache) if args.embedding_cache else inner
    views = record_views(args.data, embedder, args.limit_conversations)
    n = {name: len(p) for name, p in views.items()}
    print(f"learned ranker, nested leave-one-conversation-out; questions per view: {n}")
    print(
        f"grid: strength {', '.join(map(str, STRENGTHS))} x mmr_lambda "
        f"{', '.join(map(str, MMR_GRID))}; fused order with mmr_lambda "
        f"{InjectConfig().mmr_lambda}"
    )
    folds = nested_ranker(views, embedder.model_id, ks)
    print(ranker_table(folds, ks))
    if args.fit:
        split = {name: by_sample(p) for name, p in views.items()}
        samples = sorted({s for v in split.values() for s in v})
        (strength, mmr), mean = choose(split, samples, embedder.model_id, ks[0])
        fitted = fit_ranker(
            [p for v in views.values() for p in v], strength, embedder.model_id, mmr
        )
        meta = {
            "fitted_on": samples,
            "views": list(VIEWS),
            "strength": strength,
            "leave_one_out_recall_any": round(mean, 4),
            "k": ks[0],
        }
        fitted = LearnedRanker(
            fitted.weights, fitted.bias, fitted.mean, fitted.scale, fitted.model_id, mmr, meta
        )
        Path(args.fit).write_text(fitted.to_json() + "\n", encoding="utf-8")
        print(f"fitted: {json.dumps(meta)}, mmr_lambda {mmr} -> {args.fit}")
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
