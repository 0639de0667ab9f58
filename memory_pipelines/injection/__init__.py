"""Injection at run start: retrieval over the scope lattice, and rendering (reference §3).

:func:`inject` reads the agent's configuration, selects the injectable notes and active
examples the run may see, ranks them by the agent's strategies, renders them as one
system message, and records attribution. It never modifies a note or an example: it
appends one ``injection_events`` row per injected item and, when the context has a run
id, one audit step ('Prompt' / 'Memory Injection') holding ``memoryAttribution``.

**What can be injected.** Notes whose status is in ``INJECTABLE_STATUSES`` (Active and
Provisional, on every strategy) and that have not expired: a note past ``expires_at``
that the Memory Manager has not archived yet is treated as gone. Examples must be Active,
unexpired and belong to the run's agent. Scope follows :mod:`memory_pipelines.scope`:
the lattice (absent user or company means NULL, never "anyone's") is a store prefilter,
the multi-tenant layer an exact post-filter over an over-fetched candidate set. With
``scope_config={"sharedOnly": true}`` on the agent, only notes and examples without a
user are injected.

**Ranking.** ``Relevant`` with an input is hybrid: the query is embedded once (as
given); the ``candidate_pool`` nearest notes above ``min_similarity`` (cosine) and the
``candidate_pool`` best full-text (BM25) matches of the input without stop words are
fused by ``vector_weight * (cos - floor) / (best cos - floor) + text_weight * bm25 /
best bm25`` (a text-only hit's exact cosine is fetched); then conversation context is
added: each note gains ``context_weight`` times the best score of another candidate from
the same source conversation and ``neighbour_weight`` times the best score of a candidate
from the adjacent turn (see :func:`fuse`). A full-text hit passes without reaching the
cosine floor. An optional reranker (agent ``reranker_config``) over-fetches
``max × retrievalMultiplier`` and reranks down. ``Relevant`` without input behaves as
``All`` (and so does a failed query embedding when the full text finds nothing);
``Recent`` is newest first; ``All`` is by ``TYPE_ORDER`` then newest first. Every tie
breaks by creation time, then id, so the same note set always yields the same bytes.

**Rendering** follows reference §3.4 byte for byte; every note and example renders on
one line and can neither open nor close a block (see :func:`one_line`).
"""

from memory_pipelines.config import InjectConfig
from memory_pipelines.injection.attribution import (
    STEP_NAME,
    STEP_TYPE,
    attribution,
    record_attribution,
)
from memory_pipelines.injection.fusion import (
    Candidate,
    fuse,
    rank_key,
    turn_position,
)
from memory_pipelines.injection.inject import (
    Injection,
    inject,
)
from memory_pipelines.injection.read_filters import example_filter, not_expired, note_filter
from memory_pipelines.injection.render import (
    MEMORY_POLICY,
    format_score,
    one_line,
    render_examples,
    render_message,
    render_notes,
)
from memory_pipelines.injection.rerank import (
    RerankerConfig,
    RerankError,
    cross_score_rerank,
    llm_rerank,
    rerank,
)
from memory_pipelines.injection.retrieval import relevant_notes, select_examples, select_notes
from memory_pipelines.scope import RunScope

__all__ = [
    "MEMORY_POLICY",
    "STEP_NAME",
    "STEP_TYPE",
    "Candidate",
    "InjectConfig",
    "Injection",
    "RerankError",
    "RerankerConfig",
    "RunScope",
    "attribution",
    "cross_score_rerank",
    "example_filter",
    "format_score",
    "fuse",
    "inject",
    "llm_rerank",
    "not_expired",
    "note_filter",
    "one_line",
    "rank_key",
    "record_attribution",
    "relevant_notes",
    "render_examples",
    "render_message",
    "render_notes",
    "rerank",
    "select_examples",
    "select_notes",
    "turn_position",
]
