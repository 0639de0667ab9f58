"""The answer of :func:`~memory_pipelines.explain.explain` as pydantic models: one
:class:`NoteExplanation` per note (match, scope, rank, provenance, lineage, retirement)
inside an :class:`Explanation`."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel

from memory_pipelines.notes import RunContext


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
    """One thing that happened to the note: one of its ``note_events`` rows (``kind`` is
    the event kind, ``detail`` its reason or who did it, ``related_note_id`` the first
    related note)."""

    kind: str
    detail: str
    related_note_id: str | None = None
    at: datetime | None = None
    actor: str | None = None
    phase: str | None = None
    run_id: str | None = None
    rule: str | None = None
    status_before: str | None = None
    status_after: str | None = None
    related_note_ids: list[str] = []


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
