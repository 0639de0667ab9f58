"""Step 3: a note's rank under the agent's strategy, from the very retrieval the injection
path runs, and whether it is within ``max_notes_to_inject``."""

from __future__ import annotations

from datetime import datetime

import numpy as np

from memory_pipelines.context import MemoryContext
from memory_pipelines.explain.find import embed_or_none
from memory_pipelines.explain.models import RankCheck
from memory_pipelines.injection import select_notes
from memory_pipelines.injection.retrieval import CandidatePart, rank_candidates
from memory_pipelines.notes import AgentConfig, Note, NoteInjectionStrategy
from memory_pipelines.scope import RunScope

#: how deep the extended ranking goes to place a note that is below the cut
EXTENDED_RANK = 50


class Ranking:
    """The injection path's ranking for the context: the injected notes, and (computed
    only when needed) a deeper ranking that places the notes below the cut."""

    def __init__(
        self,
        mem: MemoryContext,
        agent: AgentConfig,
        scope: RunScope,
        query: str,
        *,
        past: list[CandidatePart] | None = None,
        now: datetime | None = None,
    ):
        self.mem = mem
        self.agent = agent
        self.scope = scope
        self.query = query
        self.now = now or mem.now()
        self.past = past  # time travel: rank this in-memory set as it was at ``now``
        relevant = agent.note_injection_strategy == NoteInjectionStrategy.RELEVANT.value
        self.vec = embed_or_none(mem, query) if relevant else None
        self.injected: list[str] = []
        self._extended: list[str] | None = None
        if agent.inject_notes and agent.max_notes_to_inject > 0:
            self.injected = [n.id for n in self._select(agent)]

    def _select(self, agent: AgentConfig) -> list[Note]:
        if self.past is not None:
            return rank_candidates(
                self.mem, self.scope, agent, self.query, self.vec, self.past, self.now
            )
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


def check_rank(mem: MemoryContext, note: Note, ranking: Ranking, eligible: bool) -> RankCheck:
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
