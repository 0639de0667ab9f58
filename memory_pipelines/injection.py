"""Injection at run start: retrieval over the scope lattice, and rendering (reference §3).

:func:`inject` reads the agent's configuration, selects the injectable notes and active
examples the run may see, ranks them by the agent's strategies, renders them as one
system message, and records attribution. It never modifies a note or an example: it
appends one ``injection_events`` row per injected item and, when the context has a run
id, one audit step ('Prompt' / 'Memory Injection') holding ``memoryAttribution``.

**What can be injected.** Notes whose status is in ``INJECTABLE_STATUSES`` (Active and
Provisional, on every strategy) and that have not expired: a note past ``expires_at``
that the Memory Manager has not archived yet is treated as gone. Examples must be Active,
unexpired and belong to the run's agent. Scope follows :mod:`memory_pipelines.scoping`:
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

from __future__ import annotations

import json
import logging
import math
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Generic, TypeVar

import numpy as np
from pydantic import BaseModel

from memory_pipelines.agents import get_agent
from memory_pipelines.config import InjectConfig
from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import ConfigError, EmbeddingError, MemoryPipelineError
from memory_pipelines.limits import limits
from memory_pipelines.notes import (
    TYPE_ORDER,
    AgentConfig,
    Example,
    ExampleInjectionStrategy,
    ExampleStatus,
    Note,
    NoteInjectionStrategy,
    NoteStatus,
    RunContext,
)
from memory_pipelines.scoping import (
    SecondaryScopeConfig,
    example_scope_filter,
    item_matches,
    multi_tenant_prefilter,
    note_scope_filter,
    post_filter_needed,
    resolve_run_scopes,
    scope_label,
)
from memory_pipelines.store import Cond, Hit, and_, cmp, eq, injectable, is_null, or_
from memory_pipelines.text import terms, text_query

log = logging.getLogger(__name__)

T = TypeVar("T", Note, Example)

STEP_TYPE = "Prompt"
STEP_NAME = "Memory Injection"



class Injection(BaseModel):
    """What is injected at run start: the one system message and the items in it."""

    message: str = ""
    notes: list[Note] = []
    examples: list[Example] = []


class RerankError(MemoryPipelineError):
    """The reranker failed and the agent's ``fallbackOnError`` is false."""


# =========================================================================== rendering

MEMORY_POLICY: tuple[str, ...] = (
    "<memory_policy>",
    "Precedence (highest to lowest):",
    "1) The current user message overrides all stored memory",
    '2) Provisional notes (marked "(provisional)") are the newest signal — when a',
    "   provisional note and an established note conflict on the same topic, follow",
    "   the provisional one (recency wins)",
    "3) User-specific notes override company-level",
    "4) Company notes override global defaults",
    "5) Within the same scope and status, prefer the most recent by recorded date (shown on each note)",
    "",
    "Conflict resolution:",
    "- Same level and neither provisional: prefer the more specific scope, then the more recent",
    "- Ask clarifying question only if conflict materially affects response",
    "</memory_policy>",
    "",
)

_LINE_BREAKS = re.compile(r"[\r\n\t\v\f\x85\u2028\u2029]+")
_POLICY_TAG = re.compile(r"<(\s*/?\s*memory[\s_\-]*policy\b[^<>]*)>", re.IGNORECASE)
_HEADER_GLYPHS = re.compile("[\U0001f4dd\U0001f4a1]\ufe0f?")
_BIDI = {0x202A, 0x202B, 0x202C, 0x202D, 0x202E, 0x2066, 0x2067, 0x2068, 0x2069, 0x200E, 0x200F}
_SPACES = re.compile(r" {2,}")


def one_line(text: str | None) -> str:
    """A stored text made safe to render inside the injected message.

    Line and paragraph separators, tabs and every other control character become
    spaces (runs collapse to one); bidirectional overrides are dropped;
    ``<memory_policy>``/``</memory_policy>`` in any case or spacing become ``‹...›`` so
    they can neither open nor close the policy block; the 📝/💡 header glyphs are removed
    so no header can be forged; a leading ``---`` becomes an em dash. The result is one
    line with no leading or trailing space.
    """
    if not text:
        return ""
    s = _LINE_BREAKS.sub(" ", str(text))
    s = "".join(" " if unicodedata.category(ch) == "Cc" else ch for ch in s if ord(ch) not in _BIDI)
    s = _POLICY_TAG.sub(lambda m: "‹" + m.group(1) + "›", s)
    s = _HEADER_GLYPHS.sub("", s)
    s = _SPACES.sub(" ", s).strip()
    s = re.sub(r"^-{3,}", "—", s)
    return s


def format_score(value: float) -> str:
    """A number without trailing zeros: ``90.0 -> '90'``, ``87.5 -> '87.5'``."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def _note_line(note: Note) -> str:
    head = (
        f"[{note.type}, {note.created_at.date().isoformat()}]"
        if note.created_at
        else f"[{note.type}]"
    )
    if note.status == NoteStatus.PROVISIONAL.value:
        head += " (provisional)"
    return f"{head} {one_line(note.note)}"


def render_notes(notes: Sequence[Note], *, include_memory_policy: bool = True) -> str:
    """The notes block of reference §3.4 ("" for no notes).

    The memory policy (unless disabled), then the provisional block (only when a note is
    Provisional) and the established block (only when another note is), each note as
    ``[Type, YYYY-MM-DD]`` (+ `` (provisional)``) + text, ``  Scope: <label>`` and an empty
    line; finally ``---``. Lines are joined with ``"\\n"``; within a block the given
    (ranked) order is kept.
    """
    if not notes:
        return ""
    provisional = [n for n in notes if n.status == NoteStatus.PROVISIONAL.value]
    established = [n for n in notes if n.status != NoteStatus.PROVISIONAL.value]
    lines: list[str] = list(MEMORY_POLICY) if include_memory_policy else []
    if provisional:
        lines += [f"📝 RECENT NOTES ({len(provisional)} provisional — newest signal)", ""]
        for n in provisional:
            lines += [_note_line(n), f"  Scope: {scope_label(n)}", ""]
    if established:
        lines += [f"📝 AGENT NOTES ({len(established)})", ""]
        for n in established:
            lines += [_note_line(n), f"  Scope: {scope_label(n)}", ""]
    lines.append("---")
    return "\n".join(lines)


def render_examples(examples: Sequence[Example]) -> str:
    """The examples block of reference §3.4 ("" for no examples): header, then per example
    ``Example i:``, ``Q: ...``, ``A: ...``, ``  (Success Score: s/100)`` when the score is
    truthy, an empty line; finally ``---``."""
    if not examples:
        return ""
    lines = [f"💡 RELEVANT EXAMPLES ({len(examples)})", ""]
    for i, e in enumerate(examples, start=1):
        lines += [
            f"Example {i}:",
            f"Q: {one_line(e.example_input)}",
            f"A: {one_line(e.example_output)}",
        ]
        if e.success_score:
            lines.append(f"  (Success Score: {format_score(e.success_score)}/100)")
        lines.append("")
    lines.append("---")
    return "\n".join(lines)


def render_message(notes_block: str, examples_block: str) -> str:
    """The one system message (reference §3.1): each non-empty block followed by a blank
    line, i.e. ``notes + "\\n\\n" + examples + "\\n\\n"``; ``""`` when both are empty."""
    return "".join(block + "\n\n" for block in (notes_block, examples_block) if block)


# =========================================================================== reranker


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


@dataclass(frozen=True)
class Candidate(Generic[T]):
    """One retrieved item with its retrieval signals and fused score."""

    item: T
    text: str
    cosine: float | None = None
    bm25: float | None = None
    score: float = 0.0

    @property
    def created_ts(self) -> float:
        created = self.item.created_at
        return created.timestamp() if created else 0.0


def rank_key(c: Candidate) -> tuple[float, float, str]:
    """Sort key: score descending, then newest, then id (total, deterministic)."""
    return (-c.score, -c.created_ts, c.item.id)


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
        import litellm

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


# =========================================================================== fusion


_TURN = re.compile(r"^(.*?)(\d+)$")


def turn_position(detail_id: str | None) -> tuple[str, int] | None:
    """A turn id split into its prefix and trailing number (``"D3:12" -> ("D3:", 12)``);
    None when it does not end in a number (e.g. most UUIDs)."""
    if not detail_id:
        return None
    m = _TURN.match(detail_id)
    return (m.group(1), int(m.group(2))) if m else None


def fuse(
    vector_hits: Sequence[Hit[T]],
    text_hits: Sequence[Hit[T]],
    *,
    text_of: Callable[[T], str],
    floor: float,
    vector_weight: float = 0.5,
    text_weight: float = 0.5,
    context_weight: float = 0.0,
    neighbour_weight: float = 0.0,
    conversation_of: Callable[[T], str | None] | None = None,
    turn_of: Callable[[T], str | None] | None = None,
    cosines: Mapping[str, float] | None = None,
) -> list[Candidate[T]]:
    """Fuse cosine and BM25 candidates into one ranked list (pure).

    Vector part: ``(cos - floor) / (best cos - floor)`` clipped to [0, 1], where ``best
    cos`` is the best vector hit and a text-only hit takes its cosine from ``cosines``
    (0 when absent); text part: ``bm25 / best bm25``. Conversation context then adds, to
    every candidate with a source conversation, ``context_weight`` times the best base
    score of another candidate from the same conversation, and ``neighbour_weight`` times
    the best base score of a candidate from the adjacent turn of that conversation (turn
    ids with the same prefix whose trailing numbers differ by one, see
    :func:`turn_position`). Sorted by :func:`rank_key`.
    """
    items: dict[str, T] = {}
    cos: dict[str, float] = {}
    bm: dict[str, float] = {}
    for h in vector_hits:
        items.setdefault(h.item.id, h.item)
        cos[h.item.id] = max(cos.get(h.item.id, -1.0), h.score)
    best_cos = max(cos.values(), default=floor)
    for h in text_hits:
        items.setdefault(h.item.id, h.item)
        bm[h.item.id] = max(bm.get(h.item.id, 0.0), h.score)
        if h.item.id not in cos and cosines and h.item.id in cosines:
            cos[h.item.id] = float(cosines[h.item.id])
    span = best_cos - floor
    best_bm = max(bm.values(), default=0.0)
    base: dict[str, float] = {}
    for i in items:
        v = 0.0
        if i in cos:
            v = 1.0 if span <= 1e-9 else min(1.0, max(0.0, (cos[i] - floor) / span))
        t = bm[i] / best_bm if i in bm and best_bm > 0 else 0.0
        base[i] = vector_weight * v + text_weight * t
    final = dict(base)
    if (context_weight or neighbour_weight) and conversation_of is not None:
        groups: dict[str, list[str]] = {}
        for i, item in items.items():
            key = conversation_of(item)
            if key:
                groups.setdefault(key, []).append(i)
        for members in groups.values():
            if len(members) < 2:
                continue
            ranked = sorted(members, key=lambda i: (-base[i], i))
            first, second = ranked[0], ranked[1]
            by_turn: dict[tuple[str, int], str] = {}
            if neighbour_weight and turn_of is not None:
                for i in members:
                    pos = turn_position(turn_of(items[i]))
                    if pos is not None:
                        by_turn.setdefault(pos, i)
            for i in members:
                final[i] += context_weight * base[second if i == first else first]
                pos = turn_position(turn_of(items[i])) if by_turn and turn_of else None
                if pos is not None:
                    near = [
                        base[by_turn[(pos[0], pos[1] + d)]]
                        for d in (-1, 1)
                        if (pos[0], pos[1] + d) in by_turn
                    ]
                    if near:
                        final[i] += neighbour_weight * max(near)
    out = [
        Candidate(
            item=items[i], text=text_of(items[i]), cosine=cos.get(i), bm25=bm.get(i), score=final[i]
        )
        for i in items
    ]
    return sorted(out, key=rank_key)


# =========================================================================== retrieval


@dataclass(frozen=True)
class RunScope:
    """A run's resolved scope: the store prefilter and the exact multi-tenant post-filter."""

    agent_id: str
    user_id: str | None
    company_id: str | None
    primary_entity: str | None
    primary_record: str | None
    secondary: dict[str, Any] | None
    config: SecondaryScopeConfig

    @classmethod
    def of(cls, ctx: RunContext, agent: AgentConfig) -> RunScope:
        try:
            config = SecondaryScopeConfig.from_value(agent.scope_config)
        except ConfigError as e:  # a row stored before configure_agent checked it: fail closed
            raise ConfigError(
                f"agent {agent.agent_id!r} has a malformed scope_config ({e});"
                " fix it with configure_agent"
            ) from e
        return cls(
            agent_id=ctx.agent_id,
            user_id=None if config.shared_only else ctx.user_id,
            company_id=ctx.company_id,
            primary_entity=ctx.primary_scope_entity_id,
            primary_record=ctx.primary_scope_record_id,
            secondary=resolve_run_scopes(ctx.secondary_scopes, config),
            config=config,
        )

    @property
    def needs_post_filter(self) -> bool:
        return post_filter_needed(self.primary_record, self.secondary)

    def keep(self, item: Note | Example) -> bool:
        if not self.needs_post_filter:
            return True
        return item_matches(
            item, self.primary_entity, self.primary_record, self.secondary, self.config
        )

    def prefilter(self) -> Cond:
        return multi_tenant_prefilter(self.primary_record, self.secondary)


def not_expired(now: datetime) -> Cond:
    """Rows without ``expires_at`` or expiring after ``now``."""
    return or_(is_null("expires_at"), cmp("expires_at", ">", now))


def note_filter(scope: RunScope, now: datetime) -> Cond:
    """Injectable, unexpired notes inside the run's lattice and multi-tenant prefilter."""
    return and_(
        injectable(),
        not_expired(now),
        note_scope_filter(scope.agent_id, scope.user_id, scope.company_id),
        scope.prefilter(),
    )


def example_filter(scope: RunScope, now: datetime) -> Cond:
    """Active, unexpired examples of the run's agent inside its user/company scope."""
    return and_(
        eq("status", ExampleStatus.ACTIVE.value),
        not_expired(now),
        example_scope_filter(scope.agent_id, scope.user_id, scope.company_id),
        scope.prefilter(),
    )


def _search(
    search: Callable[[int], list[Hit[T]]],
    keep: Callable[[T], bool],
    want: int,
    start: int,
    cap: int,
) -> list[Hit[T]]:
    """Run ``search(n)`` and post-filter, growing ``n`` until ``want`` hits are kept or the
    results are exhausted (fewer than ``n`` came back) or ``cap`` is reached."""
    n = max(1, start)
    while True:
        hits = search(n)
        kept = [h for h in hits if keep(h.item)]
        if len(kept) >= want or len(hits) < n or n >= cap:
            return kept
        n = min(n * 4, cap)


_SCAN_COLUMNS = (
    "id",
    "created_at",
    "primary_scope_entity_id",
    "primary_scope_record_id",
    "secondary_scopes",
)


def _ordered_ids(
    table: Any, where: Cond, scope: RunScope, sort: Callable[[dict], Any], k: int
) -> list[str]:
    """Scan only the ordering columns of the matching rows, post-filter, sort, take ``k``."""
    cols = list(_SCAN_COLUMNS)
    if table.model is Note:
        cols.append("type")
    else:
        cols.append("success_score")
    rows = table.scan(where, columns=cols).to_dict("records")
    kept = []
    for r in rows:
        if scope.needs_post_filter and not item_matches(
            _RowView(r), scope.primary_entity, scope.primary_record, scope.secondary, scope.config
        ):
            continue
        kept.append(r)
    kept.sort(key=sort)
    return [r["id"] for r in kept[:k]]


class _RowView:
    """Attribute access over a scanned row, for the multi-tenant matcher."""

    def __init__(self, row: Mapping[str, Any]):
        self._row = row

    def __getattr__(self, name: str) -> Any:
        value = self._row.get(name)
        return None if _is_missing(value) else value


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN / NaT
    except Exception:
        return False


def _ts(value: Any) -> float:
    if _is_missing(value):
        return 0.0
    try:
        return float(value.timestamp())
    except Exception:
        return 0.0


_TYPE_RANK = {t.value: i for i, t in enumerate(TYPE_ORDER)}


def _newest_key(r: Mapping[str, Any]) -> tuple[float, str]:
    return (-_ts(r.get("created_at")), r["id"])


def _type_key(r: Mapping[str, Any]) -> tuple[int, float, str]:
    return (_TYPE_RANK.get(r.get("type"), len(_TYPE_RANK)), -_ts(r.get("created_at")), r["id"])


def _rated_key(r: Mapping[str, Any]) -> tuple[float, float, str]:
    score = r.get("success_score")
    return (-(0.0 if _is_missing(score) else float(score)), -_ts(r.get("created_at")), r["id"])


def _by_ids(table: Any, ids: list[str]) -> list:
    return table.get_many(ids) if ids else []


def _conversation_of(note: Note) -> str | None:
    return note.source_conversation_id


def _turn_of(note: Note) -> str | None:
    return note.source_conversation_detail_id


def relevant_notes(
    mem: MemoryContext,
    scope: RunScope,
    where: Cond,
    query: str,
    query_vector: np.ndarray | None,
    k: int,
    reranker: RerankerConfig,
) -> list[Note]:
    """The hybrid ``Relevant`` path: fused vector + full-text candidates, reranked when the
    agent configures a reranker; at most ``k`` notes."""
    cfg: InjectConfig = mem.inject_config
    table = mem.store.notes
    fetch_k = k * reranker.retrieval_multiplier if reranker.enabled else k
    pool = max(cfg.candidate_pool, fetch_k)
    start = pool * 4 if scope.needs_post_filter else pool
    vector_hits: list[Hit[Note]] = []
    if query_vector is not None:
        vector_hits = _search(
            lambda n: table.vector_search(
                query_vector, where=where, k=n, min_similarity=cfg.min_similarity
            ),
            scope.keep,
            pool,
            start,
            cfg.max_fetch,
        )[:pool]
    fts = text_query(query)
    text_hits = _search(
        lambda n: table.text_search(fts, where=where, k=n), scope.keep, pool, start, cfg.max_fetch
    )[:pool]
    cosines: dict[str, float] = {}
    if query_vector is not None:
        seen = {h.item.id for h in vector_hits}
        missing = [h.item.id for h in text_hits if h.item.id not in seen]
        if missing:
            for note_id, vec in table.vectors(missing).items():
                cosines[note_id] = float(np.dot(vec, query_vector))
    candidates = fuse(
        vector_hits,
        text_hits,
        cosines=cosines,
        text_of=lambda n: n.note,
        floor=cfg.min_similarity,
        vector_weight=cfg.vector_weight if query_vector is not None else 0.0,
        text_weight=cfg.text_weight,
        context_weight=cfg.context_weight,
        neighbour_weight=cfg.neighbour_weight,
        conversation_of=_conversation_of,
        turn_of=_turn_of,
    )[:fetch_k]
    if reranker.enabled:
        candidates = rerank(query, candidates, k, reranker, timeout_s=cfg.reranker_timeout_s)
    return [c.item for c in candidates[:k]]


def select_notes(
    mem: MemoryContext,
    scope: RunScope,
    agent: AgentConfig,
    query: str | None,
    query_vector: np.ndarray | None,
    now: datetime,
) -> list[Note]:
    """The notes to inject, in ranked order, by the agent's note strategy."""
    k = agent.max_notes_to_inject
    if k <= 0:
        return []
    where = note_filter(scope, now)
    table = mem.store.notes
    strategy = agent.note_injection_strategy
    if strategy == NoteInjectionStrategy.RELEVANT.value and query:
        reranker = RerankerConfig.from_value(agent.reranker_config)
        found = relevant_notes(mem, scope, where, query, query_vector, k, reranker)
        if found or query_vector is not None:
            return found
        # embedding failed and the text found nothing: degrade to the All order
    sort = _newest_key if strategy == NoteInjectionStrategy.RECENT.value else _type_key
    return _by_ids(table, _ordered_ids(table, where, scope, sort, k))


def select_examples(
    mem: MemoryContext,
    scope: RunScope,
    agent: AgentConfig,
    query: str | None,
    query_vector: np.ndarray | None,
    now: datetime,
) -> list[Example]:
    """The examples to inject, in ranked order, by the agent's example strategy.

    ``Semantic`` with an input: nearest examples (by ``example_input``) above
    ``example_min_similarity``, reranked when ``rerankExamples`` is set; without an input
    (or a query vector) it falls back to the ``Rated`` order.
    """
    k = agent.max_examples_to_inject
    if k <= 0:
        return []
    cfg: InjectConfig = mem.inject_config
    where = example_filter(scope, now)
    table = mem.store.examples
    strategy = agent.example_injection_strategy
    if strategy == ExampleInjectionStrategy.SEMANTIC.value and query and query_vector is not None:
        reranker = RerankerConfig.from_value(agent.reranker_config)
        use_rerank = reranker.enabled and reranker.rerank_examples
        fetch_k = k * reranker.retrieval_multiplier if use_rerank else k
        start = fetch_k * 4 if scope.needs_post_filter else fetch_k
        hits = _search(
            lambda n: table.vector_search(
                query_vector, where=where, k=n, min_similarity=cfg.example_min_similarity
            ),
            scope.keep,
            fetch_k,
            start,
            cfg.max_fetch,
        )
        candidates = [
            Candidate(item=h.item, text=h.item.example_input, cosine=h.score, score=h.score)
            for h in hits
        ]
        candidates = sorted(candidates, key=rank_key)[:fetch_k]
        if use_rerank:
            candidates = rerank(query, candidates, k, reranker, timeout_s=cfg.reranker_timeout_s)
        return [c.item for c in candidates[:k]]
    sort = _newest_key if strategy == ExampleInjectionStrategy.RECENT.value else _rated_key
    return _by_ids(table, _ordered_ids(table, where, scope, sort, k))


# =========================================================================== attribution


def attribution(notes: Sequence[Note], examples: Sequence[Example]) -> dict[str, Any]:
    """The ``memoryAttribution`` object of reference §2.5."""
    return {
        "injectedNoteIds": [n.id for n in notes],
        "injectedNotes": [
            {"id": n.id, "type": n.type, "content": n.note[:100], "scope": scope_label(n)}
            for n in notes
        ],
        "injectedExampleIds": [e.id for e in examples],
        "noteCount": len(notes),
        "exampleCount": len(examples),
    }


def record_attribution(
    mem: MemoryContext, ctx: RunContext, notes: Sequence[Note], examples: Sequence[Example], when: datetime
) -> None:
    """Append one ``injection_events`` row per injected item and, when the context has a run
    id, the 'Memory Injection' audit step; one SQL transaction, no note is touched."""
    base = {
        "run_id": ctx.run_id,
        "agent_id": ctx.agent_id,
        "user_id": ctx.user_id,
        "company_id": ctx.company_id,
        "injected_at": when,
    }
    events = [
        {**base, "item_kind": "note", "item_id": n.id, "rank": r} for r, n in enumerate(notes, 1)
    ]
    events += [
        {**base, "item_kind": "example", "item_id": e.id, "rank": r}
        for r, e in enumerate(examples, 1)
    ]
    step = None
    if ctx.run_id:
        step = {
            "run_id": ctx.run_id,
            "step_type": STEP_TYPE,
            "step_name": STEP_NAME,
            "agent_id": ctx.agent_id,
            "user_id": ctx.user_id,
            "input": {"companyId": ctx.company_id},
            "output": {"memoryAttribution": attribution(notes, examples)},
            "started_at": when,
            "finished_at": when,
        }
    mem.sources.record_injection(events, step)


# =========================================================================== entry point


def _query_vector(mem: MemoryContext, query: str) -> np.ndarray | None:
    try:
        return np.asarray(mem.embed([query])[0], dtype=np.float32)
    except EmbeddingError as e:
        log.warning("query embedding failed, ranking by full text only: %s", e)
        return None


def inject(
    mem: MemoryContext,
    ctx: RunContext,
    current_input: str | None = None,
    *,
    query_vector: np.ndarray | None = None,
) -> Injection:
    """Select, rank and render the notes and examples to prepend to a run.

    Reads the agent's configuration (``UnknownAgentError`` for an unknown agent), the
    note and example tables (prefiltered by scope) and the clock; writes only
    attribution rows. ``query_vector`` lets a caller pass a precomputed embedding of
    ``current_input`` (benchmarks); otherwise the input is embedded once, as given, and
    shared by the note and example searches.
    """
    agent: AgentConfig = get_agent(mem.sources, ctx.agent_id)
    if not agent.inject_notes and not agent.inject_examples:
        return Injection()
    cfg: InjectConfig = mem.inject_config
    now = mem.now()
    scope = RunScope.of(ctx, agent)
    query = current_input if current_input and current_input.strip() else None
    needs_vector = query is not None and (
        (
            agent.inject_notes
            and agent.note_injection_strategy == NoteInjectionStrategy.RELEVANT.value
        )
        or (
            agent.inject_examples
            and agent.example_injection_strategy == ExampleInjectionStrategy.SEMANTIC.value
        )
    )
    vec = None
    if needs_vector:
        vec = (
            np.asarray(query_vector, dtype=np.float32)
            if query_vector is not None
            else _query_vector(mem, query)
        )
    notes = select_notes(mem, scope, agent, query, vec, now) if agent.inject_notes else []
    examples = select_examples(mem, scope, agent, query, vec, now) if agent.inject_examples else []
    message = render_message(
        render_notes(notes, include_memory_policy=cfg.include_memory_policy),
        render_examples(examples),
    )
    if cfg.record_attribution:
        record_attribution(mem, ctx, notes, examples, now)
    return Injection(message=message, notes=notes, examples=examples)


__all__ = [
    "MEMORY_POLICY",
    "Candidate",
    "InjectConfig",
    "Injection",
    "RerankError",
    "RerankerConfig",
    "RunScope",
    "attribution",
    "cross_score_rerank",
    "format_score",
    "fuse",
    "inject",
    "note_filter",
    "example_filter",
    "one_line",
    "render_examples",
    "render_message",
    "render_notes",
    "rerank",
    "turn_position",
]
