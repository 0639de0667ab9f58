"""Coverage of a question's parts in the first k of a ranking (pure).

A question can ask about several things at once: ``X or Y``, ``both X and Y``, what
happened before or after something, several named people or places. A ranking by one
fused score tends to fill the first k with the best part's evidence and its near-copies.
:func:`query_parts` splits the question into parts, each a set of terms only it holds;
:func:`cover_parts` then re-orders the first k so the ranking's first note comes first,
then each part not yet matched gets its best-ranked note holding one of its terms, and
only then does any part get a second note (the rest keep the ranking's order).

The split rules follow the question shapes named in the feature's description alone
(connectives and capitalised names); no benchmark conversation or question was read while
writing them (:data:`READ_WHILE_WRITING`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import TypeVar

from memory_pipelines.text import terms

C = TypeVar("C")

#: benchmark conversations read while writing the split rules: none
READ_WHILE_WRITING: frozenset[str] = frozenset()

#: words that join a question's parts
_JOINS = re.compile(r"\b(?:or|and|both|either|neither|nor|before|after|versus|vs)\b|[,;]", re.I)
_STEMMER = "light"


def query_parts(query: str, *, max_parts: int = 4) -> list[frozenset[str]]:
    """The parts of ``query`` as term sets (light-stemmed terms, stop words out), or ``[]``
    when it has fewer than two: the pieces between joining words (``or``, ``and``,
    ``before``, ``after``, commas ...) each keep the terms no other piece holds, and two
    or more capitalised names not at the start of a sentence are a part each. Parts
    without terms of their own, or the same as another, are dropped; at most
    ``max_parts``."""
    pieces = [terms(p, _STEMMER) for p in _JOINS.split(query)]
    pieces = [p for p in pieces if p]
    out: list[frozenset[str]] = []
    if len(pieces) >= 2:
        for i, piece in enumerate(pieces):
            others = {t for j, p in enumerate(pieces) if j != i for t in p}
            own = frozenset(piece) - others
            if own:
                out.append(own)
    names = _names(query)
    if len(names) >= 2:
        out.extend(names)
    unique = list(dict.fromkeys(out))
    return unique[:max_parts] if len(unique) >= 2 else []


def _names(query: str) -> list[frozenset[str]]:
    """The capitalised words (runs of them are one name) that do not start a sentence."""
    names: list[frozenset[str]] = []
    run: list[str] = []
    start = True
    for m in re.finditer(r"[^\W_]+(?:'[^\W_]+)?|[.!?]", query):
        token = m.group(0)
        if token in ".!?":
            start = True
            _flush(run, names)
            continue
        if token[0].isupper() and not start and token != "I":
            run.append(token)
        else:
            _flush(run, names)
        start = False
    _flush(run, names)
    return list(dict.fromkeys(names))


def _flush(run: list[str], names: list[frozenset[str]]) -> None:
    if run:
        found = frozenset(terms(" ".join(run).split("'")[0], _STEMMER))
        if found:
            names.append(found)
        run.clear()


def _discriminating(
    parts: Sequence[frozenset[str]], words: Sequence[frozenset[str]]
) -> list[frozenset[str]]:
    """The parts' terms that at most half of the candidates hold (a term most of them
    share, such as the name of the person every note is about, tells no part's notes
    apart); parts left without one are dropped."""
    seen: dict[str, int] = {}
    for w in words:
        for t in w:
            seen[t] = seen.get(t, 0) + 1
    half = len(words) / 2
    kept = [frozenset(t for t in part if seen.get(t, 0) <= half) for part in parts]
    return [p for p in dict.fromkeys(kept) if p]


@lru_cache(maxsize=8192)
def _terms(text: str) -> frozenset[str]:
    """A note's light-stemmed terms (cached: the same notes come back query after query)."""
    return frozenset(terms(text, _STEMMER))


def cover_parts(
    ranked: Sequence[C],
    k: int,
    parts: Sequence[frozenset[str]],
    *,
    text_of: Callable[[C], str],
    pool: int = 50,
) -> list[C]:
    """``ranked`` with its first ``k`` re-ordered among the first ``pool`` so every part
    gets a note before any gets a second: the first of ``ranked``, then for each part (in
    the question's order) not yet matched by a note picked, its first note in ``ranked``
    holding one of its terms; then the others in their order. A part's terms held by more
    than half of the pool do not count; fewer than two parts left leave the order as it
    is."""
    if len(parts) < 2 or k < 2 or len(ranked) < 2:
        return list(ranked)
    head = list(ranked[: max(pool, k)])
    words = [_terms(text_of(c)) for c in head]
    parts = _discriminating(parts, words)
    if len(parts) < 2:
        return list(ranked)
    picked = [0]
    covered = {p for p, part in enumerate(parts) if part & words[0]}
    for p, part in enumerate(parts):
        if len(picked) >= k:
            break
        if p in covered:
            continue
        found = next((j for j in range(len(head)) if j not in picked and part & words[j]), None)
        if found is None:
            continue
        picked.append(found)
        covered.update(q for q, other in enumerate(parts) if other & words[found])
    chosen = set(picked)
    rest = [c for j, c in enumerate(head) if j not in chosen]
    return [head[j] for j in picked] + rest + list(ranked[len(head) :])
