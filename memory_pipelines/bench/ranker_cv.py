"""The learned ranker's nested protocol (pure): recorded questions as pools of candidate
features, the fit, recall at k, leave-one-conversation-out choice of the setting, and the
per-fold table. ``bench ranker`` and ``bench locomo --cv`` run it; see
:mod:`memory_pipelines.bench.ranker` for the protocol."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tabulate import tabulate

from memory_pipelines.bench.selector import fit
from memory_pipelines.config import InjectConfig
from memory_pipelines.errors import ValidationError
from memory_pipelines.injection.diversity import diversify
from memory_pipelines.injection.learned import LearnedRanker, features


@dataclass(frozen=True)
class RecordedQuestion:
    """A question and the fused candidates ``inject`` ranked for it; ``stands_for`` maps a
    note's turn id to the evidence ids it stands for."""

    sample_id: str
    question: Any
    candidates: list[Any]
    stands_for: Mapping[str, tuple[str, ...]]


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
    loss (bias not penalised): :func:`memory_pipelines.bench.selector.fit` with the
    positives' weights."""
    x = np.vstack([p.x for p in pools if len(p.x)])
    y = np.concatenate([p.y for p in pools if len(p.x)])
    if not y.any() or y.all():
        raise ValidationError("the ranker needs both evidence and other candidates to fit")
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < 1e-9] = 1.0
    weight = np.where(y > 0, (len(y) - y.sum()) / y.sum(), 1.0)
    weight /= weight.mean() * len(y)
    w = fit((x - mean) / scale, y, 1.0 / strength, 50, weights=weight, tol=1e-7)
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


def nested_beside(
    view: str,
    recorded: Sequence[RecordedQuestion],
    record_view: Callable[[str], list[RecordedQuestion]],
    model_id: str,
    ks: Sequence[int],
) -> str:
    """``bench locomo --cv``'s part: the nested protocol with ``view``'s questions as that
    run recorded them and the other views recorded now by ``record_view(name)``, as a
    printable text."""
    views = {view: pools_of(recorded)}
    for other in VIEWS:
        if other != view:
            views[other] = pools_of(record_view(other))
    folds = nested_ranker(views, model_id, ks)
    return (
        "learned ranker, nested leave-one-conversation-out on both views (each outer "
        "fold's ranker fitted on the other conversations; `bench ranker` runs this alone):\n"
        + ranker_table(folds, ks)
    )
