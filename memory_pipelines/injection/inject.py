""":func:`inject`: the run-start entry point that selects, ranks, renders and attributes
the notes and examples of one run (see :mod:`memory_pipelines.injection`)."""

from __future__ import annotations

import logging

import numpy as np
from pydantic import BaseModel

from memory_pipelines.agents import get_agent
from memory_pipelines.config import InjectConfig
from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import EmbeddingError
from memory_pipelines.injection.attribution import record_attribution
from memory_pipelines.injection.render import render_examples, render_message, render_notes
from memory_pipelines.injection.retrieval import select_examples, select_notes
from memory_pipelines.notes import (
    AgentConfig,
    Example,
    ExampleInjectionStrategy,
    Note,
    NoteInjectionStrategy,
    RunContext,
)
from memory_pipelines.scope import RunScope

log = logging.getLogger(__name__)


class Injection(BaseModel):
    """What is injected at run start: the one system message and the items in it."""

    message: str = ""
    notes: list[Note] = []
    examples: list[Example] = []


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
    record: bool = True,
) -> Injection:
    """Select, rank and render the notes and examples to prepend to a run.

    Reads the agent's configuration (``UnknownAgentError`` for an unknown agent), the
    note and example tables (prefiltered by scope) and the clock; writes only
    attribution rows (none with ``record=False``). ``query_vector`` lets a caller pass a precomputed embedding of
    ``current_input`` (benchmarks); otherwise the input is embedded once, as given, and
    shared by the note and example searches.
    """
    agent: AgentConfig = get_agent(mem.sources, ctx.agent_id)
    if not agent.inject_notes and not agent.inject_examples:
        return Injection()
    cfg: InjectConfig = mem.inject_config
    now = mem.now()
    scope = RunScope.of(ctx, agent)
    query, vec = query_of(mem, agent, current_input, query_vector)
    notes = select_notes(mem, scope, agent, query, vec, now) if agent.inject_notes else []
    examples = select_examples(mem, scope, agent, query, vec, now) if agent.inject_examples else []
    message = render_message(
        render_notes(notes, include_memory_policy=cfg.include_memory_policy),
        render_examples(examples),
    )
    if cfg.record_attribution and record:
        record_attribution(mem, ctx, notes, examples, now)
    return Injection(message=message, notes=notes, examples=examples)


def query_of(
    mem: MemoryContext,
    agent: AgentConfig,
    current_input: str | None,
    query_vector: np.ndarray | None = None,
) -> tuple[str | None, np.ndarray | None]:
    """The retrieval query of an input (None when blank) and its vector when the agent's
    strategies need one (``query_vector`` when given, else the input embedded once)."""
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
    return query, vec
