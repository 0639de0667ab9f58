""":func:`explain`: why the agent of a run context does (or does not) remember a topic,
note by note, in the guide's troubleshooting order, ending in a one-line verdict."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from memory_pipelines.agents import get_agent
from memory_pipelines.config import DecayConfig
from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import ValidationError
from memory_pipelines.explain.find import SUBSTRING_BONUS, find_notes
from memory_pipelines.explain.lineage import (
    injection_counts,
    lineage_of,
    note_events,
    origin_of,
    retiring_event,
    write_records,
)
from memory_pipelines.explain.models import (
    AgentSummary,
    Explanation,
    LifecycleEvent,
    Lineage,
    MatchInfo,
    NoteExplanation,
    Provenance,
    RankCheck,
    ScopeCheck,
)
from memory_pipelines.explain.rank import Ranking, check_rank
from memory_pipelines.explain.retirement import check_retirement
from memory_pipelines.explain.scope_check import check_scope, scope_of
from memory_pipelines.history.as_of import candidates_at, changed_at, check_as_of, notes_at
from memory_pipelines.limits import check_count, limits
from memory_pipelines.note_events import EventKind
from memory_pipelines.notes import AgentConfig, Note, RunContext, is_injectable
from memory_pipelines.phases.ebbinghaus import is_expired
from memory_pipelines.scope import RunScope

#: notes explained per call unless the caller asks for another number
DEFAULT_LIMIT = 10


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
        return _retired_verdict(note, events, lineage)
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


#: rules of a revocation that the verdict calls a contradiction
_CONTRADICTION_RULES = frozenset({"contradiction", "extraction", "write-supersede"})
#: archiving rules and what the verdict says about them
_ARCHIVE_RULES = {
    "decay": "importance decayed below the floor",
    "stale-reference": "stale reference pruning",
}


def _retired_verdict(
    note: Note, events: Sequence[LifecycleEvent], lineage: Lineage
) -> tuple[str, str]:
    """The verdict of a note outside the injectable statuses, from the event that retired
    it (a note without events: from its fields)."""
    into = note.consolidated_into_note_id
    last = retiring_event(events)
    kind, rule = (last.kind, last.rule) if last else (None, None)
    if into and (
        kind == EventKind.SUPERSEDED.value
        or (kind == EventKind.REVOKED.value and rule in _CONTRADICTION_RULES)
    ):
        return f"revoked by contradiction with {into}", "revoked-contradiction"
    if into:
        text = f"merged into {into}"
        if lineage.survivor_id and lineage.survivor_id != into:
            text += f" (survivor {lineage.survivor_id}, {lineage.survivor_status})"
        elif lineage.survivor_status:
            text += f" ({lineage.survivor_status})"
        return text, "merged"
    if kind == EventKind.ARCHIVED.value and rule == "ttl":
        return f"expired: archived by TTL ({note.status})", "expired"
    if kind == EventKind.ARCHIVED.value and rule in _ARCHIVE_RULES:
        return f"not injectable: {note.status} ({_ARCHIVE_RULES[rule]})", "not-injectable"
    return f"not injectable: {note.status}", "not-injectable"


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
    as_of: datetime | None = None,
) -> Explanation:
    """Explain, note by note, why the agent of ``ctx`` does or does not remember ``topic``.

    Reads the agent's configuration (``UnknownAgentError`` for an unknown agent), the
    notes about the topic in any status that the context may see (see
    :func:`find_notes`; every note of the agent and the cross-agent ones with the
    operator's ``all_scopes``, every agent's with ``all_agents`` too), the injection
    path's ranking for ``current_input`` (or the topic), the audit steps and the clock.
    Writes nothing. ``ValidationError`` for an empty topic or a limit outside 1..100
    (``Limits.max_injected_items``).

    With an aware ``as_of`` (time travel, :mod:`memory_pipelines.history.as_of`): the
    notes found are shown as they were then (a note created later is left out), ranked
    over the notes injectable then, with their events and writes up to ``as_of`` and TTL
    and decay judged at ``as_of``. The topic is searched in the present text, and in the
    old text of the notes changed since.
    """
    if not isinstance(topic, str) or not topic.strip():
        raise ValidationError("topic must be a non-empty string")
    check_count("limit", limit, limits().max_injected_items, minimum=1)
    topic = topic.strip()
    agent = get_agent(mem.sources, ctx.agent_id)
    as_of = None if as_of is None else check_as_of(as_of)
    now = as_of or mem.now()
    scope, problem = scope_of(ctx, agent)
    query = current_input if current_input and current_input.strip() else topic
    past = None if as_of is None else candidates_at(mem, scope, as_of)
    ranking = Ranking(mem, agent, scope, query, past=past, now=now)
    found = find_notes(
        mem,
        ctx.agent_id,
        topic,
        limit,
        all_agents=all_agents,
        scope=None if all_scopes else scope,
    )
    if as_of is not None:
        found = _found_at(mem, scope, as_of, topic, found, limit)
    reading = _Reading.of(mem, ctx, scope, problem, ranking, now, [n.id for n, _ in found], as_of)
    reading.agents[agent.agent_id] = agent
    notes = [reading.explain_note(note, match) for note, match in found]
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
        notes=notes,
    )


@dataclass
class _Reading:
    """What explaining each found note reads: the run's context, scope and ranking, the
    notes' writes, lifecycle events and injection counts (up to ``as_of``), the decay
    settings and the agents' configurations (read once each)."""

    mem: MemoryContext
    ctx: RunContext
    scope: RunScope
    problem: str | None
    ranking: Ranking
    now: datetime
    writes: dict
    lifecycles: dict
    injected: dict
    decay_cfg: DecayConfig
    agents: dict[str, AgentConfig | None] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        mem: MemoryContext,
        ctx: RunContext,
        scope: RunScope,
        problem: str | None,
        ranking: Ranking,
        now: datetime,
        ids: list[str],
        as_of: datetime | None,
    ) -> _Reading:
        writes = write_records(mem, ids)
        lifecycles = note_events(mem, ids)
        if as_of is not None:
            lifecycles = {
                i: [e for e in evs if e.at and e.at <= as_of] for i, evs in lifecycles.items()
            }
            writes = {
                i: [w for w in ws if w.at is None or w.at <= as_of] for i, ws in writes.items()
            }
        injected = injection_counts(mem, ids)
        return cls(
            mem, ctx, scope, problem, ranking, now, writes, lifecycles, injected, _decay_config(mem)
        )

    def explain_note(self, note: Note, match: MatchInfo) -> NoteExplanation:
        """One note's explanation: scope, rank, provenance, lineage, retirement, verdict."""
        mem = self.mem
        expired = is_expired(note.expires_at, self.now)
        scope_check = check_scope(note, self.ctx, self.scope)
        eligible = (
            is_injectable(note.status)
            and not expired
            and scope_check.in_scope
            and self.problem is None
        )
        rank_check = check_rank(mem, note, self.ranking, eligible)
        events = self.lifecycles.get(note.id, [])
        provenance = self._provenance(note, events)
        lineage = lineage_of(mem, note)
        if note.agent_id and note.agent_id not in self.agents:
            self.agents[note.agent_id] = mem.sources.get_agent(note.agent_id)
        retirement = check_retirement(
            note, self.agents.get(note.agent_id or ""), self.now, self.decay_cfg
        )
        verdict, code = _verdict(
            note, events, lineage, expired, scope_check, rank_check, self.problem
        )
        return NoteExplanation(
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

    def _provenance(self, note: Note, events: list[LifecycleEvent]) -> Provenance:
        note_writes = self.writes.get(note.id, [])
        times, last = self.injected.get(note.id, (0, None))
        return Provenance(
            author_type=str(note.author_type),
            is_auto_generated=note.is_auto_generated,
            origin=origin_of(note, events, note_writes),
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


def _found_at(
    mem: MemoryContext,
    scope: RunScope,
    as_of: datetime,
    topic: str,
    found: list[tuple[Note, MatchInfo]],
    limit: int,
) -> list[tuple[Note, MatchInfo]]:
    """The found notes as they were at ``as_of`` (those created later left out), plus the
    notes changed since whose text then held the topic."""
    states = notes_at(mem, scope, as_of, [n.id for n, _ in found])
    out = [(states[n.id], m) for n, m in found if n.id in states]
    seen = {n.id for n, _ in out}
    needle = topic.lower()
    for n in changed_at(mem, scope, as_of):
        if n.id not in seen and needle in (n.note or "").lower():
            out.append((n, MatchInfo(score=SUBSTRING_BONUS, substring=True)))
    return out[:limit]


def _decay_config(mem: MemoryContext) -> DecayConfig:
    return mem.maintenance_config.decay
