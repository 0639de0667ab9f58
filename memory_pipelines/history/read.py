"""Reading a note's history for a caller: every event of a note, but only when the caller
may see the note, so an agent-facing surface never reveals another tenant's note or text.

:func:`history_for` is the agent-facing read (MCP): the note must be visible to the run
context the way injection and explain see notes (the scope lattice and the multi-tenant
matcher of :mod:`memory_pipelines.scope`). :func:`history_for_key` is the HTTP read: an
admin key (or a home without keys) reads any note; a bound key only notes whose own
scope it may act for (:func:`memory_pipelines.keys.check_context`). Anything else is a
:class:`~memory_pipelines.errors.NotFoundError`, the same answer as an unknown id.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memory_pipelines.agents import get_agent
from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import NotFoundError, PermissionDeniedError, ValidationError
from memory_pipelines.keys import ANALYST, check_context, require_role
from memory_pipelines.limits import check_text
from memory_pipelines.note_events import NoteEvent
from memory_pipelines.notes import Note, RunContext
from memory_pipelines.scope import RunScope, parse_scopes, visible
from memory_pipelines.scope.binding import in_binding

#: note ids longer than this are not ids (a clear 404 instead of a query with them)
MAX_NOTE_ID_CHARS = 256


def _unknown(note_id: str) -> NotFoundError:
    return NotFoundError(f"note {note_id[:80]!r} does not exist")


def check_note_id(note_id: Any) -> str:
    """``note_id`` as a plain id: a non-empty string of UTF-8 text (``ValidationError``)."""
    if not isinstance(note_id, str) or not note_id.strip():
        raise ValidationError("note_id must be a non-empty string")
    check_text("note_id", note_id)
    return note_id


def _note(mem: MemoryContext, note_id: str) -> Note | None:
    if len(note_id) > MAX_NOTE_ID_CHARS:
        return None
    return mem.store.notes.get(note_id)


def history_for(mem: MemoryContext, ctx: RunContext, note_id: str) -> list[NoteEvent]:
    """The events of ``note_id`` (oldest first) when the note is visible to ``ctx``;
    ``NotFoundError`` for an unknown note or one outside the context's scope (the same
    answer, so the caller learns nothing about other tenants' notes)."""
    note_id = check_note_id(note_id)
    agent = get_agent(mem.sources, ctx.agent_id)
    note = _note(mem, note_id)
    if note is None or not visible(note, RunScope.of(ctx, agent)):
        raise _unknown(note_id)
    return mem.sources.note_history(note_id)


def _note_context(note: Note) -> dict[str, Any]:
    try:
        secondary = parse_scopes(note.secondary_scopes) or {}
    except ValueError:
        secondary = {"?": "malformed"}  # no key is bound to it: only admins read it
    return {
        "agent_id": note.agent_id,
        "user_id": note.user_id,
        "company_id": note.company_id,
        "primary_scope_entity_id": note.primary_scope_entity_id,
        "primary_scope_record_id": note.primary_scope_record_id,
        "secondary_scopes": secondary,
    }


def history_for_key(
    mem: MemoryContext, key: Mapping[str, Any] | None, note_id: str
) -> list[NoteEvent]:
    """The events of ``note_id`` for an HTTP caller holding ``key`` (None: the home has no
    keys). ``NotFoundError`` for an unknown id (no row and no event) and, for a key bound
    to a tenant, for any note outside its binding (global and cross-agent notes included)."""
    require_role(key, ANALYST, "reading a note's history")
    note_id = check_note_id(note_id)
    note = _note(mem, note_id)
    if key is None or key.get("admin"):
        events = mem.sources.note_history(note_id) if len(note_id) <= MAX_NOTE_ID_CHARS else []
        if note is None and not events:
            raise _unknown(note_id)
        return events
    if note is None:
        raise _unknown(note_id)
    try:
        check_context(key, _note_context(note), mem.sources)
    except PermissionDeniedError:
        # a note of the key's own user stored without a company is the user's alone
        if note.company_id is not None or not in_binding(key, note):
            raise _unknown(note_id) from None
    return mem.sources.note_history(note_id)
