"""Leave-one-conversation-out folds of ``bench extraction``: the rule-family choice (single
level and nested), and the tables the command prints."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from tabulate import tabulate


class ConversationResult(Protocol):
    """What the folds read of :class:`memory_pipelines.bench.extraction.ConversationResult`."""

    sample_id: str
    sessions: int
    rules: list[str]
    seconds: float

    def figures(self, keep: set[str] | None = None) -> tuple[int, int, int, int]: ...


TARGET_PRECISION = 0.60


def _ratio(a: int, b: int) -> float:
    return a / b if b else float("nan")


@dataclass(frozen=True)
class FoldResult:
    held_out: str
    chosen: tuple[str, ...]
    tune: tuple[float, float]  # recall, precision
    validation: tuple[float, float]
    validation_counts: tuple[int, int, int, int]


def _pooled(results: Sequence[ConversationResult], keep: set[str] | None) -> tuple[int, ...]:
    sums = [0, 0, 0, 0]
    for r in results:
        for i, v in enumerate(r.figures(keep)):
            sums[i] += v
    return tuple(sums)


def choose_rules(
    results: Sequence[ConversationResult], target: float = TARGET_PRECISION
) -> tuple[str, ...]:
    """Rule families chosen on ``results`` alone: by their own precision there, best
    first, each kept only when it raises the pooled recall (covers an observation the
    families kept so far do not; a tie leaves it out) and the pooled precision stays
    >= ``target``. Then a family that the later ones made redundant (the others cover
    all it covers) is dropped, while the precision stays at the target."""
    families = sorted({f for r in results for f in r.rules})
    own = {}
    for f in families:
        c, _, m, n = _pooled(results, {f})
        own[f] = (_ratio(m, n), c)
    chosen: list[str] = []
    covered = 0
    for f in sorted(families, key=lambda f: (-own[f][0], -own[f][1], f)):
        c, _, m, n = _pooled(results, {*chosen, f})
        if c > covered and _ratio(m, n) >= target:
            chosen.append(f)
            covered = c
    for f in reversed(list(chosen)):
        c, _, m, n = _pooled(results, set(chosen) - {f})
        if c == covered and _ratio(m, n) >= target:
            chosen.remove(f)
    return tuple(chosen)


def folds(results: Sequence[ConversationResult]) -> list[FoldResult]:
    out = []
    for held in results:
        tune = [r for r in results if r is not held]
        chosen = choose_rules(tune)
        tc, to, tm, tn = _pooled(tune, set(chosen))
        vc, vo, vm, vn = held.figures(set(chosen))
        out.append(
            FoldResult(
                held.sample_id,
                chosen,
                (_ratio(tc, to), _ratio(tm, tn)),
                (_ratio(vc, vo), _ratio(vm, vn)),
                (vc, vo, vm, vn),
            )
        )
    return out


#: precision floors the inner folds choose among for :func:`choose_rules` (a stricter floor
#: keeps fewer, more precise families)
FLOORS = (0.60, 0.70, 0.80, 0.90)


@dataclass(frozen=True)
class NestedFold:
    """One outer fold of nested cross-validation of the rule-family choice."""

    held_out: str
    floor: float  # the precision floor the inner folds chose
    chosen: tuple[str, ...]  # the families chosen with it on all the tune conversations
    inner: tuple[float, float]  # inner validation recall, precision of the chosen floor
    validation: tuple[float, float]
    validation_counts: tuple[int, int, int, int]
    read_while_writing: bool


def _inner_figures(tune: Sequence[ConversationResult], floor: float) -> tuple[float, float]:
    """Pooled validation (recall, precision) of choosing families at ``floor`` on all but
    one of ``tune``, scored on that one, over every such split."""
    sums = [0, 0, 0, 0]
    for held in tune:
        chosen = choose_rules([r for r in tune if r is not held], floor)
        for i, v in enumerate(held.figures(set(chosen))):
            sums[i] += v
    return _ratio(sums[0], sums[1]), _ratio(sums[2], sums[3])


def nested_folds(
    results: Sequence[ConversationResult],
    floors: Sequence[float] = FLOORS,
    target: float = TARGET_PRECISION,
    read: Sequence[str] | frozenset[str] = (),
) -> list[NestedFold]:
    """Nested leave-one-conversation-out: for each held-out conversation, the inner
    leave-one-out folds over the others choose the precision floor of the family choice
    (the best inner validation recall whose inner validation precision is >= ``target``;
    the lowest floor when none reaches it, ties to the lower floor); the families are then
    chosen with that floor on all the other conversations and scored on the held-out one.
    ``read``: conversations read while writing the rules (flagged: such a fold is not a
    held-out estimate of the rules themselves)."""
    out = []
    for held in results:
        tune = [r for r in results if r is not held]
        scored = {f: _inner_figures(tune, f) if len(tune) > 1 else (0.0, 0.0) for f in floors}
        ok = [f for f in floors if scored[f][1] >= target]
        floor = max(ok, key=lambda f: (scored[f][0], -f)) if ok else min(floors)
        chosen = choose_rules(tune, floor)
        vc, vo, vm, vn = held.figures(set(chosen))
        out.append(
            NestedFold(
                held.sample_id,
                floor,
                chosen,
                scored[floor],
                (_ratio(vc, vo), _ratio(vm, vn)),
                (vc, vo, vm, vn),
                held.sample_id in read,
            )
        )
    return out


def nested_table(fold_results: Sequence[NestedFold]) -> str:
    rows = [
        [
            f.held_out + (" (read)" if f.read_while_writing else ""),
            f"{f.floor:.2f}",
            len(f.chosen),
            f"{f.inner[0]:.3f}",
            f"{f.inner[1]:.3f}",
            f"{f.validation[0]:.3f}",
            f"{f.validation[1]:.3f}",
        ]
        for f in fold_results
    ]
    headers = ["outer fold (held out)", "floor chosen by inner folds", "families"]
    headers += ["inner recall", "inner precision", "outer recall", "outer precision"]
    return tabulate(rows, headers=headers, tablefmt="github")


NESTED_PROTOCOL = (
    "Protocol: nested leave-one-conversation-out. Outer folds hold out one conversation "
    "each; inside each, inner leave-one-out folds over the other conversations choose the "
    "precision floor of the rule-family choice (best inner validation recall at inner "
    f"precision >= {TARGET_PRECISION:.2f}); the families are chosen with that floor on the "
    "other conversations and only then scored on the held-out one. Reported: the outer "
    "per-fold figures, their mean and the pooled figures."
)


def conversation_table(results: Sequence[ConversationResult]) -> str:
    rows = []
    for r in results:
        c, o, m, n = r.figures()
        rows.append(
            [
                r.sample_id,
                r.sessions,
                o,
                n,
                f"{_ratio(c, o):.3f}",
                f"{_ratio(m, n):.3f}",
                f"{n / max(r.sessions, 1):.2f}",
                f"{r.seconds:.1f}",
            ]
        )
    c, o, m, n = _pooled(results, None)
    sessions = sum(r.sessions for r in results)
    rows.append(
        [
            "all",
            sessions,
            o,
            n,
            f"{_ratio(c, o):.3f}",
            f"{_ratio(m, n):.3f}",
            f"{n / max(sessions, 1):.2f}",
            f"{statistics.mean(r.seconds for r in results):.1f} (mean)",
        ]
    )
    headers = ["conversation", "sessions", "observations", "notes", "recall", "precision"]
    return tabulate(rows, headers=[*headers, "notes/session", "s/conversation"], tablefmt="github")


def rule_table(results: Sequence[ConversationResult], fold_results: Sequence[FoldResult]) -> str:
    families = sorted({f for r in results for f in r.rules})
    rows = []
    for f in families:
        _, _, m, n = _pooled(results, {f})
        others = set(families) - {f}
        c_all = _pooled(results, None)[0]
        c_without = _pooled(results, others)[0]
        chosen = sum(1 for fr in fold_results if f in fr.chosen)
        rows.append(
            [f, n, m, f"{_ratio(m, n):.3f}", c_all - c_without, f"{chosen}/{len(fold_results)}"]
        )
    headers = ["rule family", "notes", "matched", "precision", "obs. only it covers"]
    return tabulate(rows, headers=[*headers, "chosen in folds"], tablefmt="github")


def fold_table(fold_results: Sequence[FoldResult]) -> str:
    rows = [
        [
            f.held_out,
            f"{f.tune[0]:.3f}",
            f"{f.tune[1]:.3f}",
            f"{f.validation[0]:.3f}",
            f"{f.validation[1]:.3f}",
            len(f.chosen),
        ]
        for f in fold_results
    ]
    headers = ["validate on", "tune recall", "tune precision", "validation recall"]
    return tabulate(
        rows, headers=[*headers, "validation precision", "families chosen"], tablefmt="github"
    )
