"""Coverage instead of near-duplicates in the first k of a ranking (pure).

Two optional steps over the fused, ranked candidates, both off by default
(:class:`~memory_pipelines.config.InjectConfig` ``mmr_lambda`` 1.0, ``session_cap`` 0):

- **maximal marginal relevance**: the first ``k`` are picked one by one, each maximising
  ``lambda * relevance - (1 - lambda) * redundancy``, where relevance is the candidate's
  fused score over the best one and redundancy its largest word overlap (Jaccard of the
  word sets, stop words left out) with a candidate already picked. Word overlap rather
  than embeddings, so the step works the same on every retrieval path and costs a few set
  operations (the word sets of recent notes are cached).
- **per-conversation cap**: at most ``session_cap`` of the first ``k`` from one source
  conversation; the others keep their order after them.
- **per-conversation penalty** (a soft cap): with ``session_penalty`` > 0, MMR's objective
  also loses that times the number of notes already picked from the candidate's source
  conversation, so the first k spread over sessions unless one session is much better.

A near-duplicate that is also older than the one kept (a restated or changed fact) is the
one MMR drops: of two candidates with the same words the newer ranks first already
(:func:`~memory_pipelines.injection.fusion.rank_key` breaks score ties by recency).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import TypeVar

from memory_pipelines.text import RETRIEVAL_STOPWORDS

C = TypeVar("C")


_WORD = re.compile(r"[^\W_]+")


@lru_cache(maxsize=8192)
def _words(text: str) -> frozenset[str]:
    """The lower-cased words of a text without stop words (unstemmed: a near-copy shares
    its words as they are; cached, since the same notes come back query after query)."""
    return frozenset(_WORD.findall(text.lower())) - RETRIEVAL_STOPWORDS


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a or not b:
        return 0.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def diversify(
    ranked: Sequence[C],
    k: int,
    *,
    mmr_lambda: float,
    session_cap: int,
    score_of: Callable[[C], float],
    text_of: Callable[[C], str],
    group_of: Callable[[C], str | None],
    pool: int = 50,
    update_similarity: float = 0.0,
    created_of: Callable[[C], float] | None = None,
    session_penalty: float = 0.0,
) -> list[C]:
    """``ranked`` with its first ``k`` re-picked greedily among the first ``pool``: each
    pick maximises ``mmr_lambda * relevance - (1 - mmr_lambda) * redundancy`` (ties keep
    the ranked order) among the candidates whose source conversation has fewer than
    ``session_cap`` picks (0: no cap; a candidate without a conversation is its own). The
    candidates not picked follow in their order. ``mmr_lambda`` 1 and ``session_cap`` 0
    leave the order as it is.

    Knowledge updates: with ``update_similarity`` > 0 (and ``created_of``), a pick that has
    a newer candidate in the pool sharing at least that share of its words (Jaccard) gives
    its place to the newest such one, and goes after the candidates not picked: the latest
    statement of a changed fact wins.

    ``session_penalty`` > 0 takes that times the picks already made from a candidate's
    conversation off its objective (with ``mmr_lambda`` 1: off the relevance alone)."""
    use_update = update_similarity > 0.0 and created_of is not None
    use_mmr = mmr_lambda < 1.0 or use_update
    use_penalty = session_penalty > 0.0
    if (not use_mmr and not use_penalty and session_cap <= 0) or k < 1 or len(ranked) < 2:
        return list(ranked)
    head = list(ranked[: max(pool, k)])
    tail = list(ranked[len(head) :])
    best = max((score_of(c) for c in head), default=0.0)
    scale = best if best > 1e-12 else 1.0
    rel = [score_of(c) / scale for c in head]
    words = [_words(text_of(c)) for c in head] if use_mmr else []
    groups = [group_of(c) for c in head]
    redundancy = [0.0] * len(head)
    counts: dict[str, int] = {}
    picked: list[int] = []
    superseded: list[int] = []
    left = list(range(len(head)))
    while len(picked) < k:
        open_ = [
            j
            for j in left
            if session_cap <= 0 or groups[j] is None or counts.get(groups[j], 0) < session_cap
        ]
        if not open_:
            break
        if mmr_lambda < 1.0 or use_penalty:

            def objective(j: int) -> tuple[float, int]:
                value = mmr_lambda * rel[j] - (1 - mmr_lambda) * redundancy[j]
                g = groups[j]
                if use_penalty and g is not None:
                    value -= session_penalty * counts.get(g, 0)
                return (value, -j)

            i = max(open_, key=objective)
        else:
            i = open_[0]
        if use_update and created_of is not None:
            newer = [
                j
                for j in open_
                if created_of(head[j]) > created_of(head[i])
                and _jaccard(words[i], words[j]) >= update_similarity
            ]
            if newer:
                superseded.append(i)  # the older statement goes after the others
                left.remove(i)
                i = max(newer, key=lambda j: (created_of(head[j]), -j))
        picked.append(i)
        left.remove(i)
        g = groups[i]
        if g is not None:
            counts[g] = counts.get(g, 0) + 1
        if use_mmr:
            for j in left:
                redundancy[j] = max(redundancy[j], _jaccard(words[i], words[j]))
    rest = [head[i] for i in left] + [head[i] for i in superseded]
    return [head[i] for i in picked] + rest + tail
