"""What the judge decides: decision types, the Judge protocol, limits and shared pre-checks.

A judge that cannot decide (timeout, exception, malformed or hostile output) raises
``JudgeError``. Callers treat that as "no decision": keep things as they are, and never
archive, revoke or delete on it. The pre-checks here (a pair that is never compared, a
cluster that cannot be consolidated, the scope level of a cluster) are shared by both
judges, so a model is never asked what the rules already answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

from memory_pipelines.limits import limits
from memory_pipelines.notes import Example, Note, NoteType


@dataclass(frozen=True)
class ConversationMessage:
    """One message of a conversation (or a synthetic failure thread) shown to the judge."""

    role: str
    text: str
    rating: int | None = None
    rating_comment: str | None = None
    message_id: str | None = None
    #: when the message was sent (resolves "yesterday", "last week" in dated events)
    sent_at: datetime | None = None


def judged_messages(
    messages: Sequence[ConversationMessage], total_chars: int | None = None
) -> list[ConversationMessage]:
    """``messages`` as extraction shows them to a judge: each text and rating comment cut
    to its last ``max_judged_message_chars`` characters (the limits in force), so what one
    message costs the judge is bounded whatever its length. With ``total_chars``, only the
    latest messages up to that many characters in all are kept (the oldest one kept is read
    from its end). Ids, roles, ratings and times are unchanged."""
    bound = limits().max_judged_message_chars
    budget = total_chars
    out: list[ConversationMessage] = []
    for m in reversed(messages):
        if budget is not None and budget <= 0:
            break
        keep = bound if budget is None else min(bound, budget)
        text = m.text[-keep:] if len(m.text) > keep else m.text
        comment = m.rating_comment
        if comment is not None and len(comment) > bound:
            comment = comment[-bound:]
        if budget is not None:
            budget -= len(text)
        same = text is m.text and comment is m.rating_comment
        out.append(m if same else replace(m, text=text, rating_comment=comment))
    return out[::-1]


@dataclass(frozen=True)
class CandidateNote:
    """A note the judge proposes to extract."""

    content: str
    type: str
    scope_level: str = "user"  # "global" | "company" | "user"
    confidence: float = 0.0
    merge_with_existing_ids: tuple[str, ...] = ()
    protection_tier_hint: str | None = None
    source_message_id: str | None = None
    #: the offline rule family that proposed it ("preference", "dated_event", ...); None
    #: for a model's proposal. Benchmarks read it; the Memory Manager ignores it.
    rule: str | None = None


@dataclass(frozen=True)
class CandidateExample:
    """An input/output demonstration the judge proposes to extract."""

    example_input: str
    example_output: str
    success_score: float
    confidence: float
    source_message_id: str | None = None


@dataclass(frozen=True)
class DedupeDecision:
    """``should_add`` False means the candidate is a true duplicate of a match."""

    should_add: bool
    reason: str


@dataclass(frozen=True)
class ConsolidationDecision:
    """One note to replace a cluster; ``should_consolidate`` False only for an invalid
    cluster (or, with a model, when it judges the notes unrelated)."""

    should_consolidate: bool
    content: str = ""
    type: str | None = None
    scope_level: str = "user"
    confidence: float = 0.0
    source_note_ids: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class ContradictionDecision:
    """Whether two notes contradict and, if so, which one the authority order keeps."""

    is_contradiction: bool
    contradiction_type: str | None = None  # competing_relation | negation | temporal_supersession
    keep_note_id: str | None = None
    revoke_note_id: str | None = None
    reason: str = ""
    confidence: float = 0.0
    entity_triples: tuple[tuple[str, str, str], ...] = field(default_factory=tuple)


@runtime_checkable
class Judge(Protocol):
    """The decisions the Memory Manager delegates to a model (or to rules)."""

    name: str

    def extract_notes(
        self,
        messages: Sequence[ConversationMessage],
        existing: Sequence[Note],
        *,
        rating_context: str,
    ) -> list[CandidateNote]:
        """Durable notes stated in a conversation. ``rating_context`` is "positive",
        "negative", "unrated" or "failure"."""
        ...

    def extract_examples(
        self, messages: Sequence[ConversationMessage], existing: Sequence[Example]
    ) -> list[CandidateExample]: ...

    def is_duplicate(self, candidate: str, matches: Sequence[Note]) -> DedupeDecision: ...

    def synthesize_cluster(
        self, notes: Sequence[Note], *, anchored: bool
    ) -> ConsolidationDecision: ...

    def detect_contradiction(self, a: Note, b: Note) -> ContradictionDecision: ...


# =========================================================================== constants

NOTE_TYPES: tuple[str, ...] = tuple(t.value for t in NoteType)
SCOPE_LEVELS: tuple[str, ...] = ("global", "company", "user")
CONTRADICTION_TYPES: tuple[str, ...] = ("competing_relation", "negation", "temporal_supersession")
RATING_CONTEXTS: tuple[str, ...] = ("positive", "negative", "unrated", "failure")
#: A note newer than its rival by more than this wins a contradiction outright.
SUPERSEDE_AFTER = timedelta(days=7)
#: Embedding cosine at or above which two notes may be duplicates (when no word differs).
DUPLICATE_SIMILARITY = 0.92
#: Embedding cosine at or above which a clause is "already covered" during synthesis.
COVERED_SIMILARITY = 0.90
MAX_NOTE_CHARS = 200
MAX_CONSOLIDATED_CHARS = 300
#: Examples need at least this success score and confidence (reference §4.4).
MIN_EXAMPLE_SCORE = 70.0


# =========================================================================== shared pre-checks


def _pair_precheck(a: Note, b: Note) -> ContradictionDecision | None:
    """A decision without looking at the text: a note never contradicts itself, and notes of
    different agents or scopes (``Note.scope_key``) are never compared."""
    if a.id == b.id:
        return ContradictionDecision(False, reason="same note")
    if a.agent_id != b.agent_id:
        return ContradictionDecision(False, reason="different agents: both kept")
    if a.scope_key != b.scope_key:
        return ContradictionDecision(False, reason="different scopes: both kept")
    return None


def _cluster_problem(notes: Sequence[Note]) -> str | None:
    """Why a cluster cannot be consolidated (None when it is valid)."""
    if len(notes) < 2:
        return "a cluster needs at least 2 notes"
    if len({n.agent_id for n in notes}) > 1:
        return "the notes belong to different agents"
    if len({n.id for n in notes}) < len(notes):
        return "the cluster repeats a note"
    return None


def _scope_level(notes: Sequence[Note]) -> str:
    """'user' when every note has the same user, 'company' when every note has the same
    company, else 'global' (the least restrictive level true for all)."""
    users = {n.user_id for n in notes}
    if len(users) == 1 and None not in users:
        return "user"
    companies = {n.company_id for n in notes}
    if len(companies) == 1 and None not in companies:
        return "company"
    return "global"


def _recency_key(n: Note) -> tuple[float, float]:
    ts = n.created_at.timestamp() if n.created_at is not None else float("-inf")
    return (ts, n.importance_score or 0.0)


def newer_of(a: Note, b: Note) -> int:
    """1 when ``a`` was created after ``b``, -1 when before, 0 when equal or unknown."""
    if a.created_at is None or b.created_at is None or a.created_at == b.created_at:
        return 0
    return 1 if a.created_at > b.created_at else -1


def authority_order(a: Note, b: Note) -> tuple[Note, Note, str] | None:
    """(winner, loser, rule) by the authority order: newer by more than 7 days, then the
    higher importance score (None = 0), then the higher access count; None when all tie."""
    if a.created_at is not None and b.created_at is not None:
        gap = a.created_at - b.created_at
        if gap > SUPERSEDE_AFTER:
            return a, b, "newer by more than 7 days"
        if -gap > SUPERSEDE_AFTER:
            return b, a, "newer by more than 7 days"
    ia, ib = a.importance_score or 0.0, b.importance_score or 0.0
    if ia != ib:
        return (a, b, "higher importance") if ia > ib else (b, a, "higher importance")
    if a.access_count != b.access_count:
        return (
            (a, b, "higher access count")
            if a.access_count > b.access_count
            else (b, a, "higher access count")
        )
    return None
