"""Attribution: the ``memoryAttribution`` object (reference §2.5), one ``injection_events``
row per injected item and the 'Memory Injection' audit step."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from memory_pipelines.context import MemoryContext
from memory_pipelines.notes import Example, Note, RunContext
from memory_pipelines.scoping import scope_label

STEP_TYPE = "Prompt"
STEP_NAME = "Memory Injection"


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
