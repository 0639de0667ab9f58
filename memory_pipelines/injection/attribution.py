"""Attribution: the ``memoryAttribution`` object (reference §2.5), one ``injection_events``
row per injected item and the 'Memory Injection' audit step.

Off the hot path: :func:`buffer_attribution` (what ``serve`` and the proxy turn on) keeps
the ``injection_events`` rows and the 'Memory Injection' audit step in the process and
inserts them in batches, at most ``FLUSH_EVENTS`` rows (events and steps together) and
``FLUSH_SECONDS`` seconds apart, and before anything reads them: the event queries, the
fold, the audit step queries (explain, history), ``purge_user``, erasing a note, and at
``svc.close()``. Any other audit step inserted in the process flushes the waiting steps
first, so the audit trail keeps the order the steps were recorded in. A hard crash loses
at most the rows waiting: fewer than ``FLUSH_EVENTS``, none older than ``FLUSH_SECONDS``.
Without it (an embedded ``MemoryService``) each injection commits its rows and step in
one transaction, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from memory_pipelines.context import MemoryContext
from memory_pipelines.notes import Example, Note, RunContext
from memory_pipelines.scope import scope_label

STEP_TYPE = "Prompt"
STEP_NAME = "Memory Injection"

#: a batch insert once this many injection events wait ...
FLUSH_EVENTS = 256
#: ... or this many seconds after the first of them was buffered
FLUSH_SECONDS = 1.0


def buffer_attribution(
    mem: MemoryContext, max_events: int = FLUSH_EVENTS, max_seconds: float = FLUSH_SECONDS
) -> None:
    """Buffer this home's injection events and audit steps in the process
    (``max_events=0``: stop, after flushing). A hard crash loses fewer than
    ``max_events`` rows, none older than ``max_seconds``."""
    mem.sources.buffer_injection_events(max_events, max_seconds)


def flush_attribution(mem: MemoryContext) -> int:
    """Insert the buffered injection events and audit steps now (before reading them);
    how many rows."""
    return mem.sources.flush_injection_events()


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
    id, the 'Memory Injection' audit step; one SQL transaction (both buffered instead
    when :func:`buffer_attribution` is on), no note is touched."""
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
    mem.sources.record_injection_buffered(events, step)
