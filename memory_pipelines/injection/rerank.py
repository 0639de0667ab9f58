"""Reranking: an agent's ``reranker_config``, the offline cross-score reranker, the
litellm reranker, and the ``fallbackOnError`` policy around them."""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from memory_pipelines.errors import MemoryPipelineError
from memory_pipelines.injection.fusion import Candidate, rank_key
from memory_pipelines.injection.render import one_line
from memory_pipelines.limits import limits
from memory_pipelines.litellm_loader import import_litellm
from memory_pipelines.text import terms

log = logging.getLogger(__name__)


class RerankError(MemoryPipelineError):
    """The reranker failed and the agent's ``fallbackOnError`` is false."""


@dataclass(frozen=True)
class RerankerConfig:
    """An agent's ``reranker_config`` (camelCase or snake_case keys).

    ``type``: ``"cross-score"`` (default; offline) or ``"llm"`` (litellm ``model``).
    """

    enabled: bool = False
    retrieval_multiplier: int = 3
    fallback_on_error: bool = True
    type: str = "cross-score"
    model: str | None = None
    rerank_examples: bool = False

    @classmethod
    def from_value(cls, value: Mapping[str, Any] | None) -> RerankerConfig:
        """Parse the agent's config; missing keys take the defaults above."""
        if not value:
            return cls()

        def get(camel: str, snake: str, default: Any) -> Any:
            return value[camel] if camel in value else value.get(snake, default)

        try:
            mult = max(1, int(get("retrievalMultiplier", "retrieval_multiplier", 3) or 3))
        except (TypeError, ValueError, OverflowError):
            mult = 3
        mult = min(mult, limits().max_retrieval_multiplier)  # a row stored before the check
        return cls(
            enabled=bool(value.get("enabled", False)),
            retrieval_multiplier=mult,
            fallback_on_error=bool(get("fallbackOnError", "fallback_on_error", True)),
            type=str(value.get("type") or "cross-score").lower(),
            model=value.get("model"),
            rerank_examples=bool(get("rerankExamples", "rerank_examples", False)),
        )


def cross_score_rerank(query: str, candidates: Sequence[Candidate], k: int) -> list[Candidate]:
    """Offline reranker: a cross score of each (query, candidate) pair.

    ``0.45 * fused score (max 1) + 0.2 * cosine + 0.2 * query-term coverage + 0.1 *
    query-bigram overlap + 0.05 * recency`` (half-life 30 days from the newest candidate,
    so it never depends on the wall clock). Returns the top ``k``.
    """
    if not candidates:
        return []
    q_terms = terms(query)
    q_set = set(q_terms)
    q_bigrams = {(a, b) for a, b in zip(q_terms, q_terms[1:], strict=False)}
    top = max(c.score for c in candidates) or 1.0
    newest = max(c.created_ts for c in candidates)
    rescored = []
    for c in candidates:
        t = terms(c.text)
        coverage = len(q_set & set(t)) / len(q_set) if q_set else 0.0
        bigrams = {(a, b) for a, b in zip(t, t[1:], strict=False)}
        bigram = len(q_bigrams & bigrams) / len(q_bigrams) if q_bigrams else 0.0
        age_days = max(0.0, (newest - c.created_ts) / 86400.0)
        recency = math.exp(-math.log(2) * age_days / 30.0)
        cos = max(0.0, c.cosine or 0.0)
        score = 0.45 * (c.score / top) + 0.2 * cos + 0.2 * coverage + 0.1 * bigram + 0.05 * recency
        rescored.append(replace(c, score=score))
    return sorted(rescored, key=rank_key)[:k]


_RERANK_PROMPT = (
    "You rank stored memories by how useful each is for answering the user's message. "
    'Reply with JSON only: {"ranking": [candidate numbers, most useful first]}.'
)


def llm_rerank(
    query: str, candidates: Sequence[Candidate], k: int, model: str, timeout_s: float
) -> list[Candidate]:
    """Rerank with a litellm chat model; ``RerankError`` on any failure or malformed reply.

    Candidates the model leaves out keep their retrieval order after the ranked ones.
    """
    if not candidates:
        return []
    numbered = "\n".join(f"{i}. {one_line(c.text)[:500]}" for i, c in enumerate(candidates, 1))
    messages = [
        {"role": "system", "content": _RERANK_PROMPT},
        {
            "role": "user",
            "content": f"Message: {one_line(query)[:2000]}\n\nCandidates:\n{numbered}",
        },
    ]
    try:
        litellm = import_litellm()

        resp = litellm.completion(
            model=model, messages=messages, temperature=0, timeout=timeout_s, num_retries=0
        )
        content = resp.choices[0].message.content or ""
        match = re.search(r"\{.*\}", content, re.DOTALL)
        ranking = json.loads(match.group(0) if match else content)["ranking"]
        order = [int(i) for i in ranking]
    except Exception as e:
        raise RerankError(f"LLM reranker {model!r} failed: {e}") from e
    if any(i < 1 or i > len(candidates) for i in order) or len(set(order)) != len(order):
        raise RerankError(f"LLM reranker {model!r} returned an invalid ranking {order!r}")
    chosen = [candidates[i - 1] for i in order]
    seen = {id(c) for c in chosen}
    rest = [c for c in candidates if id(c) not in seen]
    return (chosen + rest)[:k]


def rerank(
    query: str,
    candidates: Sequence[Candidate],
    k: int,
    config: RerankerConfig,
    *,
    timeout_s: float = 15.0,
) -> list[Candidate]:
    """Apply the configured reranker, honouring ``fallbackOnError``.

    A failure (including an unknown ``type``) falls back to the retrieval order when
    ``fallbackOnError`` is true and raises :class:`RerankError` otherwise.
    """
    try:
        if config.type in ("cross-score", "cross", "offline", "local"):
            return cross_score_rerank(query, candidates, k)
        if config.type == "llm":
            if not config.model:
                raise RerankError("reranker type 'llm' needs a 'model'")
            return llm_rerank(query, candidates, k, config.model, timeout_s)
        raise RerankError(f"unknown reranker type {config.type!r}")
    except Exception as e:
        if config.fallback_on_error:
            log.warning("reranker failed, keeping the retrieval order: %s", e)
            return list(candidates)[:k]
        if isinstance(e, RerankError):
            raise
        raise RerankError(f"reranker failed: {e}") from e
