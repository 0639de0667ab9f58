"""Explain "why does (or doesn't) my agent remember X?", one note about the topic at a time.

:func:`explain` follows the guide's troubleshooting order (memory-guide §6) for every
note about the topic, in any status, that the run context may see: the notes inside its
scope lattice and multi-tenant scopes (:mod:`memory_pipelines.scoping`, the visibility
injection uses). Other users', companies' and tenants' notes are not searched, so their
text, ids and existence never reach an agent-facing caller (HTTP, MCP). The operator
view ``all_scopes`` (``memory-pipelines why --all-scopes``) searches every note of the
agent and the cross-agent ones (every agent's with ``all_agents`` too) and names the
rule that excludes each out-of-scope note:

1. the status, and whether it is injectable (``INJECTABLE_STATUSES``) and unexpired;
2. whether it is in scope for the run context, at which lattice level and label, or
   which rule of :mod:`memory_pipelines.scoping` excludes it;
3. its rank under the agent's strategy, from the very retrieval the injection path runs
   (:func:`memory_pipelines.injection.select_notes`, with ``current_input`` or the topic
   as input), and whether that rank is within ``max_notes_to_inject``;
4. how it got there (author, source run/conversation/turn, the ``Memory Write`` audit
   steps naming it, the Memory Manager phase that created it) and what merged, revoked
   or archived it (comment markers, ``consolidated_into_note_id`` followed to the
   survivor, ``derived_from_note_ids`` and absorbed notes followed back to the sources);
5. when its TTL or Ebbinghaus decay (:mod:`memory_pipelines.phases.ebbinghaus`) retires it.

It reads the note store, the audit tables and the clock and writes nothing: no
attribution row, no access bump. The result is a pydantic :class:`Explanation`
(JSON-serialisable); ``memory-pipelines why`` renders it as a table.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from pydantic import BaseModel
from sqlalchemy import func, select

from memory_pipelines.agents import get_agent
from memory_pipelines.config import DecayConfig, InjectConfig
from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import EmbeddingError, ValidationError
from memory_pipelines.injection import RunScope, fuse, select_notes
from memory_pipelines.limits import check_count, limits
from memory_pipelines.notes import (
    AgentConfig,
    AuthorType,
    Note,
    NoteInjectionStrategy,
    NoteStatus,
    ProtectionTier,
    RunContext,
    is_injectable,
)
from memory_pipelines.phases.common import config_of
from memory_pipelines.phases.ebbinghaus import (
    days_untouched,
    decay_factor,
    effective_lambda,
    is_expired,
    retention,
)
from memory_pipelines.scoping import (
    STRICT,
    ScopeValidationError,
    SecondaryScopeConfig,
    dimensions_match,
    in_lattice,
    item_matches,
    lattice_level,
    note_scope_filter,
    parse_scopes,
    scope_label,
)
from memory_pipelines.sources import injection_events, run_steps
from memory_pipelines.store import Hit, and_, eq, in_, is_null, or_
from memory_pipelines.terminal import printable
from memory_pipelines.text import text_query

#: notes explained per call unless the caller asks for another number
DEFAULT_LIMIT = 10
#: how deep the extended ranking goes to place a note that is below the cut
EXTENDED_RANK = 50
#: a note found by the plain substring scan ranks above any search-only match
SUBSTRING_BONUS = 1.0
#: the audit step every in-flight write records (memory_pipelines.writes.STEP_NAME)
WRITE_STEP_NAME = "Memory Write"
_LINEAGE_DEPTH = 20
_SOURCES_CAP = 200


# =========================================================================== models


class MatchInfo(BaseModel):
    """How the note was found for the topic."""

    score: float
    substring: bool = False
    cosine: float | None = None
    bm25: float | None = None


class ScopeCheck(BaseModel):
    """Step 2: is the note in scope for the context, and at which lattice level."""

    in_scope: bool
    level: int
    label: str
    rule: str | None = None
    detail: str


class RankCheck(BaseModel):
    """Step 3: the note's rank under the agent's strategy for the input."""

    strategy: str
    input: str | None
    inject_notes: bool
    max_notes: int
    rank: int | None = None
    injected_count: int = 0
    within_limit: bool = False
    detail: str


class WriteRecord(BaseModel):
    """One ``Memory Write`` audit step whose output names the note."""

    run_id: str
    disposition: str | None
    reason: str | None = None
    final_scope: dict[str, Any] | None = None
    status: str | None = None
    at: datetime | None = None


class LifecycleEvent(BaseModel):
    """One thing that happened to the note, from its audit markers and columns."""

    kind: str
    detail: str
    related_note_id: str | None = None
    at: datetime | None = None


class Provenance(BaseModel):
    """Step 4: who created the note, from what, and what happened to it since."""

    author_type: str
    is_auto_generated: bool
    origin: str
    source_run_id: str | None = None
    source_conversation_id: str | None = None
    source_conversation_detail_id: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    writes: list[WriteRecord] = []
    events: list[LifecycleEvent] = []
    times_injected: int = 0
    last_injected_at: datetime | None = None


class Lineage(BaseModel):
    """Step 4: the merge lineage, both ways."""

    merged_into: list[str] = []
    survivor_id: str | None = None
    survivor_status: str | None = None
    derived_from: list[str] = []
    absorbed: list[str] = []
    all_sources: list[str] = []


class Retirement(BaseModel):
    """Step 5: when TTL or decay retires the note."""

    expires_at: datetime | None = None
    expired: bool = False
    ttl: str
    decay: str
    decay_applies: bool = False
    decay_score_now: float | None = None
    retires_at: datetime | None = None
    days_left: float | None = None


class NoteExplanation(BaseModel):
    """Everything :func:`explain` found out about one note, with a one-line verdict."""

    note_id: str
    note: str
    type: str
    status: str
    injectable: bool
    agent_id: str | None = None
    user_id: str | None = None
    company_id: str | None = None
    verdict: str
    code: str
    match: MatchInfo
    scope: ScopeCheck
    rank: RankCheck
    provenance: Provenance
    lineage: Lineage
    retirement: Retirement


class AgentSummary(BaseModel):
    """The agent settings the explanation depends on."""

    agent_id: str
    status: str
    inject_notes: bool
    max_notes_to_inject: int
    note_injection_strategy: str
    auto_archive_enabled: bool
    shared_only: bool = False


class Explanation(BaseModel):
    """The answer of :func:`explain`: the notes about a topic and why each is (not) injected."""

    topic: str
    current_input: str | None = None
    context: RunContext
    agent: AgentSummary
    generated_at: datetime
    injected_note_ids: list[str] = []
    context_problem: str | None = None
    all_scopes: bool = False
    notes: list[NoteExplanation] = []


# =========================================================================== finding notes


def _embed(mem: MemoryContext, text: str) -> np.ndarray | None:
    try:
        return np.asarray(mem.embed([text])[0], dtype=np.float32)
    except EmbeddingError:
        return None


def visible(note: Note, scope: RunScope) -> bool:
    """Whether the run scope may see the note: the lattice and the multi-tenant matcher,
    the rules injection applies (whatever the note's status)."""
    return in_lattice(
        note.agent_id,
        note.user_id,
        note.company_id,
        scope.agent_id,
        scope.user_id,
        scope.company_id,
    ) and item_matches(
        note, scope.primary_entity, scope.primary_record, scope.secondary, scope.config
    )


def find_notes(
    mem: MemoryContext,
    agent_id: str,
    topic: str,
    limit: int,
    *,
    all_agents: bool = False,
    scope: RunScope | None = None,
) -> list[tuple[Note, MatchInfo]]:
    """The notes about ``topic`` in any status, best first, at most ``limit``.

    Searched: with a ``scope``, only the notes it may see (:func:`visible`, prefiltered
    in the store); without one, the agent's notes and the cross-agent ones (every
    agent's with ``all_agents``). By cosine above the injection floor, by BM25 full
    text, and by a plain case-insensitive substring scan (the guide's
    ``LIKE '%topic%'``). Cosine and BM25 are fused as injection fuses them; a substring
    match adds :data:`SUBSTRING_BONUS`. Ties break by newest, then id.
    """
    cfg: InjectConfig = mem.inject_config
    table = mem.store.notes
    pool = max(limit * 5, 50)
    if scope is not None:
        where = and_(
            note_scope_filter(scope.agent_id, scope.user_id, scope.company_id), scope.prefilter()
        )
        pool = pool * 4 if scope.needs_post_filter else pool
    else:
        where = None if all_agents else or_(eq("agent_id", agent_id), is_null("agent_id"))
    vec = _embed(mem, topic)
    vector_hits: list[Hit[Note]] = []
    if vec is not None:
        vector_hits = table.vector_search(
            vec, where=where, k=pool, min_similarity=cfg.min_similarity
        )
    text_hits = table.text_search(text_query(topic), where=where, k=pool) if table.count() else []
    fused = fuse(
        vector_hits,
        text_hits,
        text_of=lambda n: n.note,
        floor=cfg.min_similarity,
        vector_weight=cfg.vector_weight if vec is not None else 0.0,
        text_weight=cfg.text_weight,
    )
    found: dict[str, tuple[Note, MatchInfo]] = {
        c.item.id: (c.item, MatchInfo(score=c.score, cosine=c.cosine, bm25=c.bm25)) for c in fused
    }
    needle = topic.strip().lower()
    frame = table.scan(where, columns=["id", "note"])
    if len(frame) and needle:
        hits = frame[frame["note"].fillna("").str.lower().str.contains(needle, regex=False)]
        ids = hits["id"].tolist()
        missing = [i for i in ids if i not in found]
        vectors = table.vectors(missing) if vec is not None and missing else {}
        for n in table.get_many(missing):
            v = vectors.get(n.id)
            cos = float(np.dot(v, vec)) if v is not None and vec is not None else None
            found[n.id] = (n, MatchInfo(score=0.0, cosine=cos))
        for i in ids:
            if i in found:
                note, m = found[i]
                found[i] = (
                    note,
                    m.model_copy(update={"substring": True, "score": m.score + SUBSTRING_BONUS}),
                )
    if scope is not None:
        found = {i: item for i, item in found.items() if visible(item[0], scope)}

    def key(item: tuple[Note, MatchInfo]) -> tuple[float, float, str]:
        n, m = item
        return (-m.score, -(n.created_at.timestamp() if n.created_at else 0.0), n.id)

    return sorted(found.values(), key=key)[:limit]


# =========================================================================== scope (step 2)


def _scope_of(ctx: RunContext, agent: AgentConfig) -> tuple[RunScope, str | None]:
    """The injection path's scope for the context; a context that fails the agent's
    ``strictValidation`` is returned unresolved with the problem."""
    try:
        return RunScope.of(ctx, agent), None
    except ScopeValidationError as e:
        config = SecondaryScopeConfig.from_value(agent.scope_config)
        scope = RunScope(
            agent_id=ctx.agent_id,
            user_id=None if config.shared_only else ctx.user_id,
            company_id=ctx.company_id,
            primary_entity=ctx.primary_scope_entity_id,
            primary_record=ctx.primary_scope_record_id,
            secondary=dict(ctx.secondary_scopes or {}) or None,
            config=config,
        )
        return scope, f"the context fails the agent's secondary-scope validation: {e}"


def _lattice_rule(note: Note, ctx: RunContext, scope: RunScope) -> str | None:
    """Which lattice rule excludes the note (None when the lattice admits it)."""
    if note.agent_id and note.agent_id != ctx.agent_id:
        return f"different agent: belongs to agent {note.agent_id}, context agent is {ctx.agent_id}"
    if note.user_id and note.user_id != scope.user_id:
        if scope.user_id is None and scope.config.shared_only and ctx.user_id:
            return (
                f"user-specific note (user {note.user_id}) but agent {ctx.agent_id} is shared-only: "
                "notes with a user are never injected"
            )
        if scope.user_id is None:
            return f"user-specific note but the context has no user (the note belongs to user {note.user_id})"
        return f"belongs to user {note.user_id}, context user is {scope.user_id}"
    if note.company_id and note.company_id != scope.company_id:
        if scope.company_id is None:
            return (
                "company-specific note but the context has no company "
                f"(the note belongs to company {note.company_id})"
            )
        return f"belongs to company {note.company_id}, context company is {scope.company_id}"
    return None


def _dimension_rule(
    note_scopes: dict[str, Any], run: dict[str, Any], config: SecondaryScopeConfig
) -> str:
    for name, value in note_scopes.items():
        sub = {name: run[name]} if name in run else {}
        if not dimensions_match({name: value}, sub, config):
            mode = config.mode_for(name)
            if name not in run:
                return f"secondary scope dimension {name} {mode} mismatch: the note has {name}={value}, the context has none"
            return f"secondary scope dimension {name} {mode} mismatch: the note has {name}={value}, the context has {run[name]}"
    for name, value in run.items():
        if config.mode_for(name) == STRICT and name not in note_scopes:
            return f"secondary scope dimension {name} strict mismatch: the context has {name}={value}, the note does not carry it"
    return "secondary scopes do not match"


def _multi_tenant_rule(note: Note, scope: RunScope) -> str:
    """Which branch of the multi-tenant matcher rejects the note (reference §3.3)."""
    try:
        note_scopes = parse_scopes(note.secondary_scopes) or {}
    except ValueError:
        return "the note's secondary scopes are malformed"
    primary = note.primary_scope_record_id
    run_secondary = dict(scope.secondary or {})
    if not scope.primary_record:
        if primary:
            return f"note has primary scope {primary} but the context has no primary scope"
        if not scope.config.allow_secondary_only:
            return (
                f"note has secondary scopes {note_scopes} but the context has no primary scope "
                "(and the agent does not allowSecondaryOnly)"
            )
        if not run_secondary:
            return f"note has secondary scopes {note_scopes} but the context has none"
        return _dimension_rule(note_scopes, run_secondary, scope.config)
    if primary != scope.primary_record:
        if not primary:
            return f"note has secondary scopes but no primary scope; the context's primary scope is {scope.primary_record}"
        return (
            f"belongs to primary scope {primary}, context primary scope is {scope.primary_record}"
        )
    entity = note.primary_scope_entity_id
    if entity and scope.primary_entity and entity != scope.primary_entity:
        return f"primary scope entity {entity} differs from the context's {scope.primary_entity}"
    if not run_secondary:
        return f"note has secondary scopes {note_scopes} but the context has none"
    return _dimension_rule(note_scopes, run_secondary, scope.config)


def check_scope(note: Note, ctx: RunContext, scope: RunScope) -> ScopeCheck:
    """Step 2 for one note: the lattice of :mod:`scoping`, then its multi-tenant matcher."""
    level = lattice_level(note.agent_id, note.user_id, note.company_id)
    label = scope_label(note)
    lattice_ok = in_lattice(
        note.agent_id, note.user_id, note.company_id, ctx.agent_id, scope.user_id, scope.company_id
    )
    if not lattice_ok:
        rule = _lattice_rule(note, ctx, scope) or "outside the context's scope lattice"
        return ScopeCheck(
            in_scope=False, level=level, label=label, rule=rule, detail=f"out of scope: {rule}"
        )
    if not item_matches(
        note, scope.primary_entity, scope.primary_record, scope.secondary, scope.config
    ):
        rule = _multi_tenant_rule(note, scope)
        return ScopeCheck(
            in_scope=False, level=level, label=label, rule=rule, detail=f"out of scope: {rule}"
        )
    return ScopeCheck(
        in_scope=True,
        level=level,
        label=label,
        detail=f"in scope at lattice level {level} ({label})",
    )


# =========================================================================== rank (step 3)


class _Ranking:
    """The injection path's ranking for the context: the injected notes, and (computed
    only when needed) a deeper ranking that places the notes below the cut."""

    def __init__(self, mem: MemoryContext, agent: AgentConfig, scope: RunScope, query: str):
        self.mem = mem
        self.agent = agent
        self.scope = scope
        self.query = query
        self.now = mem.now()
        relevant = agent.note_injection_strategy == NoteInjectionStrategy.RELEVANT.value
        self.vec = _embed(mem, query) if relevant else None
        self.injected: list[str] = []
        self._extended: list[str] | None = None
        if agent.inject_notes and agent.max_notes_to_inject > 0:
            self.injected = [n.id for n in self._select(agent)]

    def _select(self, agent: AgentConfig) -> list[Note]:
        return select_notes(self.mem, self.scope, agent, self.query, self.vec, self.now)

    @property
    def depth(self) -> int:
        return max(self.agent.max_notes_to_inject, EXTENDED_RANK)

    def rank_of(self, note_id: str) -> int | None:
        """1-based rank: the injected notes first, then the deeper ranking's others."""
        if note_id in self.injected:
            return self.injected.index(note_id) + 1
        if self._extended is None:
            deeper = self.agent.model_copy(update={"max_notes_to_inject": self.depth})
            ids = [n.id for n in self._select(deeper)]
            self._extended = self.injected + [i for i in ids if i not in self.injected]
        if note_id in self._extended:
            return self._extended.index(note_id) + 1
        return None


def _cosine(mem: MemoryContext, note_id: str, vec: np.ndarray | None) -> float | None:
    if vec is None:
        return None
    v = mem.store.notes.vectors([note_id]).get(note_id)
    return None if v is None else float(np.dot(v, vec))


def check_rank(mem: MemoryContext, note: Note, ranking: _Ranking, eligible: bool) -> RankCheck:
    """Step 3 for one note (``eligible``: injectable, unexpired and in scope)."""
    agent = ranking.agent
    k = agent.max_notes_to_inject
    base = {
        "strategy": str(agent.note_injection_strategy),
        "input": ranking.query,
        "inject_notes": agent.inject_notes,
        "max_notes": k,
        "injected_count": len(ranking.injected),
    }
    if not agent.inject_notes:
        return RankCheck(
            **base, detail=f"inject_notes is off for agent {agent.agent_id}: no note is injected"
        )
    if k <= 0:
        return RankCheck(**base, detail=f"max_notes_to_inject is 0 for agent {agent.agent_id}")
    if not eligible:
        return RankCheck(
            **base, detail="not ranked: the note is filtered out before ranking (steps 1-2)"
        )
    rank = ranking.rank_of(note.id)
    if rank is not None and rank <= len(ranking.injected):
        return RankCheck(
            **base,
            rank=rank,
            within_limit=True,
            detail=f"rank {rank} of {len(ranking.injected)} injected (max {k}, strategy {agent.note_injection_strategy})",
        )
    if rank is not None:
        return RankCheck(
            **base, rank=rank, detail=f"rank {rank} > max {k} under {agent.note_injection_strategy}"
        )
    if agent.note_injection_strategy == NoteInjectionStrategy.RELEVANT.value:
        cos = _cosine(mem, note.id, ranking.vec)
        cos_text = "n/a" if cos is None else f"{cos:.3f}"
        return RankCheck(
            **base,
            detail=(
                f"not retrieved for this input under Relevant: cosine {cos_text} "
                f"(floor {mem.inject_config.min_similarity:g}) and no full-text match "
                f"in the first {ranking.depth}"
            ),
        )
    return RankCheck(
        **base,
        detail=f"ranked below the first {ranking.depth} under {agent.note_injection_strategy}",
    )


# =========================================================================== provenance (step 4)

_ID = r"[0-9A-Za-z][\w.:-]*"
_MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("extracted", re.compile(r"Extracted by the Memory Manager from (?P<detail>.+?) \(confidence")),
    ("consolidated-from", re.compile(r"Consolidated from (?P<detail>\d+ notes: [^\[]*)")),
    (
        "hardening-duplicate",
        re.compile(rf"\[Hardening: duplicate of (?P<id>{_ID}) — (?P<detail>[^\]]*)\]"),
    ),
    ("consolidated-into", re.compile(rf"Consolidated into note (?P<id>{_ID}): (?P<detail>[^\[]*)")),
    (
        "contradiction-revoked",
        re.compile(
            rf"\[Contradiction resolved: superseded by note (?P<id>{_ID})\. ?(?P<detail>[^\]]*)\]"
        ),
    ),
    (
        "contradiction-flagged",
        re.compile(
            rf"\[Contradiction flagged: conflicts with note (?P<id>{_ID})\. ?(?P<detail>[^\]]*)\]"
        ),
    ),
    (
        "superseded-by-extraction",
        re.compile(
            r"Superseded: contradiction detected, replaced by new note from (?P<detail>[^\[]*)"
        ),
    ),
    (
        "merge-conflict-kept",
        re.compile(rf"\[Merge-target conflict: new note (?P<id>{_ID}) (?P<detail>[^\]]*)\]"),
    ),
    ("archived-expired", re.compile(r"\[Archived by Memory Manager: expired on (?P<at>[^\]]+)\]")),
    (
        "archived-decay",
        re.compile(
            r"\[Archived by Memory Manager: ImportanceScore decayed to (?P<detail>[^\]]*)\]"
        ),
    ),
    (
        "archived-stale",
        re.compile(
            r"\[Archived by Memory Manager: stale reference pruning - (?P<detail>.*?) on (?P<at>\S+)\]"
        ),
    ),
    (
        "promoted-protected",
        re.compile(r"\[Auto-(?:promoted to Protected|protected): (?P<detail>[^\]]*)\]"),
    ),
)
#: markers that change the note's status (their time is the note's last update)
_STATUS_MARKERS = frozenset(
    {
        "hardening-duplicate",
        "consolidated-into",
        "contradiction-revoked",
        "superseded-by-extraction",
        "archived-expired",
        "archived-decay",
        "archived-stale",
    }
)


def _parse_at(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None


def parse_events(note: Note) -> list[LifecycleEvent]:
    """The audit markers of the note's comments, in the order they were appended."""
    comments = note.comments or ""
    found: list[tuple[int, LifecycleEvent]] = []
    for kind, pattern in _MARKERS:
        for m in pattern.finditer(comments):
            groups = m.groupdict()
            related = groups.get("id")
            if kind == "superseded-by-extraction":
                related = note.consolidated_into_note_id
            detail = (groups.get("detail") or m.group(0)).strip().rstrip(".")
            if kind == "archived-expired":
                detail = f"expired on {groups['at']}"
            found.append(
                (
                    m.start(),
                    LifecycleEvent(
                        kind=kind,
                        detail=detail,
                        related_note_id=related,
                        at=_parse_at(groups.get("at")),
                    ),
                )
            )
    found.sort(key=lambda x: x[0])
    events = [e for _, e in found]
    last_status = max((i for i, e in enumerate(events) if e.kind in _STATUS_MARKERS), default=None)
    if last_status is not None and events[last_status].at is None:
        events[last_status] = events[last_status].model_copy(update={"at": note.updated_at})
    return events


def _write_records(mem: MemoryContext, note_ids: Sequence[str]) -> dict[str, list[WriteRecord]]:
    """``Memory Write`` audit steps whose output ``noteId`` is one of ``note_ids``."""
    if not note_ids:
        return {}
    note_col = run_steps.c.output_json["noteId"].as_string()
    q = (
        select(
            run_steps.c.run_id,
            run_steps.c.output_json,
            run_steps.c.status,
            run_steps.c.finished_at,
            note_col,
        )
        .where(run_steps.c.step_name == WRITE_STEP_NAME, note_col.in_(list(note_ids)))
        .order_by(run_steps.c.id)
    )
    out: dict[str, list[WriteRecord]] = {}
    with mem.sources.begin() as c:
        for run_id, output, status, at, note_id in c.execute(q):
            output = output if isinstance(output, dict) else {}
            out.setdefault(note_id, []).append(
                WriteRecord(
                    run_id=run_id,
                    disposition=output.get("disposition"),
                    reason=output.get("reason"),
                    final_scope=output.get("finalScope"),
                    status=status,
                    at=at,
                )
            )
    return out


def _injections(mem: MemoryContext, note_ids: Sequence[str]) -> dict[str, tuple[int, datetime | None]]:
    """How often each note was injected, and when last (``injection_events``)."""
    if not note_ids:
        return {}
    t = injection_events
    q = (
        select(t.c.item_id, func.count(), func.max(t.c.injected_at))
        .where(t.c.item_kind == "note", t.c.item_id.in_(list(note_ids)))
        .group_by(t.c.item_id)
    )
    with mem.sources.begin() as c:
        return {item: (int(n), last) for item, n, last in c.execute(q)}


def _origin(note: Note, events: Sequence[LifecycleEvent], writes: Sequence[WriteRecord]) -> str:
    if note.author_type == AuthorType.AGENT.value:
        created = next((w for w in writes if w.disposition in ("written", "superseded-own")), None)
        how = f" (disposition {created.disposition})" if created else ""
        return f"written in flight by the agent in run {note.source_run_id}{how}"
    if note.author_type == AuthorType.MEMORY_MANAGER.value:
        if note.derived_from_note_ids:
            return (
                f"consolidated by the Memory Manager from {len(note.derived_from_note_ids)} notes "
                f"(generation {note.consolidation_count})"
            )
        extracted = next((e for e in events if e.kind == "extracted"), None)
        if extracted:
            return f"extracted by the Memory Manager from {extracted.detail}"
        source = note.source_conversation_id or note.source_run_id
        return "created by the Memory Manager" + (f" from {source}" if source else "")
    return "added manually (author User)"


def _lineage(mem: MemoryContext, note: Note) -> Lineage:
    """``consolidated_into`` followed to the survivor; sources followed back (both
    ``derived_from_note_ids`` and notes whose ``consolidated_into`` is this note)."""
    table = mem.store.notes
    chain: list[str] = []
    survivor: Note | None = None
    seen = {note.id}
    nxt = note.consolidated_into_note_id
    while nxt and nxt not in seen and len(chain) < _LINEAGE_DEPTH:
        chain.append(nxt)
        seen.add(nxt)
        survivor = table.get(nxt)
        nxt = survivor.consolidated_into_note_id if survivor else None
    absorbed = table.scan(eq("consolidated_into_note_id", note.id), columns=["id"])["id"].tolist()
    sources: list[str] = []
    frontier = list(dict.fromkeys([*(note.derived_from_note_ids or []), *absorbed]))
    visited = {note.id}
    while frontier and len(sources) < _SOURCES_CAP:
        ids = [i for i in frontier if i not in visited]
        visited.update(ids)
        sources.extend(ids)
        if not ids:
            break
        rows = table.get_many(ids)
        more = table.scan(in_("consolidated_into_note_id", ids), columns=["id"])["id"].tolist()
        frontier = [*(d for r in rows for d in (r.derived_from_note_ids or [])), *more]
    return Lineage(
        merged_into=chain,
        survivor_id=chain[-1] if chain else None,
        survivor_status=str(survivor.status)
        if chain and survivor
        else ("missing" if chain else None),
        derived_from=list(note.derived_from_note_ids or []),
        absorbed=absorbed,
        all_sources=sources[:_SOURCES_CAP],
    )


# =========================================================================== retirement (step 5)


def days_to_floor(
    importance: float, access_count: int, tier: str | None, cfg: DecayConfig
) -> float:
    """Days untouched after which decay's new score falls below the archival floor.

    The score is ``round2(I * min(1, exp(-lambda_eff * t) * retention))``, monotone in
    ``t``; found by bisection to well under a minute. 0 when it is already below.
    """

    def score(t: float) -> float:
        return round(importance * decay_factor(importance, t, access_count, tier, cfg), 2)

    if score(0.0) < cfg.archival_floor:
        return 0.0
    lam = effective_lambda(importance, tier, cfg)
    hi = max(
        1.0, math.log(importance * retention(access_count, cfg) / (cfg.archival_floor / 2)) / lam
    )
    while score(hi) >= cfg.archival_floor:
        hi *= 2
    lo = 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if score(mid) < cfg.archival_floor:
            hi = mid
        else:
            lo = mid
    return hi


def _days(delta: timedelta) -> float:
    return round(delta.total_seconds() / 86400.0, 2)


def check_retirement(
    note: Note, agent: AgentConfig | None, now: datetime, cfg: DecayConfig
) -> Retirement:
    """Step 5: TTL (``expires_at``) and Ebbinghaus decay (reference §4.11)."""
    tier = note.protection_tier
    expires = note.expires_at
    expired = is_expired(expires, now)
    live = is_injectable(note.status)
    if expires is None:
        ttl = "no TTL (expires_at is not set)"
    elif expired:
        ttl = f"expired on {expires.isoformat()}: injection already treats it as gone"
        if live and tier != ProtectionTier.IMMUTABLE.value:
            ttl += "; the next maintenance run archives it"
    else:
        ttl = f"expires on {expires.isoformat()} (in {_days(expires - now)} days)"
        if (
            note.status == NoteStatus.PROVISIONAL.value
            and note.author_type == AuthorType.AGENT.value
        ):
            ttl += " unless hardening promotes it first (promotion clears the TTL)"
    result: dict[str, Any] = {"expires_at": expires, "expired": expired, "ttl": ttl}
    if not live:
        return Retirement(**result, decay=f"not decayed: already {note.status}")
    if note.status != NoteStatus.ACTIVE.value:
        return Retirement(
            **result, decay=f"not decayed while {note.status} (decay considers Active notes only)"
        )
    if not note.is_auto_generated:
        return Retirement(
            **result, decay="not decayed: not auto-generated (human-authored notes are only scored)"
        )
    if tier == ProtectionTier.IMMUTABLE.value:
        return Retirement(**result, decay="never decays (Immutable)")
    if note.agent_id is None:
        return Retirement(
            **result, decay="not decayed: a cross-agent note (decay runs over agents' notes)"
        )
    if agent is None or not agent.auto_archive_enabled:
        return Retirement(
            **result, decay=f"not decayed: auto-archive is off for agent {note.agent_id}"
        )
    if note.importance_score is None:
        return Retirement(
            **result, decay="not decayed yet: no importance score (set at the next maintenance run)"
        )
    importance = float(note.importance_score)
    base = note.last_accessed_at or note.created_at or now
    t_now = days_untouched(note, now)
    score_now = round(importance * decay_factor(importance, t_now, note.access_count, tier, cfg), 2)
    t_floor = days_to_floor(importance, note.access_count, tier, cfg)
    assumption = f"(importance {importance:g}, access count {note.access_count}, tier {tier}, if not accessed again)"
    if tier == ProtectionTier.PROTECTED.value and t_now < cfg.protected_inactivity_days:
        exempt_until = base + timedelta(days=cfg.protected_inactivity_days)
        retires = base + timedelta(days=max(t_floor, cfg.protected_inactivity_days))
        return Retirement(
            **result,
            decay=(
                f"exempt until {exempt_until.date().isoformat()} (Protected: 365 days after last access); "
                f"decay archives it from {retires.date().isoformat()} {assumption}"
            ),
            decay_applies=True,
            decay_score_now=importance,
            retires_at=retires,
            days_left=_days(retires - now),
        )
    retires = base + timedelta(days=t_floor)
    if retires <= now:
        text = f"decayed score {score_now:g} is below the floor {cfg.archival_floor:g}: the next maintenance run archives it"
    else:
        text = (
            f"decay archives it on {retires.date().isoformat()} (in {_days(retires - now)} days; "
            f"score now {score_now:g}, floor {cfg.archival_floor:g}) {assumption}"
        )
    return Retirement(
        **result,
        decay=text,
        decay_applies=True,
        decay_score_now=score_now,
        retires_at=retires,
        days_left=max(0.0, _days(retires - now)),
    )


# =========================================================================== verdict


def _verdict(
    note: Note,
    events: Sequence[LifecycleEvent],
    lineage: Lineage,
    expired: bool,
    scope: ScopeCheck,
    rank: RankCheck,
    context_problem: str | None,
) -> tuple[str, str]:
    """The one-line verdict and its code, in the guide's troubleshooting order."""
    if not is_injectable(note.status):
        into = note.consolidated_into_note_id
        kinds = {e.kind for e in events}
        if into and ("contradiction-revoked" in kinds or "superseded-by-extraction" in kinds):
            return f"revoked by contradiction with {into}", "revoked-contradiction"
        if into:
            text = f"merged into {into}"
            if lineage.survivor_id and lineage.survivor_id != into:
                text += f" (survivor {lineage.survivor_id}, {lineage.survivor_status})"
            elif lineage.survivor_status:
                text += f" ({lineage.survivor_status})"
            return text, "merged"
        if "archived-expired" in kinds:
            return f"expired: archived by TTL ({note.status})", "expired"
        if "archived-decay" in kinds:
            return (
                f"not injectable: {note.status} (importance decayed below the floor)",
                "not-injectable",
            )
        if "archived-stale" in kinds:
            return f"not injectable: {note.status} (stale reference pruning)", "not-injectable"
        return f"not injectable: {note.status}", "not-injectable"
    if expired:
        when = note.expires_at.date().isoformat() if note.expires_at else "?"
        return f"expired on {when} (still {note.status} until maintenance archives it)", "expired"
    if context_problem:
        return f"not injected: {context_problem}", "context-error"
    if not scope.in_scope:
        return f"out of scope: {scope.rule}", "out-of-scope"
    if not rank.inject_notes:
        return (
            "not injected: inject_notes is off for this agent",
            "injection-off",
        )
    if rank.max_notes <= 0:
        return "not injected: max_notes_to_inject is 0", "injection-off"
    if rank.within_limit and rank.rank is not None:
        return f"injected (rank {rank.rank} of {rank.injected_count})", "injected"
    if rank.rank is not None:
        return f"below the cut: rank {rank.rank} > max {rank.max_notes}", "below-cut"
    if rank.detail.startswith("not retrieved"):
        return rank.detail, "not-retrieved"
    return f"below the cut: {rank.detail}", "below-cut"


# =========================================================================== entry point


def explain(
    mem: MemoryContext,
    ctx: RunContext,
    topic: str,
    current_input: str | None = None,
    *,
    limit: int = DEFAULT_LIMIT,
    all_agents: bool = False,
    all_scopes: bool = False,
) -> Explanation:
    """Explain, note by note, why the agent of ``ctx`` does or does not remember ``topic``.

    Reads the agent's configuration (``UnknownAgentError`` for an unknown agent), the
    notes about the topic in any status that the context may see (see
    :func:`find_notes`; every note of the agent and the cross-agent ones with the
    operator's ``all_scopes``, every agent's with ``all_agents`` too), the injection
    path's ranking for ``current_input`` (or the topic), the audit steps and the clock.
    Writes nothing. ``ValidationError`` for an empty topic or a limit outside 1..100
    (``Limits.max_injected_items``).
    """
    if not isinstance(topic, str) or not topic.strip():
        raise ValidationError("topic must be a non-empty string")
    check_count("limit", limit, limits().max_injected_items, minimum=1)
    topic = topic.strip()
    agent = get_agent(mem.sources, ctx.agent_id)
    now = mem.now()
    scope, problem = _scope_of(ctx, agent)
    query = current_input if current_input and current_input.strip() else topic
    ranking = _Ranking(mem, agent, scope, query)
    found = find_notes(
        mem,
        ctx.agent_id,
        topic,
        limit,
        all_agents=all_agents,
        scope=None if all_scopes else scope,
    )
    ids = [n.id for n, _ in found]
    writes = _write_records(mem, ids)
    injected_counts = _injections(mem, ids)
    decay_cfg = _decay_config(mem)
    agents: dict[str, AgentConfig | None] = {agent.agent_id: agent}
    out: list[NoteExplanation] = []
    for note, match in found:
        expired = is_expired(note.expires_at, now)
        scope_check = check_scope(note, ctx, scope)
        eligible = (
            is_injectable(note.status) and not expired and scope_check.in_scope and problem is None
        )
        rank_check = check_rank(mem, note, ranking, eligible)
        events = parse_events(note)
        note_writes = writes.get(note.id, [])
        times, last = injected_counts.get(note.id, (0, None))
        provenance = Provenance(
            author_type=str(note.author_type),
            is_auto_generated=note.is_auto_generated,
            origin=_origin(note, events, note_writes),
            source_run_id=note.source_run_id,
            source_conversation_id=note.source_conversation_id,
            source_conversation_detail_id=note.source_conversation_detail_id,
            created_at=note.created_at,
            updated_at=note.updated_at,
            writes=note_writes,
            events=events,
            times_injected=times,
            last_injected_at=last,
        )
        lineage = _lineage(mem, note)
        if note.agent_id and note.agent_id not in agents:
            agents[note.agent_id] = mem.sources.get_agent(note.agent_id)
        retirement = check_retirement(note, agents.get(note.agent_id or ""), now, decay_cfg)
        verdict, code = _verdict(note, events, lineage, expired, scope_check, rank_check, problem)
        out.append(
            NoteExplanation(
                note_id=note.id,
                note=note.note,
                type=str(note.type),
                status=str(note.status),
                injectable=is_injectable(note.status),
                agent_id=note.agent_id,
                user_id=note.user_id,
                company_id=note.company_id,
                verdict=verdict,
                code=code,
                match=match,
                scope=scope_check,
                rank=rank_check,
                provenance=provenance,
                lineage=lineage,
                retirement=retirement,
            )
        )
    return Explanation(
        topic=topic,
        current_input=current_input,
        context=ctx,
        agent=AgentSummary(
            agent_id=agent.agent_id,
            status=agent.status,
            inject_notes=agent.inject_notes,
            max_notes_to_inject=agent.max_notes_to_inject,
            note_injection_strategy=str(agent.note_injection_strategy),
            auto_archive_enabled=agent.auto_archive_enabled,
            shared_only=scope.config.shared_only,
        ),
        generated_at=now,
        injected_note_ids=list(ranking.injected),
        context_problem=problem,
        all_scopes=all_scopes,
        notes=out,
    )


def _decay_config(mem: MemoryContext) -> DecayConfig:
    return config_of(mem).decay


# =========================================================================== rendering


def _short(text: str | None, width: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= width else text[: width - 1] + "…"


def render_table(explanation: Explanation) -> str:
    """The explanation as terminal text: a summary line, one table row per note, then the
    details of each note (scope rule, rank, origin, lifecycle, lineage, TTL/decay).
    Control characters of note text are escaped (see :mod:`memory_pipelines.terminal`)."""
    return printable(_render_table(explanation), keep="\n")


def _render_table(explanation: Explanation) -> str:
    from tabulate import tabulate

    a = explanation.agent
    head = (
        f'Why does agent {a.agent_id} (not) remember "{explanation.topic}"?\n'
        f"strategy {a.note_injection_strategy}, max {a.max_notes_to_inject} notes, "
        f"inject_notes {'on' if a.inject_notes else 'off'}; "
        f"input: {_short(explanation.current_input or explanation.topic, 60)!r}; "
        f"{len(explanation.injected_note_ids)} note(s) injected for this context"
    )
    if explanation.context_problem:
        head += f"\ncontext problem: {explanation.context_problem}"
    if not explanation.notes:
        where = "" if explanation.all_scopes else " in this context's scope"
        return head + f"\n\nNo note about this topic was found{where} (any status)."
    rows = [
        [
            i,
            n.note_id[:8],
            n.status,
            f"{n.scope.level} {n.scope.label}",
            n.rank.rank if n.rank.rank is not None else "-",
            n.verdict,
            _short(n.note, 48),
        ]
        for i, n in enumerate(explanation.notes, 1)
    ]
    table = tabulate(
        rows, headers=["#", "note", "status", "scope", "rank", "verdict", "text"], tablefmt="simple"
    )
    details = []
    for i, n in enumerate(explanation.notes, 1):
        lines = [
            f"[{i}] {n.note_id}  {n.type}  author {n.provenance.author_type}",
            f"    verdict: {n.verdict}",
        ]
        lines.append(
            f"    1 status: {n.status} ({'injectable' if n.injectable else 'not injectable'})"
        )
        lines.append(f"    2 scope: {n.scope.detail}")
        lines.append(f"    3 rank: {n.rank.detail}")
        lines.append(f"    4 origin: {n.provenance.origin}")
        for w in n.provenance.writes:
            lines.append(f"      write in run {w.run_id}: {w.disposition} ({_short(w.reason, 70)})")
        for e in n.provenance.events:
            when = f" at {e.at.isoformat()}" if e.at else ""
            lines.append(f"      {e.kind}{when}: {_short(e.detail, 80)}")
        if n.lineage.merged_into:
            lines.append(
                f"      merged into: {' -> '.join(n.lineage.merged_into)} ({n.lineage.survivor_status})"
            )
        if n.lineage.all_sources:
            lines.append(f"      sources: {', '.join(n.lineage.all_sources)}")
        lines.append(f"    5 ttl: {n.retirement.ttl}")
        lines.append(f"      decay: {n.retirement.decay}")
        details.append("\n".join(lines))
    return f"{head}\n\n{table}\n\n" + "\n\n".join(details)


__all__ = [
    "Explanation",
    "LifecycleEvent",
    "Lineage",
    "NoteExplanation",
    "Provenance",
    "RankCheck",
    "Retirement",
    "ScopeCheck",
    "WriteRecord",
    "check_retirement",
    "check_scope",
    "days_to_floor",
    "explain",
    "find_notes",
    "parse_events",
    "render_table",
    "visible",
]
