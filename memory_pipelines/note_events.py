"""Typed lifecycle events of notes: what happened to a note, when, by whom and why.

Every path that changes a note records one :class:`NoteEvent` per note it changes, in
the same step as the change (``Notebook.save_notes(..., events=...)``), into the
append-only ``note_events`` table of the SQL sources. ``history``, ``explain``, ``why``,
``restore_note``, time travel (``as_of``) and export read these rows; nothing is
reconstructed from the human-readable ``comments`` (CONTRACT §2.7).

An event carries the note's status before and after, its text after when the text
changed, and in ``details["changes"]`` the fields that changed (every field for
``created``), so the state of a note at any instant is the fold of its events up to that
instant (:func:`fold_changes`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from memory_pipelines.notes import Note, utc


class EventKind(StrEnum):
    """The kinds of lifecycle event (stable names: kinds are added, never renamed)."""

    CREATED = "created"
    DEDUPED = "deduped"
    SUPERSEDED = "superseded"
    PROMOTED = "promoted"
    MERGED = "merged"
    REVOKED = "revoked"
    ARCHIVED = "archived"
    RESTORED = "restored"
    STATUS_CHANGED = "status-changed"
    UPDATED = "updated"
    REINFORCED = "reinforced"
    PURGED = "purged"
    PROTECTION_CHANGED = "protection-changed"


class Actor(StrEnum):
    """Who made a change."""

    AGENT = "agent"  # an in-flight write of a run
    MANAGER = "memory-manager"  # a Memory Manager phase
    ANALYST = "analyst"  # a person, through the service, CLI, HTTP or the browser
    IMPORT = "import"  # import_notes


#: Fields a change record never carries: they change on every save, or are the
#: human-readable trail that events replace.
UNTRACKED_FIELDS = frozenset({"updated_at", "comments"})


class NoteEvent(BaseModel):
    """One lifecycle event of one note (a ``note_events`` row)."""

    model_config = ConfigDict(extra="forbid")

    id: int | None = Field(default=None, description="sequence number; set when stored")
    note_id: str
    event: str
    at: datetime | None = Field(default=None, description="aware UTC, the service clock")
    actor: str = Actor.ANALYST.value
    phase: str | None = None
    run_id: str | None = None
    related_note_ids: list[str] = Field(default_factory=list)
    status_before: str | None = None
    status_after: str | None = None
    text_after: str | None = None
    agent_id: str | None = None
    user_id: str | None = None
    company_id: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)

    @field_validator("at", mode="before")
    @classmethod
    def _aware(cls, value: Any) -> Any:
        return utc(value)

    @field_validator("event", "actor", mode="before")
    @classmethod
    def _plain(cls, value: Any) -> Any:
        return value.value if isinstance(value, StrEnum) else value

    @property
    def changes(self) -> dict[str, Any]:
        """The fields this event changed (JSON values), every field for ``created``."""
        return dict(self.details.get("changes") or {})


#: The fields a change record compares, in the model's order.
TRACKED_FIELDS = tuple(f for f in Note.model_fields if f not in UNTRACKED_FIELDS)


def note_changes(before: Note | None, after: Note) -> dict[str, Any]:
    """The JSON values of the fields ``after`` changed against ``before`` (all fields when
    ``before`` is None), without :data:`UNTRACKED_FIELDS`.

    Fields are compared as Python values and only the changed ones are serialised: a
    maintenance run records thousands of events, and dumping both notes whole for each
    cost more than the save it describes."""
    if before is None:
        return after.model_dump(mode="json", exclude=set(UNTRACKED_FIELDS))
    changed = {f for f in TRACKED_FIELDS if getattr(before, f) != getattr(after, f)}
    return after.model_dump(mode="json", include=changed) if changed else {}


def note_event(
    kind: str | EventKind,
    after: Note,
    *,
    before: Note | None = None,
    actor: str | Actor = Actor.ANALYST,
    phase: str | None = None,
    run_id: str | None = None,
    related: Iterable[str] = (),
    at: datetime | None = None,
    **details: Any,
) -> NoteEvent:
    """The event of one change of one note: ``before`` is the note as it was (None for a
    new note), ``after`` as it is saved. Status before/after, the text when it changed
    and the changed fields are taken from the two; ``details`` adds anything else (a
    reason, a rule, a similarity). ``at`` defaults to the save's timestamp."""
    changes = note_changes(before, after)
    return NoteEvent(
        note_id=after.id,
        event=kind,
        at=at,
        actor=actor,
        phase=phase,
        run_id=run_id,
        related_note_ids=[r for r in dict.fromkeys(related) if r and r != after.id],
        status_before=None if before is None else str(before.status),
        status_after=str(after.status),
        text_after=after.note if before is None or before.note != after.note else None,
        agent_id=after.agent_id,
        user_id=after.user_id,
        company_id=after.company_id,
        details={**details, "changes": changes},
    )


def fold_changes(
    events: Sequence[NoteEvent], base: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """The JSON fields of a note after ``events`` (oldest first), starting from ``base``
    (the fields before the first event; None when the first event is its ``created``).
    None when nothing is known (no base and no event)."""
    state: dict[str, Any] | None = None if base is None else dict(base)
    for ev in events:
        changes = ev.changes
        if state is None:
            state = {}
        state.update(changes)
        if ev.status_after is not None:
            state["status"] = ev.status_after
        if ev.text_after is not None:
            state["note"] = ev.text_after
    return state


def status_event(before: str, after: str) -> EventKind:
    """The event of an analyst's status change: ``archived``/``revoked`` when it retires an
    injectable note, ``status-changed`` otherwise."""
    if str(before) == str(after):
        return EventKind.UPDATED
    if after == "Archived":
        return EventKind.ARCHIVED
    if after == "Revoked":
        return EventKind.REVOKED
    return EventKind.STATUS_CHANGED
