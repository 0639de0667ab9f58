"""Stale-reference pruning, maintenance phase 4 (reference §4.10): auto notes whose agent,
user, company, source conversation or source run is gone are archived. A user, company,
conversation or run is gone only when it was registered and later deleted (a
``deleted_entities`` record, CONTRACT §2.9), never because it was never registered."""

from __future__ import annotations

from collections import Counter

import pandas as pd

from memory_pipelines.context import MemoryContext
from memory_pipelines.note_events import EventKind, NoteEvent
from memory_pipelines.notes import Note, NoteStatus, append_comment
from memory_pipelines.partitions import note_filter
from memory_pipelines.phases.common import (
    ACTIVE,
    IMMUTABLE,
    PhaseRun,
    manager_event,
    restored_against,
    save_notes,
)
from memory_pipelines.phases.ebbinghaus import iso
from memory_pipelines.phases.lease import exclusive_phase
from memory_pipelines.phases.reports import PhaseReport
from memory_pipelines.store import and_, eq, in_, ne

#: the audit step name, as the reference writes it
STEP = "Prune Stale References"

#: the ``details.rule`` of this phase's events (and of the restores that undo them)
RULE = "stale-reference"

#: the note field holding each kind of reference
REFERENCE_FIELDS = {
    "agent": "agent_id",
    "user": "user_id",
    "company": "company_id",
    "conversation": "source_conversation_id",
    "run": "source_run_id",
}

STALE_REASONS = {
    "agent": "referenced agent is inactive or deleted",
    "user": "referenced user no longer exists",
    "company": "referenced company no longer exists",
    "conversation": "source conversation no longer exists",
    "run": "source run no longer exists",
}


#: (kind, note column) of every reference pruning checks; "run" counts in
#: ``report.extra["orphanedRuns"]`` (the reference's report has no run key).
REFERENCES = (
    ("agent", "agent_id"),
    ("user", "user_id"),
    ("company", "company_id"),
    ("conversation", "source_conversation_id"),
    ("run", "source_run_id"),
)


def missing_reference(mem: MemoryContext, df: pd.DataFrame, kind: str, col: str) -> pd.Series:
    """Which rows of ``df`` name a ``kind`` that is gone (ids compared ignoring case).

    An agent is gone when it is not configured or not Active (agents are configured, never
    registered by use). A user, company, conversation or run is gone only when it was
    registered and later deleted (CONTRACT §2.9): it is missing now and a deletion record
    at or after the note's ``created_at`` exists. An id that was never registered, or a
    note written after the deletion (the id was used again), is not stale.
    """
    if not len(df) or col not in df:
        return pd.Series(False, index=df.index, dtype=bool)
    values = df[col]
    present = values.notna() & (values.astype(str) != "")
    lowered = values.astype(str).str.lower()
    ids = values[present].astype(str).unique().tolist()
    known_low = {k.lower() for k in mem.sources.existing_ids(kind, ids)}
    missing = present & ~lowered.isin(known_low)
    if kind == "agent" or not missing.any():
        return missing
    deleted = mem.sources.deleted_ids(kind, values[missing].astype(str).unique().tolist())
    if not deleted:
        return pd.Series(False, index=df.index, dtype=bool)
    created = pd.to_datetime(df["created_at"], utc=True)
    when = pd.to_datetime(lowered.map(deleted), utc=True)
    return missing & when.notna() & (created.isna() | (created <= when))


@exclusive_phase
def run(mem: MemoryContext, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
    """Phase 4: archive auto notes whose agent, user, company or source conversation is gone.

    Candidates: Active, auto-generated, non-Immutable notes. An agent counts only if it
    exists and is Active. The oldest stale notes (at most 200) become Archived with
    "[Archived by Memory Manager: stale reference pruning - <reasons> on <ISO now>]"
    appended and an ``archived`` event naming the missing references; a note an analyst
    restored from this rule is not pruned again. Audit step "Prune Stale References". Returns notesArchived,
    orphanedAgents, orphanedUsers, orphanedCompanies, orphanedConversations.
    """
    pr = PhaseRun.start(mem, run_id, partition)
    df = mem.store.notes.scan(
        and_(
            eq("status", ACTIVE),
            eq("is_auto_generated", True),
            ne("protection_tier", IMMUTABLE),
            note_filter(partition),
        ),
        columns=["id", *(col for _, col in REFERENCES), "created_at"],
    )
    flags = {kind: missing_reference(mem, df, kind, col) for kind, col in REFERENCES}
    stale = _stale(mem, df, flags)
    picked = (
        df[stale]
        .sort_values(["created_at", "id"], na_position="first")
        .head(mem.maintenance_config.pruning.max_notes_per_run)
        if len(df)
        else df
    )
    orphaned = Counter()
    archived = _archive(pr, picked, flags, orphaned) if len(picked) else 0
    _record(pr, archived, orphaned, len(df), int(stale.sum()) if len(df) else 0)
    return pr.report


def _stale(mem: MemoryContext, df: pd.DataFrame, flags: dict[str, pd.Series]) -> pd.Series:
    """Which rows name at least one reference that is gone, less the notes an analyst
    restored from this rule."""
    stale = pd.Series(False, index=df.index)
    for mask in flags.values():
        stale |= mask
    if len(df):  # a note the analyst restored from this rule stays
        stale &= ~df["id"].isin(restored_against(mem, df.loc[stale, "id"], RULE))
    return stale


def _archive(
    pr: PhaseRun, picked: pd.DataFrame, flags: dict[str, pd.Series], orphaned: Counter
) -> int:
    """Archive the picked notes, each with a comment and an ``archived`` event naming its
    missing references; ``orphaned`` counts them by kind. Returns how many."""
    reasons_of = {
        row_id: [STALE_REASONS[k] for k in STALE_REASONS if bool(flags[k].loc[idx])]
        for idx, row_id in picked["id"].items()
    }
    loaded, vectors = pr.mem.store.notes.scan_with_vectors(in_("id", list(reasons_of)))
    stamp = iso(pr.now)
    archived: list[Note] = []
    events: list[NoteEvent] = []
    for note in loaded:
        reasons = reasons_of[note.id]
        for kind, text in STALE_REASONS.items():
            if text in reasons:
                orphaned[kind] += 1
        new = note.model_copy(
            update={
                "status": NoteStatus.ARCHIVED.value,
                "comments": append_comment(
                    note.comments,
                    f"[Archived by Memory Manager: stale reference pruning - {'; '.join(reasons)} on {stamp}]",
                ),
            }
        )
        archived.append(new)
        pr.report.note_changed(new, "archived-stale")
        missing = {
            k: getattr(note, REFERENCE_FIELDS[k]) for k, t in STALE_REASONS.items() if t in reasons
        }
        events.append(
            manager_event(
                EventKind.ARCHIVED, new, note, phase="pruning", run_id=pr.run_id, rule=RULE,
                reason="; ".join(f"{t} ({missing[k]})" for k, t in STALE_REASONS.items() if k in missing),
                missing_references=missing,
            )
        )  # fmt: skip
    save_notes(pr.mem, archived, vectors, events)
    return len(archived)


def _record(pr: PhaseRun, archived: int, orphaned: Counter, checked: int, stale: int) -> None:
    """Fill the report's counts and close the phase with its audit step."""
    pr.report.update(
        notesArchived=archived,
        orphanedAgents=orphaned["agent"],
        orphanedUsers=orphaned["user"],
        orphanedCompanies=orphaned["company"],
        orphanedConversations=orphaned["conversation"],
    )
    pr.report.extra.update(candidatesChecked=checked, staleFound=stale)
    pr.report.extra["orphanedRuns"] = orphaned["run"]
    pr.close("pruning", STEP, {"candidateCount": checked})
