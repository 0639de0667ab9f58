"""The learned ranker: a logistic regression that reorders the fused candidates of the
``Relevant`` path by the chance that each holds what the input asks about (pure numpy).

It reads, for each candidate, signals the fusion already computed (fused and base
scores, cosine, BM25, places in the vector and full-text lists, the cue factor, the
conversation-context share) and a few of the text's own (share of the input's terms and
word pairs it holds, its length, whether it is a question, how new it is among the
candidates): :data:`FEATURES`. Each is scaled with the mean and spread of its fitting
data. The weights ship as ``ranker.json`` beside this module, fitted on the chat and the
LoCoMo views of the LoCoMo dev conversations (a candidate is positive when it is a
question's evidence turn) with the strength and the coverage step's ``mmr_lambda``
chosen by nested leave-one-conversation-out; refit with ``memory-pipelines bench ranker
--data FILE --fit PATH``. The cosine signals are the embedder's, so it applies only with
the embedder it was fitted with (``all-MiniLM-L6-v2``, the default) and only when the
input has a vector: :func:`ranker_for` returns None otherwise and the fused order stays.
``InjectConfig.learned_ranker=False`` turns it off.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from memory_pipelines.errors import ConfigError
from memory_pipelines.injection.fusion import Candidate, rank_key
from memory_pipelines.text import terms

_FILE = "ranker.json"

#: the ranker's inputs, in the order of its weights
FEATURES = (
    "fused",  # fused score / the best fused score
    "base",  # cosine and BM25 parts / the best base
    "cosine",  # the cosine itself (0 without one)
    "cosine_gap",  # cosine - the best cosine among the candidates
    "bm25",  # BM25 / the best BM25
    "vector_place",  # 1 / (1 + place among the vector hits), 0 when not one
    "text_place",  # 1 / (1 + place among the full-text hits), 0 when not one
    "both_lists",  # 1 when it is both a vector and a full-text hit
    "cue",  # the speaker / role / time cue factor
    "context",  # what the conversation context added
    "coverage",  # share of the input's terms the text holds
    "pairs",  # share of the input's adjacent term pairs the text holds
    "length",  # log(1 + terms) / 4
    "question",  # 1 when the text holds a question mark
    "fused_place",  # 1 / (1 + place in the fused order)
    "age_place",  # place by creation time, newest 0, oldest 1
)


def features(query: str, candidates: Sequence[Candidate]) -> np.ndarray:
    """The :data:`FEATURES` of each candidate (candidates x features); ``candidates`` in
    the fused order."""
    n = len(candidates)
    if not n:
        return np.zeros((0, len(FEATURES)))
    q_terms = terms(query)
    q_set = set(q_terms)
    q_pairs = set(zip(q_terms, q_terms[1:], strict=False))
    cos = _finite([c.cosine if c.cosine is not None else 0.0 for c in candidates])
    bm = _finite([c.bm25 or 0.0 for c in candidates])
    score = _finite([c.score for c in candidates])
    base = _finite([c.base for c in candidates])
    created = np.array([c.created_ts for c in candidates])
    age_place = np.empty(n)
    age_place[np.argsort(-created, kind="stable")] = np.arange(n) / max(1, n - 1)
    fused_place = np.empty(n)
    fused_place[np.argsort(-score, kind="stable")] = np.arange(n)
    held = [_text_terms(c.text) for c in candidates]
    x = np.empty((n, len(FEATURES)))
    x[:, 0] = score / _positive_max(score)
    x[:, 1] = base / _positive_max(base)
    x[:, 2] = cos
    x[:, 3] = cos - cos.max()
    x[:, 4] = bm / _positive_max(bm)
    x[:, 5] = _inverse_places([c.vector_rank for c in candidates])
    x[:, 6] = _inverse_places([c.text_rank for c in candidates])
    x[:, 7] = (x[:, 5] > 0) & (x[:, 6] > 0)
    boost = _finite([c.boost for c in candidates])
    x[:, 8] = boost
    x[:, 9] = score - base - base * boost
    x[:, 10] = [len(q_set & h[0]) / len(q_set) for h in held] if q_set else 0.0
    x[:, 11] = [len(q_pairs & h[1]) / len(q_pairs) for h in held] if q_pairs else 0.0
    x[:, 12] = [h[2] for h in held]
    x[:, 13] = ["?" in c.text for c in candidates]
    x[:, 14] = 1.0 / (1.0 + fused_place)
    x[:, 15] = age_place
    return x


def _finite(values: Sequence[float]) -> np.ndarray:
    """The values as an array, a NaN (a degenerate vector's cosine) as 0 and an infinity
    as the largest finite value."""
    return np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0)


def _inverse_places(places: Sequence[int | None]) -> np.ndarray:
    """``1 / (1 + place)`` of each place, 0 for None."""
    return np.array([0.0 if p is None else 1.0 / (1 + p) for p in places])


def _with_score(c: Candidate, score: float) -> Candidate:
    """A copy of ``c`` with another score (``dataclasses.replace`` costs ~10x as much)."""
    out = object.__new__(type(c))
    out.__dict__.update(c.__dict__)
    out.__dict__["score"] = score
    return out


@lru_cache(maxsize=8192)
def _text_terms(text: str) -> tuple[frozenset[str], frozenset[tuple[str, str]], float]:
    """A text's terms, adjacent term pairs and length feature (cached: the same notes come
    back query after query)."""
    t = terms(text)
    return frozenset(t), frozenset(zip(t, t[1:], strict=False)), math.log1p(len(t)) / 4.0


def _positive_max(values: np.ndarray) -> float:
    best = float(values.max()) if len(values) else 0.0
    return best if best > 1e-12 else 1.0


@dataclass(frozen=True)
class LearnedRanker:
    """Weights over the scaled :data:`FEATURES` (``(x - mean) / scale``), the bias, the
    embedder they were fitted with, and the coverage step's ``mmr_lambda`` chosen with
    them (1: no coverage step)."""

    weights: np.ndarray
    bias: float
    mean: np.ndarray
    scale: np.ndarray
    model_id: str
    mmr_lambda: float = 1.0
    meta: dict[str, Any] | None = None

    def probabilities(self, x: np.ndarray) -> np.ndarray:
        """The chance that each row of :func:`features` is what the input asks about."""
        z = ((np.asarray(x, dtype=np.float64) - self.mean) / self.scale) @ self.weights
        return 1.0 / (1.0 + np.exp(-np.clip(z + self.bias, -30, 30)))

    def rank(self, query: str, candidates: Sequence[Candidate]) -> list[Candidate]:
        """The candidates reordered by :meth:`probabilities`, which become their scores;
        ties break as the fused order does (newest, then id)."""
        if len(candidates) < 2:
            return list(candidates)
        p = self.probabilities(features(query, candidates))
        rescored = [_with_score(c, float(s)) for c, s in zip(candidates, p, strict=True)]
        return sorted(rescored, key=rank_key)

    def applies_to(self, model_id: str | None) -> bool:
        return model_id == self.model_id

    def to_json(self) -> str:
        def rounded(values: np.ndarray) -> list[float]:
            return [round(float(v), 6) for v in values]

        return json.dumps(
            {
                "model_id": self.model_id,
                "features": list(FEATURES),
                "weights": rounded(self.weights),
                "bias": round(float(self.bias), 6),
                "mean": rounded(self.mean),
                "scale": rounded(self.scale),
                "mmr_lambda": self.mmr_lambda,
                "meta": self.meta or {},
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> LearnedRanker:
        try:
            data = json.loads(text)
            if list(data["features"]) != list(FEATURES):
                raise ValueError(f"features {data['features']!r} are not {list(FEATURES)!r}")
            arrays = [np.asarray(data[k], dtype=np.float64) for k in ("weights", "mean", "scale")]
            if any(a.shape != (len(FEATURES),) for a in arrays):
                raise ValueError(f"weights, mean and scale need {len(FEATURES)} values each")
            if not (arrays[2] > 0).all():
                raise ValueError("every scale must be positive")
            mmr = float(data.get("mmr_lambda", 1.0))
            if not 0.0 <= mmr <= 1.0:
                raise ValueError(f"mmr_lambda must be between 0 and 1, got {mmr!r}")
            return cls(
                arrays[0],
                float(data["bias"]),
                arrays[1],
                arrays[2],
                str(data["model_id"]),
                mmr,
                data.get("meta"),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"learned ranker: unreadable weights: {e}") from e


_SHIPPED: list[LearnedRanker] = []


def shipped() -> LearnedRanker:
    """The ranker shipped with the package (read once)."""
    if not _SHIPPED:
        text = resources.files("memory_pipelines.injection").joinpath(_FILE).read_text("utf-8")
        _SHIPPED.append(LearnedRanker.from_json(text))
    return _SHIPPED[0]


def load(path: Path | str) -> LearnedRanker:
    return LearnedRanker.from_json(Path(path).read_text("utf-8"))


def ranker_for(enabled: bool, model_id: str | None) -> LearnedRanker | None:
    """The shipped ranker when ``enabled`` and fitted with the embedder ``model_id``."""
    if not enabled or model_id is None:
        return None
    ranker = shipped()
    return ranker if ranker.applies_to(model_id) else None


_POOLS: ContextVar[list[tuple[str, list[Candidate]]] | None] = ContextVar(
    "learned_ranker_pools", default=None
)


@contextmanager
def recorded_pools() -> Iterator[list[tuple[str, list[Candidate]]]]:
    """Within the block, every fused candidate list the ``Relevant`` path ranks (before
    the learned ranker and the coverage step) is appended, with its input, to the list
    yielded: the data ``bench ranker`` fits on."""
    pools: list[tuple[str, list[Candidate]]] = []
    token = _POOLS.set(pools)
    try:
        yield pools
    finally:
        _POOLS.reset(token)


def record(query: str, candidates: Sequence[Candidate]) -> None:
    """Append a fused list to the :func:`recorded_pools` in force, if any."""
    pools = _POOLS.get()
    if pools is not None:
        pools.append((query, list(candidates)))
