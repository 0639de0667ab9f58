"""Cross-validation by conversation of ``bench locomo --cv``: nested leave-one-conversation-out
over the settings a run measured (each one an inject method of a
:class:`~memory_pipelines.bench.locomo.LocomoResult`), the single-level folds and the fixed
split for comparison, and the tables the command prints."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

from tabulate import tabulate

from memory_pipelines.bench.locomo_data import READ_WHILE_WRITING
from memory_pipelines.config import InjectConfig
from memory_pipelines.errors import ValidationError


class LocomoResult(Protocol):
    """What the folds read of :class:`memory_pipelines.bench.locomo.LocomoResult`."""

    ks: tuple[int, ...]
    counts: dict[int, int]

    def method(self, name: str) -> Any: ...


@dataclass(frozen=True)
class Fold:
    """One cross-validation fold: the setting chosen on ``tune`` and its figures."""

    name: str
    tune: tuple[str, ...]
    validate: tuple[str, ...]
    chosen: str
    tune_recall: dict[int, float]
    validation_recall: dict[int, float]


def cross_validate(
    result: LocomoResult,
    candidates: Sequence[str],
    folds: Sequence[tuple[str, Sequence[str], Sequence[str]]],
    *,
    select_k: int = 5,
) -> list[Fold]:
    """For each ``(name, tune, validate)`` fold, pick among the methods ``candidates`` (the
    first is the no-tuning baseline, kept on ties) the one with the best recall_any at
    ``select_k`` on the tune conversations, and report its tune and validation recall_any
    at every k. The choice never sees a validation question."""
    out: list[Fold] = []
    for name, tune, validate in folds:
        best = max(
            candidates,
            key=lambda c: (
                round(result.method(c).recall(select_k, samples=tune), 9),
                -candidates.index(c),
            ),
        )
        m = result.method(best)
        out.append(
            Fold(
                name,
                tuple(tune),
                tuple(validate),
                best,
                {k: m.recall(k, samples=tune) for k in result.ks},
                {k: m.recall(k, samples=validate) for k in result.ks},
            )
        )
    return out


@dataclass(frozen=True)
class NestedFold:
    """One outer fold of nested cross-validation: the setting the inner folds chose (by
    their mean validation recall_any at ``select_k``, never seeing ``held_out``), the
    inner folds' own estimate of that choice procedure, and the outer figures."""

    held_out: str
    chosen: str
    inner_choice_recall: float  # mean inner-validation recall_any@select_k of ``chosen``
    inner_estimate: float  # choose on 3, validate on 1, mean over the inner folds
    outer_any: dict[int, float]
    outer_all: dict[int, float]
    read_while_writing: bool


def _inner_score(
    result: LocomoResult, candidate: str, inner: Sequence[str], select_k: int
) -> float:
    """Mean over the inner leave-one-out folds of the candidate's validation recall_any:
    with no fitted parameters, the mean of its per-conversation recall on ``inner``."""
    m = result.method(candidate)
    return statistics.mean(m.recall(select_k, samples=[s]) for s in inner)


def nested_cross_validate(
    result: LocomoResult,
    candidates: Sequence[str],
    *,
    select_k: int = 5,
    read: Collection[str] = (),
) -> list[NestedFold]:
    """Nested leave-one-conversation-out: for each held-out conversation (outer fold),
    each candidate setting is scored by the inner leave-one-out folds over the other
    conversations, the best is chosen (the first candidate, today's defaults, kept on
    ties) and only then scored on the held-out conversation at every k, recall_any and
    recall_all. ``inner_estimate`` runs the same choice inside the inner folds (choose on
    all but one inner conversation, validate on it), so the gap between it and the outer
    figure shows how optimistic a single level is. ``read``: the conversations read while
    writing the cues (:data:`~memory_pipelines.bench.locomo_data.READ_WHILE_WRITING`); a
    fold holding one out is flagged, since its figure is then not a held-out estimate."""
    samples = list(dict.fromkeys(result.method(candidates[0]).samples))
    if len(samples) < 2:
        raise ValidationError(
            f"nested cross-validation needs at least 2 conversations, got {len(samples)}"
        )
    out: list[NestedFold] = []
    for held in samples:
        inner = [s for s in samples if s != held]

        def choose(pool: Sequence[str]) -> tuple[str, float]:
            scored = [(c, round(_inner_score(result, c, pool, select_k), 9)) for c in candidates]
            best = max(scored, key=lambda cs: (cs[1], -candidates.index(cs[0])))
            return best

        chosen, score = choose(inner)
        inner_vals = []
        if len(inner) > 1:
            for v in inner:
                pick, _ = choose([s for s in inner if s != v])
                inner_vals.append(result.method(pick).recall(select_k, samples=[v]))
        m = result.method(chosen)
        out.append(
            NestedFold(
                held,
                chosen,
                score,
                statistics.mean(inner_vals) if inner_vals else float("nan"),
                {k: m.recall(k, samples=[held]) for k in result.ks},
                {k: m.recall(k, samples=[held], kind="all") for k in result.ks},
                held in read,
            )
        )
    return out


def nested_by_category(
    result: LocomoResult, folds: Sequence[NestedFold], categories: Mapping[int, str]
) -> str:
    """The nested protocol's estimate per question category: every outer fold's chosen
    setting scored on its held-out conversation's questions of that category, pooled over
    the folds (recall_any and recall_all at every k)."""
    rows = []
    for c, label in [(None, "overall"), *sorted(categories.items())]:
        n = 0
        hits = {(k, kind): 0.0 for k in result.ks for kind in ("any", "all")}
        for f in folds:
            m = result.method(f.chosen)
            held = m.count(c, [f.held_out])
            n += held
            for k, kind in hits:
                if held:
                    hits[(k, kind)] += m.recall(k, c, kind, [f.held_out]) * held
        row: list[Any] = [label if c is None else f"{c} {label}", n]
        row += [
            f"{hits[(k, kind)] / n:.3f}" if n else "-" for k in result.ks for kind in ("any", "all")
        ]
        rows.append(row)
    headers = ["category", "n"] + [f"outer {w}@{k}" for k in result.ks for w in ("any", "all")]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def nested_table(folds: Sequence[NestedFold], ks: Sequence[int]) -> str:
    rows = []
    for f in folds:
        row: list[Any] = [f.held_out + (" (read)" if f.read_while_writing else ""), f.chosen]
        row += [f"{f.inner_choice_recall:.3f}", f"{f.inner_estimate:.3f}"]
        for k in ks:
            row += [f"{f.outer_any[k]:.3f}", f"{f.outer_all[k]:.3f}"]
        rows.append(row)
    mean: list[Any] = ["mean", ""]
    mean += [
        f"{statistics.mean(f.inner_choice_recall for f in folds):.3f}",
        f"{statistics.mean(f.inner_estimate for f in folds):.3f}",
    ]
    for k in ks:
        mean += [
            f"{statistics.mean(f.outer_any[k] for f in folds):.3f}",
            f"{statistics.mean(f.outer_all[k] for f in folds):.3f}",
        ]
    rows.append(mean)
    headers = ["outer fold (held out)", "chosen by inner folds", "inner score", "inner estimate"]
    for k in ks:
        headers += [f"outer any@{k}", f"outer all@{k}"]
    return tabulate(rows, headers=headers, tablefmt="github")


NESTED_PROTOCOL = (
    "Protocol: nested leave-one-conversation-out. Outer folds hold out one conversation "
    "each; for each outer fold, every setting of the grid is scored by inner "
    "leave-one-out folds over the remaining conversations (mean validation recall_any@5), "
    "the best is chosen there (today's defaults kept on ties) and only then scored on the "
    "held-out conversation. Reported: the outer per-fold figures and their mean. "
    "'inner estimate' is the same choice made one level down (choose on all but one inner "
    "conversation, validate on it)."
)


def leave_one_out(samples: Sequence[str]) -> list[tuple[str, list[str], list[str]]]:
    """One fold per conversation: tune on the others, validate on it."""
    return [(f"validate {s}", [t for t in samples if t != s], [s]) for s in samples]


def fold_table(folds: Sequence[Fold], ks: Sequence[int]) -> str:
    rows = []
    for f in folds:
        row: list[Any] = [f.name, f.chosen]
        row += [f"{f.tune_recall[k]:.3f}" for k in ks]
        row += [f"{f.validation_recall[k]:.3f}" for k in ks]
        rows.append(row)
    headers = ["fold", "chosen on tune", *[f"tune any@{k}" for k in ks]]
    headers += [f"validation any@{k}" for k in ks]
    return tabulate(rows, headers=headers, tablefmt="github")


FIXED_SPLIT = (("conv-26", "conv-30"), ("conv-41", "conv-42", "conv-43"))


def _cv_summary(loo: Sequence[Fold], ks: Sequence[int]) -> str:
    """``recall_any@5 0.669, ... (tune - validation gap: @5 +0.001, ...)`` of LOO folds."""
    means = {k: statistics.mean(f.validation_recall[k] for f in loo) for k in ks}
    gaps = {k: statistics.mean(f.tune_recall[k] - f.validation_recall[k] for f in loo) for k in ks}
    return (
        ", ".join(f"recall_any@{k} {means[k]:.3f}" for k in ks)
        + " (tune - validation gap: "
        + ", ".join(f"@{k} {gaps[k]:+.3f}" for k in ks)
        + ")"
    )


def _axes(grid: Sequence[tuple[str, InjectConfig]], base: InjectConfig) -> dict[str, list[str]]:
    """For each field the grid varies, the settings that vary only it (``text_weight`` with
    its ``vector_weight``): that field's candidates alone."""
    changed = {
        name: {f.name for f in fields(cfg) if getattr(cfg, f.name) != getattr(base, f.name)}
        - {"vector_weight"}
        for name, cfg in grid
    }
    out: dict[str, list[str]] = {}
    for name, diff in changed.items():
        if len(diff) == 1:
            out.setdefault(next(iter(diff)), []).append(name)
    return out


def _print_cv(
    result: LocomoResult,
    candidates: Sequence[str],
    axes: Mapping[str, Sequence[str]] | None = None,
    categories: Mapping[int, str] | None = None,
) -> None:
    samples = list(dict.fromkeys(result.method(candidates[0]).samples))
    print(
        f"LoCoMo retrieval, cross-validated by conversation: {len(samples)} conversations, "
        f"{sum(result.counts.values())} questions, {len(candidates)} setting(s) to choose from "
        "(the first is today's defaults)"
    )
    if len(samples) < 2:
        print(f"cross-validation needs at least 2 conversations, got {len(samples)}")
        return
    folds = leave_one_out(samples)
    print("\n" + NESTED_PROTOCOL)
    read = [s for s in samples if s in READ_WHILE_WRITING]
    if read:
        print(
            f"Caution: the retrieval cues and today's default weights were written and chosen "
            f"while reading {', '.join(read)} (marked 'read'): no grid choice can make those "
            "folds unseen, so the outer mean is an upper estimate, not a held-out figure. On "
            "conversations outside the dev file, earlier figures fell 0.06 (retrieval "
            "recall_any@5) below the cross-validated ones."
        )
    nested = nested_cross_validate(result, candidates, read=READ_WHILE_WRITING)
    print(nested_table(nested, result.ks))
    outer = statistics.mean(f.outer_any[result.ks[0]] for f in nested)
    print(f"\nnested outer mean recall_any@{result.ks[0]} {outer:.3f}")
    if categories:
        print("\nnested estimate per category (outer folds' questions pooled)")
        print(nested_by_category(result, nested, categories))
    if len(candidates) > 1:
        _print_settings(result, candidates, samples)
    loo = cross_validate(result, candidates, folds)
    print("\nsingle level, for comparison: leave-one-conversation-out, chosen on the tune folds")
    print(fold_table(loo, result.ks))
    print("\nmean validation " + _cv_summary(loo, result.ks))
    if axes and len(axes) > 1:
        _print_axes(result, candidates, axes, folds)
    tune, validate = FIXED_SPLIT
    if set(tune) | set(validate) <= set(samples):
        fixed = cross_validate(
            result, candidates, [("tune 26+30, validate 41+42+43", tune, validate)]
        )
        print("\nfixed split")
        print(fold_table(fixed, result.ks))


def _print_settings(
    result: LocomoResult, candidates: Sequence[str], samples: Sequence[str]
) -> None:
    """Each setting's mean per-conversation recall on all conversations."""
    print(
        "\neach setting on all conversations (mean per conversation; seen by every "
        "choice, so not an estimate: to see what the choice trades)"
    )
    rows = []
    for c in candidates:
        m = result.method(c)
        row: list[Any] = [c]
        for k in result.ks:
            row += [
                f"{statistics.mean(m.recall(k, samples=[s]) for s in samples):.3f}",
                f"{statistics.mean(m.recall(k, samples=[s], kind='all') for s in samples):.3f}",
            ]
        rows.append(row)
    headers = ["setting"] + [f"{w}@{k}" for k in result.ks for w in ("any", "all")]
    print(tabulate(rows, headers=headers, tablefmt="github"))


def _print_axes(
    result: LocomoResult,
    candidates: Sequence[str],
    axes: Mapping[str, Sequence[str]],
    folds: Sequence[tuple[str, Sequence[str], Sequence[str]]],
) -> None:
    """Single-level folds choosing among today's defaults and one field's settings."""
    print("\neach field alone (today's defaults and the settings that vary only it)")
    baseline = cross_validate(result, candidates[:1], folds)
    print(f"  {'defaults only':<18} {_cv_summary(baseline, result.ks)}")
    for key, names in axes.items():
        alone = cross_validate(result, [candidates[0], *[f"inject [{n}]" for n in names]], folds)
        chosen = Counter(f.chosen for f in alone).most_common()
        picks = ", ".join(
            f"{'defaults' if c == candidates[0] else c.removeprefix('inject ')} x{n}"
            for c, n in chosen
        )
        print(f"  {key:<18} {_cv_summary(alone, result.ks)}; chosen: {picks}")
