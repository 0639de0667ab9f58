"""TTL expiry and Ebbinghaus decay, maintenance phase 5 (reference §4.11): notes and
examples past ``expires_at`` are archived; auto notes and low-scored examples of
archive-enabled agents decay, and are archived below the floor (the rules are in
:mod:`memory_pipelines.phases.ebbinghaus`)."""

from __future__ import annotations

from datetime import timedelta

import pandas as pd

from memory_pipelines.context import MemoryContext
from memory_pipelines.events import EventKind, NoteEvent
from memory_pipelines.notes import Example, ExampleStatus, Note, NoteStatus, append_comment
from memory_pipelines.partitions import note_filter
from memory_pipelines.phases import audit
from memory_pipelines.phases.common import (
    ACTIVE,
    IMMUTABLE,
    PROTECTED,
    example_changed,
    maintenance_run_id,
    manager_event,
    restored_against,
    save_examples,
    save_notes,
)
from memory_pipelines.phases.ebbinghaus import (
    archival_comment,
    decay_example,
    decay_note,
    example_archival_comment,
    expiry_comment,
)
from memory_pipelines.phases.lease import exclusive_phase
from memory_pipelines.phases.reports import PhaseReport
from memory_pipelines.store import and_, cmp, eq, in_, injectable, is_null, ne, not_null, or_

#: the audit step name, as the reference writes it
STEP = "Decay-Based Archival"
#: the ``details.rule`` of the archiving events (and of the restores that undo them)
RULE_TTL = "ttl"
RULE_DECAY = "decay"


def _oldest_ids(df: pd.DataFrame, by: str, limit: int) -> list[str]:
    if df.empty or limit <= 0:
        return []
    return df.sort_values([by, "id"], na_position="first").head(limit)["id"].tolist()


def _not_restored(mem: MemoryContext, df: pd.DataFrame, rule: str) -> pd.DataFrame:
    """``df`` without the notes an analyst restored from ``rule`` (and left alone since)."""
    if df.empty:
        return df
    return df[~df["id"].isin(restored_against(mem, df["id"], rule))]


def _untouched_since(df: pd.DataFrame) -> pd.Series:
    return df["last_accessed_at"].where(df["last_accessed_at"].notna(), df["created_at"])


@exclusive_phase
def run(
    mem: MemoryContext, run_id: str | None = None, partition: str | None = None
) -> PhaseReport:
    """Phase 5: TTL expiry, then Ebbinghaus decay, of notes and examples.

    TTL: injectable non-Immutable notes and Active examples whose ``expires_at`` has
    passed (at most 200 each) become Archived with "[Archived by Memory Manager: expired
    on <expires_at>]" appended. Decay: Active auto-generated scored notes (and examples
    below success score 50) of agents with ``auto_archive_enabled``, longest untouched
    first (at most 1000 notes and 500 examples): a note falling below the floor is
    Archived with a comment, otherwise its decayed score is saved when the factor is
    below 0.99; Protected notes touched within 365 days and Immutable notes are exempt.
    Each archived note gets an ``archived`` event (rule ``ttl`` or ``decay``; a decayed
    score alone is no event); a note an analyst restored from a rule is left alone by it.
    Audit step "Decay-Based Archival". Returns notesArchived, examplesArchived,
    notesExpired, examplesExpired, decayScoreDistribution, protectedPreserved,
    ephemeralAccelerated.
    """
    run_id = maintenance_run_id(run_id)
    cfg = mem.maintenance_config.decay
    started = now = mem.now()
    report = PhaseReport()

    # -- TTL: notes
    df = mem.store.notes.scan(
        and_(
            injectable(),
            not_null("expires_at"),
            cmp("expires_at", "<", now),
            ne("protection_tier", IMMUTABLE),
            note_filter(partition),
        ),
        columns=["id", "expires_at"],
    )
    expired_notes: list[Note] = []
    events: list[NoteEvent] = []
    ids = _oldest_ids(_not_restored(mem, df, RULE_TTL), "expires_at", cfg.ttl_max_notes_per_run)
    if ids:
        loaded, vectors = mem.store.notes.scan_with_vectors(in_("id", ids))
        for note in loaded:
            comment = expiry_comment(note.expires_at)
            new = note.model_copy(
                update={
                    "status": NoteStatus.ARCHIVED.value,
                    "comments": append_comment(note.comments, comment),
                }
            )
            expired_notes.append(new)
            report.note_changed(new, "archived-expired")
            events.append(
                manager_event(
                    EventKind.ARCHIVED, new, note, phase="decay", run_id=run_id, rule=RULE_TTL,
                    reason=comment.strip(" []"),
                )
            )  # fmt: skip
        save_notes(mem, expired_notes, vectors, events)

    # -- TTL: examples
    dfe = mem.store.examples.scan(
        and_(
            eq("status", ExampleStatus.ACTIVE.value),
            not_null("expires_at"),
            cmp("expires_at", "<", now),
            note_filter(partition),
        ),
        columns=["id", "expires_at"],
    )
    expired_examples: list[Example] = []
    for ex in mem.store.examples.get_many(
        _oldest_ids(dfe, "expires_at", cfg.ttl_max_examples_per_run)
    ):
        new = ex.model_copy(
            update={
                "status": ExampleStatus.ARCHIVED.value,
                "comments": append_comment(ex.comments, expiry_comment(ex.expires_at)),
            }
        )
        expired_examples.append(new)
        example_changed(report, new, "archived-expired")
    save_examples(mem, expired_examples)

    # -- decay: notes
    enabled = [a.agent_id for a in mem.sources.list_agents() if a.auto_archive_enabled]
    cols = ["id", "protection_tier", "last_accessed_at", "created_at"]
    dfn = mem.store.notes.scan(
        and_(
            eq("status", ACTIVE),
            eq("is_auto_generated", True),
            in_("agent_id", enabled),
            not_null("importance_score"),
            ne("protection_tier", IMMUTABLE),
            note_filter(partition),
        ),
        columns=cols,
    )
    dfn = _not_restored(mem, dfn, RULE_DECAY)
    protected_preserved = 0
    decay_ids: list[str] = []
    if len(dfn):
        since = _untouched_since(dfn)
        horizon = now - timedelta(days=cfg.protected_inactivity_days)
        preserved = (dfn["protection_tier"] == PROTECTED) & (since > horizon)
        protected_preserved = int(preserved.sum())
        rest = dfn[~preserved].assign(_since=since[~preserved])
        decay_ids = _oldest_ids(rest, "_since", cfg.max_notes_per_run)
    factors: list[float] = []
    ephemeral = 0
    decay_changed: list[Note] = []
    decay_events: list[NoteEvent] = []
    notes_archived = 0
    if decay_ids:
        loaded, vectors = mem.store.notes.scan_with_vectors(in_("id", decay_ids))
        rows: list[int] = []
        for i, note in enumerate(loaded):
            outcome = decay_note(note, now, cfg)
            if outcome.outcome == "protected-preserved":  # touched since the column scan
                protected_preserved += 1
                continue
            if outcome.outcome not in ("archive", "update", "unchanged"):
                continue
            factors.append(outcome.factor)
            ephemeral += int(outcome.ephemeral)
            if outcome.outcome == "archive":
                new = note.model_copy(
                    update={
                        "status": NoteStatus.ARCHIVED.value,
                        "importance_score": outcome.new_score,
                        "comments": append_comment(
                            note.comments, archival_comment(outcome.new_score, cfg)
                        ),
                    }
                )
                report.note_changed(new, "archived-decay")
                notes_archived += 1
                decay_events.append(
                    manager_event(
                        EventKind.ARCHIVED, new, note, phase="decay", run_id=run_id,
                        rule=RULE_DECAY,
                        reason=archival_comment(outcome.new_score, cfg).strip(" []"),
                        factor=outcome.factor,
                    )
                )  # fmt: skip
            elif outcome.outcome == "update":
                new = note.model_copy(update={"importance_score": outcome.new_score})
            else:
                continue
            decay_changed.append(new)
            rows.append(i)
        save_notes(mem, decay_changed, vectors[rows] if rows else None, decay_events)

    # -- decay: examples
    dfx = mem.store.examples.scan(
        and_(
            eq("status", ExampleStatus.ACTIVE.value),
            eq("is_auto_generated", True),
            in_("agent_id", enabled),
            or_(is_null("success_score"), cmp("success_score", "<", cfg.example_success_threshold)),
            note_filter(partition),
        ),
        columns=["id", "last_accessed_at", "created_at"],
    )
    examples_archived: list[Example] = []
    if len(dfx):
        ids = _oldest_ids(
            dfx.assign(_since=_untouched_since(dfx)), "_since", cfg.max_examples_per_run
        )
        for ex in mem.store.examples.get_many(ids):
            outcome = decay_example(ex, now, cfg)
            if outcome.outcome != "archive":
                continue
            new = ex.model_copy(
                update={
                    "status": ExampleStatus.ARCHIVED.value,
                    "comments": append_comment(
                        ex.comments, example_archival_comment(outcome.effective_score)
                    ),
                }
            )
            examples_archived.append(new)
            example_changed(report, new, "archived-decay")
        save_examples(mem, examples_archived)

    report.update(
        notesArchived=notes_archived,
        examplesArchived=len(examples_archived),
        notesExpired=len(expired_notes),
        examplesExpired=len(expired_examples),
        decayScoreDistribution=(
            {
                "min": round(min(factors), 3),
                "max": round(max(factors), 3),
                "mean": round(sum(factors) / len(factors), 3),
            }
            if factors
            else None
        ),
        protectedPreserved=protected_preserved,
        ephemeralAccelerated=ephemeral,
    )
    report.extra.update(
        notesDecayed=len(decay_changed) - notes_archived, notesEvaluated=len(factors)
    )
    audit.close_phase(
        mem,
        "decay",
        STEP,
        run_id,
        {"archiveEnabledAgents": len(enabled)},
        report,
        started,
        partition=partition,
    )
    return report
