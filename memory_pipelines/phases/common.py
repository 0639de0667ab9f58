"""What several phases share: the maintenance settings, run ids, unit vectors, a note's
exact scope, and saving changed notes and examples under their stored vectors (nothing is
re-embedded)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np

from memory_pipelines.context import MemoryContext
from memory_pipelines.notes import Example, Note, NoteStatus, ProtectionTier, new_id
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


def save_notes(
    mem: MemoryContext, notes: Sequence[Note], vectors: np.ndarray | None = None
) -> None:
    """Save changed notes with their stored vectors (nothing is re-embedded)."""
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
    for start in range(0, len(notes), SAVE_CHUNK):
        mem.notebook.save_notes(list(notes[start : start + SAVE_CHUNK]), vectors[start : start + SAVE_CHUNK])


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
