"""What several phases share: the maintenance settings, run ids, unit vectors, a note's
exact scope, saving changed notes (with their lifecycle events) and examples under their
stored vectors (nothing is re-embedded), and the analyst's restores the phases respect."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from memory_pipelines.context import MemoryContext
from memory_pipelines.note_events import Actor, EventKind, NoteEvent, note_event
from memory_pipelines.notes import Example, Note, NoteStatus, ProtectionTier, new_id
from memory_pipelines.phases import audit
from memory_pipelines.phases.reports import PhaseReport

ACTIVE = NoteStatus.ACTIVE.value
IMMUTABLE = ProtectionTier.IMMUTABLE.value
PROTECTED = ProtectionTier.PROTECTED.value
STANDARD = ProtectionTier.STANDARD.value
EPHEMERAL = ProtectionTier.EPHEMERAL.value

#: rows per upsert when a phase saves many notes
SAVE_CHUNK = 50_000


def maintenance_run_id(run_id: str | None) -> str:
    """``run_id``, or a new ``maintenance-...`` id."""
    return run_id or f"maintenance-{new_id()}"


@dataclass
class PhaseRun:
    """One run of a maintenance phase: its context, run id and partition, the instant it
    started (the phase's "now") and the report its steps fill."""

    mem: MemoryContext
    run_id: str
    partition: str | None
    started: datetime
    report: PhaseReport = field(default_factory=PhaseReport)

    @classmethod
    def start(cls, mem: MemoryContext, run_id: str | None, partition: str | None) -> PhaseRun:
        """A run starting now, under ``run_id`` or a new maintenance run id."""
        return cls(mem, maintenance_run_id(run_id), partition, mem.now())

    @property
    def now(self) -> datetime:
        return self.started

    def close(self, phase: str, step_name: str, step_input: Any, output: Any = None) -> None:
        """Record the phase's closing audit step and its run (see ``audit.close_phase``)."""
        audit.close_phase(
            self.mem, phase, step_name, self.run_id, step_input, self.report, self.started,
            output=output, partition=self.partition,
        )  # fmt: skip


def unit(mat: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), so dot products are cosines."""
    mat = np.asarray(mat, dtype=np.float32)
    if mat.size == 0:
        return mat
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return mat / norms


def scope_triple(note: Note) -> tuple[str | None, str | None, str | None]:
    """A note's exact (agent, user, company) scope."""
    return (note.agent_id, note.user_id, note.company_id)


def created(note: Note, now: datetime) -> datetime:
    return note.created_at or now


def manager_event(
    kind: str | EventKind,
    after: Note,
    before: Note | None,
    *,
    phase: str,
    run_id: str | None,
    rule: str,
    reason: str | None = None,
    related: Iterable[str] = (),
    **details: Any,
) -> NoteEvent:
    """The event of one Memory Manager decision on one note (actor ``memory-manager``,
    ``details.rule`` naming the rule, ``details.reason`` the human sentence)."""
    extra = {"rule": rule, **({"reason": reason} if reason else {}), **details}
    return note_event(
        kind, after, before=before, actor=Actor.MANAGER, phase=phase, run_id=run_id,
        related=related, **extra,
    )  # fmt: skip


def restored_against(mem: MemoryContext, note_ids: Iterable[str], rule: str) -> set[str]:
    """Of ``note_ids``, those an analyst restored from a decision of ``rule`` and has not
    changed since: the phase applying ``rule`` leaves them alone (CONTRACT §2.7 "Undo")."""
    return {nid for nid, rules in mem.sources.restored_rules(note_ids).items() if rule in rules}


def save_notes(
    mem: MemoryContext,
    notes: Sequence[Note],
    vectors: np.ndarray | None = None,
    events: Sequence[NoteEvent] = (),
) -> None:
    """Save changed notes with their stored vectors (nothing is re-embedded), recording
    ``events`` (the lifecycle events of these changes) with the chunk that saves their
    note, in the same step."""
    if not notes:
        return
    if vectors is None:
        stored = mem.store.notes.vectors([n.id for n in notes])
        missing = [n for n in notes if n.id not in stored]
        if missing:  # a row without a vector cannot exist, but never save a zero vector
            stored.update(
                zip([n.id for n in missing], mem.embed([n.note for n in missing]), strict=True)
            )
        vectors = np.stack([stored[n.id] for n in notes])
    events_of: dict[str, list[NoteEvent]] = {}
    for ev in events:
        events_of.setdefault(ev.note_id, []).append(ev)
    for start in range(0, len(notes), SAVE_CHUNK):
        part = list(notes[start : start + SAVE_CHUNK])
        mem.notebook.save_notes(
            part,
            vectors[start : start + SAVE_CHUNK],
            events=[ev for n in part for ev in events_of.pop(n.id, [])],
        )


def save_examples(mem: MemoryContext, examples: Sequence[Example]) -> None:
    """Save changed examples with their stored vectors."""
    if not examples:
        return
    stored = mem.store.examples.vectors([e.id for e in examples])
    missing = [e for e in examples if e.id not in stored]
    if missing:
        stored.update(
            zip([e.id for e in missing], mem.embed([e.example_input for e in missing]), strict=True)
        )
    mem.notebook.save_examples(list(examples), np.stack([stored[e.id] for e in examples]))


def example_changed(report: PhaseReport, example: Example, action: str) -> None:
    """Record a changed example in the report's ``changed`` rows."""
    report.changed.append(
        {
            "id": example.id,
            "agent_id": example.agent_id,
            "user_id": example.user_id,
            "company_id": example.company_id,
            "type": "Example",
            "status": example.status,
            "protection_tier": None,
            "action": action,
            "note": example.example_input,
        }
    )
