"""Undo: an analyst's restore of a note a decision retired (CONTRACT §2.7 "Undo").

``restore_note`` reads the note's events, finds the last one that took it out of the
injectable statuses (a Memory Manager ``revoked``, ``archived`` or ``merged``, or an
analyst's own archive), and puts the note back to the status it had before, recording a
``restored`` event (actor analyst, ``details.undoes`` = the undone kind,
``details.rule`` = the undone event's rule).

The restore sticks: the phases ask ``Sources.restored_rules`` for their candidates and
leave a note alone under the rule it was restored from, until the analyst changes the
note again (an update or a status change after the restore clears it).

Restoring a source of a consolidation does not touch the merged note: it stays as it is
(both are injectable; the analyst archives the merged note if it should go too). The
source's ``consolidated_into_note_id`` is cleared, the merged note's
``derived_from_note_ids`` keep their lineage.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import NotFoundError, ValidationError
from memory_pipelines.note_events import Actor, EventKind, NoteEvent, note_event
from memory_pipelines.notes import INJECTABLE_STATUSES, Note, NoteStatus, append_comment

INJECTABLE = frozenset(str(s.value) for s in INJECTABLE_STATUSES)


def undone_event(events: Sequence[NoteEvent]) -> NoteEvent | None:
    """The last event that took the note from an injectable to a retired status (the
    decision a restore undoes); None when the events record no such change."""
    for ev in reversed(events):
        if ev.status_before in INJECTABLE and ev.status_after not in INJECTABLE:
            return ev
    return None


def restore_note(mem: MemoryContext, note_id: str) -> Note:
    """Return a revoked, archived or merged note to the status it had before the decision
    that retired it (Active when its events do not say), recording ``restored``.

    ``NotFoundError`` for an unknown id, ``ValidationError`` for a note that is already
    injectable (nothing to undo)."""
    if not isinstance(note_id, str) or not note_id:
        raise ValidationError("note_id must be a non-empty string")
    note = mem.store.notes.get(note_id)
    if note is None:
        raise NotFoundError(f"note {note_id!r} does not exist")
    if str(note.status) in INJECTABLE:
        raise ValidationError(
            f"note {note_id!r} is already injectable ({note.status}): nothing to restore"
        )
    undone = undone_event(mem.sources.note_history(note_id))
    status = (
        undone.status_before if undone is not None and undone.status_before else NoteStatus.ACTIVE
    )
    kind = undone.event if undone is not None else None
    rule = undone.details.get("rule") if undone is not None else None
    update = {
        "status": str(status),
        "consolidated_into_note_id": None,
        "comments": append_comment(
            note.comments, f"[Restored by analyst: undoes {kind or 'an unrecorded change'}]"
        ),
    }
    after = Note.model_validate({**note.model_dump(), **update})
    event = note_event(
        EventKind.RESTORED,
        after,
        before=note,
        actor=Actor.ANALYST,
        phase="manual",
        related=undone.related_note_ids if undone is not None else (),
        undoes=kind,
        rule=rule,
        undone_event_id=undone.id if undone is not None else None,
    )
    vector = mem.store.notes.vectors([note_id]).get(note_id)  # the text is unchanged
    vectors = None if vector is None else np.asarray([vector])
    return mem.notebook.save_notes([after], vectors, events=[event])[0]
