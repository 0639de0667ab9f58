"""The write path's lifecycle events (CONTRACT §2.7): the event each disposition records on
the note whose row it changes, actor ``agent``, phase ``write``, the writing run's id.

* ``written`` -> ``created`` on the new note (rule ``write``). It is recorded once the run's
  ledger has committed the write, at the save's instant: a note the cap or another writer
  of the run undoes leaves no event behind.
* ``superseded-own`` -> ``superseded`` on the run's own note, rewritten in place (same id;
  text and type change, scope, status and TTL are kept; rule ``write-supersede``).
* ``deduped`` -> ``reinforced`` on the existing note the request restated verbatim
  (access count + 1, last access now; rule ``write-reinforce``). No note is created or
  dropped, so there is no note to give a ``deduped`` event.
* ``skipped-duplicate``, ``skipped-cap``, ``rejected-type``, ``skipped-disabled`` and
  ``error`` change no row and record nothing.

``details`` name the disposition, the rule, the reason the agent read back and the cosine
similarity of the near-duplicate match when there was one. The batched path folds the
requests of one batch that touch one note into one row change, so one event: ``writes``
(how many requests it folds) says so when it is more than one.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from memory_pipelines.note_events import Actor, EventKind, NoteEvent, note_event
from memory_pipelines.notes import Note
from memory_pipelines.writes.models import (
    REASON_DEDUPED,
    REASON_SUPERSEDED,
    REASON_WRITTEN,
    Disposition,
)

WRITE_PHASE = "write"
RULE_WRITE = "write"
RULE_SUPERSEDE = "write-supersede"
RULE_REINFORCE = "write-reinforce"


def _extra(similarity: float | None, writes: int) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if similarity is not None:
        extra["similarity"] = round(float(similarity), 6)
    if writes > 1:
        extra["writes"] = writes
    return extra


def _write_event(
    kind: EventKind,
    disposition: Disposition,
    rule: str,
    reason: str,
    before: Note | None,
    after: Note,
    run_id: str | None,
    *,
    similarity: float | None,
    writes: int,
    at: datetime | None,
) -> NoteEvent:
    """The event of one write's change: by the agent, in the write phase, of its run."""
    return note_event(
        kind,
        after,
        before=before,
        actor=Actor.AGENT,
        phase=WRITE_PHASE,
        run_id=run_id or None,
        at=at,
        disposition=disposition.value,
        rule=rule,
        reason=reason,
        **_extra(similarity, writes),
    )


def created_event(note: Note, run_id: str | None, *, writes: int = 1) -> NoteEvent:
    """``created`` for a note a ``written`` request saved (``note`` as saved, stamped: the
    event is at its ``updated_at``)."""
    return _write_event(
        EventKind.CREATED, Disposition.WRITTEN, RULE_WRITE, REASON_WRITTEN, None, note, run_id,
        similarity=None, writes=writes, at=note.updated_at,
    )  # fmt: skip


def superseded_event(
    before: Note,
    after: Note,
    run_id: str | None,
    *,
    similarity: float | None = None,
    writes: int = 1,
    at: datetime | None = None,
) -> NoteEvent:
    """``superseded`` for the run's own note a later write of the run rewrote (``at``
    None: the instant of the save that records it)."""
    return _write_event(
        EventKind.SUPERSEDED, Disposition.SUPERSEDED_OWN, RULE_SUPERSEDE, REASON_SUPERSEDED,
        before, after, run_id, similarity=similarity, writes=writes, at=at,
    )  # fmt: skip


def reinforced_event(
    before: Note,
    after: Note,
    run_id: str | None,
    *,
    similarity: float | None = None,
    writes: int = 1,
    at: datetime | None = None,
) -> NoteEvent:
    """``reinforced`` for an existing note a ``deduped`` request restated verbatim (``at``
    None: the instant of the save that records it)."""
    return _write_event(
        EventKind.REINFORCED, Disposition.DEDUPED, RULE_REINFORCE, REASON_DEDUPED,
        before, after, run_id, similarity=similarity, writes=writes, at=at,
    )  # fmt: skip
