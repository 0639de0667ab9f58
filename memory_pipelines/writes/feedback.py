"""What the agent reads about its writes: the next-turn feedback message (reference §2.4)
and the "Durable Memory" block of its system prompt (reference §2.6)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memory_pipelines.config import WriteConfig
from memory_pipelines.notes import AgentConfig
from memory_pipelines.writes.models import (
    FEEDBACK_TEXT_LIMIT,
    GATE_FEEDBACK,
    Disposition,
    MemoryWrite,
    WriteResult,
)


def _feedback_text(request: Any) -> str:
    if isinstance(request, MemoryWrite):
        note: Any = request.note
    elif isinstance(request, Mapping):
        note = request.get("note")
    else:
        note = None
    text = "" if note is None else str(note)
    text = " ".join(text.strip().splitlines())
    if len(text) > FEEDBACK_TEXT_LIMIT:
        text = text[:FEEDBACK_TEXT_LIMIT] + "…"
    return text


def format_write_feedback(results: Sequence[WriteResult]) -> str:
    """The next-turn message reporting each write (reference §2.4); ``""`` for no results.

    Header "Memory write result:" (one write) or "Memory write results (N writes):", then
    one line per write: ``{i}. "{text}" — **{disposition}**: {reason}``, the text cut to
    120 characters plus "…" (line breaks in it become spaces). A batch the gate skipped
    gets the reference's gate message, which says that nothing was saved.
    """
    results = list(results)
    if not results:
        return ""
    if all(r.disposition == Disposition.SKIPPED_DISABLED for r in results):
        return GATE_FEEDBACK
    n = len(results)
    header = "Memory write result:" if n == 1 else f"Memory write results ({n} writes):"
    lines = [header]
    for i, r in enumerate(results, start=1):
        lines.append(f'{i}. "{_feedback_text(r.request)}" — **{r.disposition}**: {r.reason}')
    return "\n".join(lines)


# --------------------------------------------------------------------------- prompt


def write_instructions(agent: AgentConfig, config: WriteConfig) -> str:
    """The "Durable Memory" block of an agent's system prompt (reference §2.6).

    Empty for an agent with ``allow_memory_write=False``, so such an agent never learns
    the ``memoryWrites`` field (the prompt layer of the three-layer gate).
    """
    if not agent.allow_memory_write:
        return ""
    example = (
        '"memoryWrites": [\n'
        '  {"note": "User prefers bar charts over pie charts.", "type": "Preference"},\n'
        '  {"note": "The team deploys to production on Fridays.", "type": "Context",'
        ' "scopeHint": "agent"}\n'
        "]"
    )
    lines = [
        "## Durable Memory",
        "",
        "You can save durable facts and preferences so they are available in future runs."
        " Add a `memoryWrites` array to your JSON response, beside your other fields:",
        "",
        "```json",
        example,
        "```",
        "",
        "- Record a durable fact or preference as soon as the user states it.",
        "- Each write is one atomic, declarative, third-person fact of at most"
        f" {config.max_note_length} characters.",
        '- `type` is "Preference" or "Context" only. Instructions, rules and constraints are'
        " not memories and are rejected.",
        "- Transient task state does not belong here; keep it in your scratchpad.",
        '- `scopeHint` is optional: "agent" makes the fact apply to all users of this agent;'
        ' leave it out (or use "user") for a fact about the current user.',
        f"- At most {config.max_writes_per_run} new memories are saved per run. The framework"
        " dedupes, caps and reports every write, so do not resubmit one.",
        "- Results arrive on the NEXT turn. Never claim a memory was saved until its result"
        " says so. If a write was skipped or rejected, tell the user what was NOT saved.",
        "- Saved memories take effect immediately for future runs and are reviewed by the"
        " Memory Manager.",
    ]
    return "\n".join(lines)
