"""The write path's vocabulary: the request and result models, dispositions, step names and
every reason string an agent reads back (reference §2.3, §2.4)."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from memory_pipelines.limits import clipped
from memory_pipelines.notes import IN_FLIGHT_TYPES


class MemoryWrite(BaseModel):
    """One ``memoryWrites`` request from an agent."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    note: str
    type: str = "Preference"
    scope_hint: str | None = Field(default=None, alias="scopeHint")


class WriteResult(BaseModel):
    """The outcome of one write request, in request order."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    disposition: str
    note_id: str | None = None
    reason: str = ""
    final_scope: dict[str, str | None] | None = None
    duration_ms: float = 0.0
    request: Any = None


class Disposition(StrEnum):
    """Every outcome a write request can have (reference §2.3 item 7, plus the gate)."""

    WRITTEN = "written"
    SUPERSEDED_OWN = "superseded-own"
    DEDUPED = "deduped"
    SKIPPED_DUPLICATE = "skipped-duplicate"
    SKIPPED_CAP = "skipped-cap"
    REJECTED_TYPE = "rejected-type"
    SKIPPED_DISABLED = "skipped-disabled"
    ERROR = "error"


DISPOSITIONS: tuple[str, ...] = tuple(d.value for d in Disposition)
#: Dispositions whose audit step is marked 'Failed' (the reason is the error message).
FAILED_DISPOSITIONS: frozenset[str] = frozenset(
    {Disposition.ERROR.value, Disposition.REJECTED_TYPE.value}
)

ALLOWED_TYPES: tuple[str, ...] = tuple(t.value for t in IN_FLIGHT_TYPES)
ALLOWED_SCOPE_HINTS: tuple[str, ...] = ("user", "agent")
NEAR_DUP_TOP_K = 3
FEEDBACK_TEXT_LIMIT = 120

STEP_TYPE = "Tool"
STEP_NAME = "Memory Write"
GATE_STEP_NAME = "Memory Writes: skipped (AllowMemoryWrite=false)"

REASON_WRITTEN = (
    "Memory recorded. It is active immediately and will be reviewed by the Memory Manager."
)
REASON_SUPERSEDED = "Updated the memory you recorded earlier this run (last write wins)."
REASON_DEDUPED = (
    "This memory already exists verbatim — its relevance was reinforced instead of duplicating it."
)
REASON_DUPLICATE = "This exact memory was already recorded this run. Do not re-submit it."
REASON_EMPTY = "Memory note text is empty."
REASON_AGENT_WIDE_CLAMPED = (
    "Saved for the current user only: this agent does not save agent-wide memories from"
    " this run (agentWideWrites={mode}{why})."
)
REASON_AGENT_WIDE_REJECTED = (
    "Agent-wide memories are not saved for this agent from a run without a company"
    " and user (agentWideWrites={mode}{why}): the memory would reach every context of the"
    " agent. Nothing was saved."
)
REASON_INSTRUCTION = (
    "Memory note reads as an instruction to the assistant (steering text, a role prefix or"
    " prompt markup), not a fact — nothing was saved. Record descriptive facts only."
)
REASON_DISABLED = (
    "AllowMemoryWrite=false — this agent does not have durable memory writes enabled;"
    " nothing was saved."
)
GATE_FEEDBACK = (
    "Memory write result: this agent does not have durable memory writes enabled — the"
    " requested memories were NOT saved. Do not emit memoryWrites again."
)


def type_reason(note_type: object) -> str:
    """The reference's rejection reason for a type other than Preference/Context (a long
    type is quoted clipped, as echoes are)."""
    return (
        f"Memory type \"{clipped(str(note_type))}\" is not allowed in-flight — only 'Preference' and"
        " 'Context'. Behavioral/constraint memories require Memory Manager or human promotion."
    )


def length_reason(limit: int, length: int) -> str:
    """The reference's rejection reason for a note longer than ``limit`` after trimming."""
    return f"Memory note exceeds the {limit}-character limit ({length}). Record one atomic fact per write."


def cap_reason(cap: int) -> str:
    """The reference's reason for a write skipped because the run's cap is full."""
    return (
        f"Per-run memory write cap ({cap}) reached. Remaining facts will be captured by the"
        " scheduled Memory Manager."
    )
