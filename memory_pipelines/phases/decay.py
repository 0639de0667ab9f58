"""TTL expiry and Ebbinghaus decay, maintenance phase 5 (reference §4.11): notes and
examples past ``expires_at`` are archived; auto notes and low-scored examples of
archive-enabled agents decay, and are archived below the floor (the rules are in
:mod:`memory_pipelines.phases.ebbinghaus`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import pandas as pd

from memory_pipelines.context import MemoryContext
from memory_pipelines.note_events import EventKind, NoteEvent
from memory_pipelines.notes import Example, ExampleStatus, Note, NoteStatus, append_comment
from memory_pipelines.partitions import note_filter
from memory_pipelines.phases.common import (
    ACTIVE,
    IMMUTABLE,
    PROTECTED,
    PhaseRun,
    example_changed,
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


@dataclass
class _NoteDecay:
    """What the decay of notes did: the factors applied, the notes saved (archived or with
    a decayed score) and those it archived, Protected notes it left alone."""

    factors: list[float] = field(default_factory=list)
    ephemeral: int = 0
    changed: int = 0
    archived: int = 0
    protected_preserved: int = 0


@exclusive_phase
def run(mem: MemoryContext, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
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
    pr = PhaseRun.start(mem, run_id, partition)
    notes_expired = _expire_notes(pr)
    examples_expired = _expire_examples(pr)
    enabled = [a.agent_id for a in mem.sources.list_agents() if a.auto_archive_enabled]
    decayed = _decay_notes(pr, enabled)
    examples_archived = _decay_examples(pr, enabled)
    _record(pr, notes_expired, examples_expired, decayed, examples_archived, enabled)
    return pr.report


def _expire_notes(pr: PhaseRun) -> int:
    """Archive the injectable non-Immutable notes past ``expires_at`` (oldest first, at
    most ``ttl_max_notes_per_run``), each with an ``archived`` event of rule ``ttl``."""
    mem, cfg = pr.mem, pr.mem.maintenance_config.decay
    df = mem.store.notes.scan(
        and_(
            injectable(),
            not_null("expires_at"),
            cmp("expires_at", "<", pr.now),
            ne("protection_tier", IMMUTABLE),
            note_filter(pr.partition),
        ),
        columns=["id", "expires_at"],
    )
    ids = _oldest_ids(_not_restored(mem, df, RULE_TTL), "expires_at", cfg.ttl_max_notes_per_run)
    if not ids:
        return 0
    expired: list[Note] = []
    events: list[NoteEvent] = []
    loaded, vectors = mem.store.notes.scan_with_vectors(in_("id", ids))
    for note in loaded:
        comment = expiry_comment(note.expires_at)
        new = note.model_copy(
            update={
                "status": NoteStatus.ARCHIVED.value,
                "comments": append_comment(note.comments, comment),
            }
        )
        expired.append(new)
        pr.report.note_changed(new, "archived-expired")
        events.append(
            manager_event(
                EventKind.ARCHIVED, new, note, phase="decay", run_id=pr.run_id, rule=RULE_TTL,
                reason=comment.strip(" []"),
            )
        )  # fmt: skip
    save_notes(mem, expired, vectors, events)
    return len(expired)


def _expire_examples(pr: PhaseRun) -> int:
    """Archive the Active examples past ``expires_at`` (oldest first, at most
    ``ttl_max_examples_per_run``)."""
    mem, cfg = pr.mem, pr.mem.maintenance_config.decay
    dfe = mem.store.examples.scan(
        and_(
            eq("status", ExampleStatus.ACTIVE.value),
            not_null("expires_at"),
            cmp("expires_at", "<", pr.now),
            note_filter(pr.partition),
        ),
        columns=["id", "expires_at"],
    )
    expired: list[Example] = []
    for ex in mem.store.examples.get_many(
        _oldest_ids(dfe, "expires_at", cfg.ttl_max_examples_per_run)
    ):
        new = ex.model_copy(
            update={
                "status": ExampleStatus.ARCHIVED.value,
                "comments": append_comment(ex.comments, expiry_comment(ex.expires_at)),
            }
        )
        expired.append(new)
        example_changed(pr.report, new, "archived-expired")
    save_examples(mem, expired)
    return len(expired)


def _decay_candidates(pr: PhaseRun, enabled: list[str], done: _NoteDecay) -> list[str]:
    """The ids of the notes to decay, longest untouched first (at most
    ``max_notes_per_run``), counting the Protected notes touched recently that are spared."""
    mem, cfg = pr.mem, pr.mem.maintenance_config.decay
    dfn = mem.store.notes.scan(
        and_(
            eq("status", ACTIVE),
            eq("is_auto_generated", True),
            in_("agent_id", enabled),
            not_null("importance_score"),
            ne("protection_tier", IMMUTABLE),
            note_filter(pr.partition),
        ),
        columns=["id", "protection_tier", "last_accessed_at", "created_at"],
    )
    dfn = _not_restored(mem, dfn, RULE_DECAY)
    if not len(dfn):
        return []
    since = _untouched_since(dfn)
    horizon = pr.now - timedelta(days=cfg.protected_inactivity_days)
    preserved = (dfn["protection_tier"] == PROTECTED) & (since > horizon)
    done.protected_preserved = int(preserved.sum())
    rest = dfn[~preserved].assign(_since=since[~preserved])
    return _oldest_ids(rest, "_since", cfg.max_notes_per_run)


def _decay_notes(pr: PhaseRun, enabled: list[str]) -> _NoteDecay:
    """Decay the candidate notes: archive those below the floor (with an ``archived``
    event of rule ``decay``), save the decayed score of the others when it changed."""
    mem, cfg = pr.mem, pr.mem.maintenance_config.decay
    done = _NoteDecay()
    decay_ids = _decay_candidates(pr, enabled, done)
    if not decay_ids:
        return done
    changed: list[Note] = []
    events: list[NoteEvent] = []
    rows: list[int] = []
    loaded, vectors = mem.store.notes.scan_with_vectors(in_("id", decay_ids))
    for i, note in enumerate(loaded):
        outcome = decay_note(note, pr.now, cfg)
        if outcome.outcome == "protected-preserved":  # touched since the column scan
            done.protected_preserved += 1
            continue
        if outcome.outcome not in ("archive", "update", "unchanged"):
            continue
        done.factors.append(outcome.factor)
        done.ephemeral += int(outcome.ephemeral)
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
            pr.report.note_changed(new, "archived-decay")
            done.archived += 1
            events.append(
                manager_event(
                    EventKind.ARCHIVED, new, note, phase="decay", run_id=pr.run_id,
                    rule=RULE_DECAY,
                    reason=archival_comment(outcome.new_score, cfg).strip(" []"),
                    factor=outcome.factor,
                )
            )  # fmt: skip
        elif outcome.outcome == "update":
            new = note.model_copy(update={"importance_score": outcome.new_score})
        else:
            continue
        changed.append(new)
        rows.append(i)
    save_notes(mem, changed, vectors[rows] if rows else None, events)
    done.changed = len(changed)
    return done


def _decay_examples(pr: PhaseRun, enabled: list[str]) -> int:
    """Archive the auto-generated low-scored examples whose decayed score fell below the
    floor (longest untouched first, at most ``max_examples_per_run`` evaluated)."""
    mem, cfg = pr.mem, pr.mem.maintenance_config.decay
    dfx = mem.store.examples.scan(
        and_(
            eq("status", ExampleStatus.ACTIVE.value),
            eq("is_auto_generated", True),
            in_("agent_id", enabled),
            or_(is_null("success_score"), cmp("success_score", "<", cfg.example_success_threshold)),
            note_filter(pr.partition),
        ),
        columns=["id", "last_accessed_at", "created_at"],
    )
    if not len(dfx):
        return 0
    archived: list[Example] = []
    ids = _oldest_ids(dfx.assign(_since=_untouched_since(dfx)), "_since", cfg.max_examples_per_run)
    for ex in mem.store.examples.get_many(ids):
        outcome = decay_example(ex, pr.now, cfg)
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
        archived.append(new)
        example_changed(pr.report, new, "archived-decay")
    save_examples(mem, archived)
    return len(archived)


def _record(
    pr: PhaseRun,
    notes_expired: int,
    examples_expired: int,
    decayed: _NoteDecay,
    examples_archived: int,
    enabled: list[str],
) -> None:
    """Fill the report's counts and close the phase with its audit step."""
    factors = decayed.factors
    pr.report.update(
        notesArchived=decayed.archived,
        examplesArchived=examples_archived,
        notesExpired=notes_expired,
        examplesExpired=examples_expired,
        decayScoreDistribution=(
            {
                "min": round(min(factors), 3),
                "max": round(max(factors), 3),
                "mean": round(sum(factors) / len(factors), 3),
            }
            if factors
            else None
        ),
        protectedPreserved=decayed.protected_preserved,
        ephemeralAccelerated=decayed.ephemeral,
    )
    pr.report.extra.update(
        notesDecayed=decayed.changed - decayed.archived, notesEvaluated=len(factors)
    )
    pr.close("decay", STEP, {"archiveEnabledAgents": len(enabled)})
