"""What one Memory Manager run changed, note by note, and which changes an analyst should
look at (reads only).

``run_changes(mem, run_id)`` turns the lifecycle events a run recorded into one row per
event: when, which phase and rule, the note and its scope, the status before and after,
the note's text after the change, the reason and the judge's confidence, the related
notes, and ``review``: why a person should check this change, or "" when nothing
calls for it. Three decisions call for review:

- a note the importance phase protected on its own (``auto-protected``): protected notes
  escape decay and contradiction revocation;
- a contradiction resolved only because one note is newer (``resolved by recency
  alone``): the older note may still be the true one;
- agent-written text revoked at hardening because it reads as an instruction to the
  assistant (``instruction-like text revoked``): a prompt injection, or a false alarm.
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from memory_pipelines.context import MemoryContext
from memory_pipelines.note_events import EventKind, NoteEvent
from memory_pipelines.phases.contradictions import RULE as CONTRADICTION_RULE
from memory_pipelines.phases.hardening import RULE_INSTRUCTION

REVIEW_AUTO_PROTECTED = "auto-protected"
REVIEW_RECENCY = "resolved by recency alone"
REVIEW_INSTRUCTION = "instruction-like text revoked"
#: The review reasons, in the order an analyst reads them.
REVIEW_REASONS = (REVIEW_AUTO_PROTECTED, REVIEW_RECENCY, REVIEW_INSTRUCTION)

#: The columns of :func:`run_changes`, in order.
CHANGE_COLUMNS = [
    "at",
    "phase",
    "event",
    "rule",
    "note_id",
    "agent_id",
    "user_id",
    "company_id",
    "status_before",
    "status_after",
    "note",
    "reason",
    "confidence",
    "related_note_ids",
    "review",
]

#: The authority order's recency step ("newer by more than 7 days"), as the offline
#: judge words it; an LLM judge's reason that names only recency reads the same.
_RECENCY = re.compile(r"\bnewer\b", re.IGNORECASE)
_OTHER_AUTHORITY = re.compile(r"\b(importance|access count|accessed)\b", re.IGNORECASE)

#: At most this many events of one run become rows (a large maintenance run records
#: one event per note it touches).
MAX_CHANGES = 5000


def review_reason(event: NoteEvent) -> str:
    """Why an analyst should look at this change ("" when nothing calls for it)."""
    rule = str(event.details.get("rule") or "")
    reason = str(event.details.get("reason") or "")
    if event.event == EventKind.PROTECTION_CHANGED and event.phase == "importance":
        return REVIEW_AUTO_PROTECTED
    # the deciding rule follows "wins" in the judge's reason ("note X wins (newer ...)")
    decided_by = reason.rsplit("wins", 1)[-1]
    if (
        event.event == EventKind.REVOKED
        and rule == CONTRADICTION_RULE
        and _RECENCY.search(decided_by)
        and not _OTHER_AUTHORITY.search(decided_by)
    ):
        return REVIEW_RECENCY
    if event.event == EventKind.REVOKED and rule == RULE_INSTRUCTION:
        return REVIEW_INSTRUCTION
    return ""


def _confidence(details: dict[str, Any]) -> float | None:
    value = details.get("confidence")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def run_changes(mem: MemoryContext, run_id: str, limit: int = MAX_CHANGES) -> pd.DataFrame:
    """One row per lifecycle event the run ``run_id`` recorded (oldest first, at most
    ``limit``), with the columns :data:`CHANGE_COLUMNS`."""
    events = mem.sources.events_of_run(run_id, limit=limit)
    if not events:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in CHANGE_COLUMNS})
    missing_text = [e.note_id for e in events if e.text_after is None]
    texts = {n.id: n.note for n in mem.store.notes.get_many(list(dict.fromkeys(missing_text)))}
    rows = [
        {
            "at": e.at,
            "phase": e.phase or "",
            "event": e.event,
            "rule": str(e.details.get("rule") or ""),
            "note_id": e.note_id,
            "agent_id": e.agent_id,
            "user_id": e.user_id,
            "company_id": e.company_id,
            "status_before": e.status_before,
            "status_after": e.status_after,
            "note": e.text_after if e.text_after is not None else texts.get(e.note_id, ""),
            "reason": str(e.details.get("reason") or ""),
            "confidence": _confidence(e.details),
            "related_note_ids": ", ".join(e.related_note_ids),
            "review": review_reason(e),
        }
        for e in events
    ]
    return pd.DataFrame(rows, columns=CHANGE_COLUMNS)
