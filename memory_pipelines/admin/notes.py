"""Notes for the people who manage memory: list, read, correct, archive, erase (CONTRACT §2.9).

Listing is newest first by ``(created_at, id)`` with a keyset cursor: the cursor is the
last returned note's ``(created_at, id)``, so a page never repeats or skips a note that
existed when the first page was read, however many notes are written between pages
(new notes sort before the cursor). ``q`` keeps notes whose text contains every word of
it, ignoring case; each word is a literal (``%``, ``_``, quotes and backslashes match
themselves).

Every change is one lifecycle event (``updated``, or the status event of a status
change; ``purged`` for an erasure, without text) and one audit step (step type
``Admin``), like the writes the agents make.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pandas as pd
from pydantic import BaseModel, Field

from memory_pipelines.context import MemoryContext
from memory_pipelines.embeddings import CachedEmbedder
from memory_pipelines.errors import NotFoundError, PermissionDeniedError, ValidationError
from memory_pipelines.keys import ANALYST, require_role
from memory_pipelines.limits import (
    DEFAULT_PAGE_LIMIT,
    MAX_PAGE_LIMIT,
    check_fields,
    check_id,
    check_ids,
    limits,
    shown,
)
from memory_pipelines.note_events import Actor, EventKind, NoteEvent, status_event
from memory_pipelines.notes import Note, NoteStatus, NoteType, ProtectionTier, utc
from memory_pipelines.phases.lease import exclusive
from memory_pipelines.purge import mentions
from memory_pipelines.scope import selection_filter
from memory_pipelines.scope.binding import BINDING_COLUMNS, check_filters, in_binding, unrestricted
from memory_pipelines.store import and_, cmp, eq, icontains, is_null, or_

#: ``limit`` of one page: 1..MAX_LIMIT, DEFAULT_LIMIT when not given.
DEFAULT_LIMIT = DEFAULT_PAGE_LIMIT
MAX_LIMIT = MAX_PAGE_LIMIT
#: A search longer than this is refused (it could only match nothing useful).
MAX_QUERY_CHARS = 1000
MAX_QUERY_WORDS = 32
MAX_CURSOR_CHARS = 2000

STEP_TYPE = "Admin"
PHASE = "manual"


class NotePage(BaseModel):
    """One page of notes, newest first, and the cursor of the next page (None at the end)."""

    notes: list[Note]
    next_cursor: str | None = Field(
        default=None, description="pass as `cursor` for the next page; null on the last page"
    )


# --------------------------------------------------------------------------- cursor


def encode_cursor(created_at: datetime | None, note_id: str) -> str:
    """The opaque cursor after the note ``(created_at, note_id)``."""
    stamp = created_at.astimezone(UTC).isoformat() if created_at is not None else None
    raw = json.dumps([stamp, note_id], ensure_ascii=True, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime | None, str]:
    """``(created_at, id)`` of a cursor; ``ValidationError`` for anything else."""
    bad = ValidationError("cursor is malformed: pass the next_cursor of a previous page")
    if not isinstance(cursor, str) or not cursor or len(cursor) > MAX_CURSOR_CHARS:
        raise bad
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        stamp, note_id = json.loads(raw.decode("utf-8"))
        created = None if stamp is None else datetime.fromisoformat(stamp)
    except (binascii.Error, UnicodeError, ValueError, TypeError):
        raise bad from None
    if not isinstance(note_id, str) or (created is not None and created.tzinfo is None):
        raise bad
    try:
        created = utc(created)  # a forged instant the store cannot hold (year 9999)
    except ValueError:
        raise bad from None
    try:
        check_id("cursor", note_id)
    except ValidationError:
        raise bad from None
    return created, note_id


def _after(created: datetime | None, note_id: str):
    """A filter holding every row that sorts after the cursor, newest first (a null
    ``created_at`` sorts last); :func:`_past` drops the ties at or before it. One range
    test is cheaper for LanceDB than the exact ``(created_at, id)`` disjunction."""
    if created is None:
        return and_(is_null("created_at"), cmp("id", "<", note_id))
    return or_(cmp("created_at", "<=", created), is_null("created_at"))


def _past(df: pd.DataFrame, created: datetime | None, note_id: str) -> pd.DataFrame:
    """``df`` without the rows at the cursor's instant whose id is not below the cursor's."""
    if created is None or not len(df):
        return df
    stamps = pd.to_datetime(df["created_at"], utc=True)
    tie = (stamps == pd.Timestamp(created)) & (df["id"] >= note_id)
    return df[~tie]


# --------------------------------------------------------------------------- listing


def _limit(limit: Any) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ValidationError(f"limit must be an integer in 1..{MAX_LIMIT}, got {limit!r}")
    if not 1 <= limit <= MAX_LIMIT:
        raise ValidationError(f"limit must be in 1..{MAX_LIMIT}, got {limit}")
    return limit


def _choice(name: str, value: Any, enum: type) -> str:
    """``value`` as a member of ``enum``; ``ValidationError`` naming the field and the
    allowed values otherwise."""
    try:
        return enum(value).value
    except ValueError:
        allowed = ", ".join(v.value for v in enum)
        raise ValidationError(f"unknown {name} {shown(value)} (one of {allowed})") from None


def _words(q: Any) -> list[str]:
    if q is None:
        return []
    if not isinstance(q, str):
        raise ValidationError("q must be a string")
    check_fields({"q": q})
    if len(q) > MAX_QUERY_CHARS:
        raise ValidationError(f"q is longer than {MAX_QUERY_CHARS} characters ({len(q)})")
    words = list(dict.fromkeys(w.lower() for w in q.split()))
    if len(words) > MAX_QUERY_WORDS:
        raise ValidationError(f"q has more than {MAX_QUERY_WORDS} words ({len(words)})")
    return words


def list_notes(
    mem: MemoryContext,
    *,
    agent_id: str | None = None,
    user_id: str | None = None,
    company_id: str | None = None,
    status: str | None = None,
    q: str | None = None,
    limit: int = DEFAULT_LIMIT,
    cursor: str | None = None,
    key: Mapping[str, Any] | None = None,
) -> NotePage:
    """One page of notes, newest first by ``(created_at, id)`` (see the module docstring).

    ``key`` (an ``api_keys`` row) restricts the page to the notes inside its binding;
    a filter outside it is ``PermissionDeniedError``.
    """
    require_role(key, ANALYST, "listing notes")
    limit = _limit(limit)
    check_ids({"agent_id": agent_id, "user_id": user_id, "company_id": company_id})
    filters = check_filters(key, {"agent_id": agent_id, "user_id": user_id, "company_id": company_id})
    words = _words(q)
    after = decode_cursor(cursor) if cursor is not None else None
    cond = and_(
        selection_filter(**filters),
        eq("status", _choice("status", status, NoteStatus)) if status is not None else None,
        *(icontains("note", w) for w in words),
        _after(*after) if after is not None else None,
    )
    restricted = not unrestricted(key)
    columns = ["id", "created_at", *(BINDING_COLUMNS if restricted else ())]
    df = mem.store.notes.scan(cond, columns=columns)
    if after is not None:
        df = _past(df, *after)
    if restricted and len(df):
        keep = [in_binding(key, row) for row in df.to_dict("records")]
        df = df[pd.Series(keep, index=df.index, dtype=bool)]
    if len(df):
        df = df.sort_values(["created_at", "id"], ascending=False, na_position="last")
    top = df.head(limit + 1)
    ids = top["id"].tolist()[:limit]
    notes = mem.store.notes.get_many(ids)
    next_cursor = None
    if len(top) > limit and notes:
        last = notes[-1]
        next_cursor = encode_cursor(last.created_at, last.id)
    return NotePage(notes=notes, next_cursor=next_cursor)


# --------------------------------------------------------------------------- one note


def get_note(mem: MemoryContext, note_id: Any, key: Mapping[str, Any] | None = None) -> Note:
    """The note, or ``NotFoundError`` when there is none (or it lies outside the key's
    binding: the key cannot tell it exists)."""
    require_role(key, ANALYST, "reading or changing a note")
    if not isinstance(note_id, str) or not note_id:
        raise NotFoundError(f"note {note_id!r} does not exist")
    check_id("note_id", note_id)
    note = mem.store.notes.get(note_id)
    if note is None or not in_binding(key, note):
        raise NotFoundError(f"note {note_id!r} does not exist")
    return note


def _text(note: Any) -> str:
    """A note's new text, trimmed: a non-empty string of valid UTF-8, at most
    ``max_note_chars`` characters (``ValidationError`` naming the problem otherwise)."""
    if not isinstance(note, str):
        raise ValidationError(f"note must be a string, got {type(note).__name__}")
    check_fields({"note": note})
    text = note.strip()
    if not text:
        raise ValidationError("note cannot be empty")
    bound = limits().max_note_chars
    if len(text) > bound:
        raise ValidationError(f"note is longer than {bound} characters ({len(text)})")
    return text


def _fields(
    note: Any, type: Any, status: Any, protection_tier: Any
) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if note is not None:
        fields["note"] = _text(note)
    if type is not None:
        fields["type"] = _choice("type", type, NoteType)
    if status is not None:
        fields["status"] = _choice("status", status, NoteStatus)
    if protection_tier is not None:
        fields["protection_tier"] = _choice("protection_tier", protection_tier, ProtectionTier)
    return fields


def _audit(mem: MemoryContext, name: str, note: Note, input: Any, output: Any) -> None:
    """The audit step of an administrator's change (no note text: an erasure must leave
    none behind)."""
    now = mem.now()
    mem.sources.add_step(
        "",
        STEP_TYPE,
        name,
        input={"noteId": note.id, **input},
        output=output,
        started_at=now,
        finished_at=now,
        agent_id=note.agent_id,
        user_id=note.user_id,
    )


def update_note(
    mem: MemoryContext,
    note_id: str,
    *,
    note: str | None = None,
    type: str | None = None,
    status: str | None = None,
    protection_tier: str | None = None,
    key: Mapping[str, Any] | None = None,
) -> Note:
    """Correct a note: its text (re-embedded), type, status or protection tier.

    One event (``updated``, or the status event when only the status changes) and one
    audit step ("Update Note"); values equal to the current ones change nothing.
    """
    fields = _fields(note, type, status, protection_tier)
    if not fields:
        raise ValidationError("nothing to change: give note, type, status or protection_tier")
    current = get_note(mem, note_id, key)
    changes = {k: v for k, v in fields.items() if getattr(current, k) != v}
    if not changes:
        return current
    if set(changes) == {"status"}:
        kind = status_event(current.status, changes["status"])
    else:
        kind = EventKind.UPDATED
    saved = mem.notebook.update_notes(
        [(current, changes)], event=kind, actor=Actor.ANALYST, phase=PHASE
    )[0]
    _audit(
        mem,
        "Update Note",
        saved,
        {"fields": sorted(changes)},
        {"event": str(kind), "statusBefore": str(current.status), "statusAfter": str(saved.status)},
    )
    return saved


def archive_note(mem: MemoryContext, note_id: str, key: Mapping[str, Any] | None = None) -> Note:
    """Archive a note (an ``archived`` event and an audit step; an archived note is returned
    as it is)."""
    return update_note(mem, note_id, status=NoteStatus.ARCHIVED.value, key=key)


def erase_note(
    mem: MemoryContext,
    note_id: str,
    key: Mapping[str, Any] | None = None,
    *,
    lease_wait_s: float | None = None,
) -> dict[str, Any]:
    """Erase one note for good (admin keys only): its row, its events, its injection rows,
    its embedding-cache entry and the old table versions that hold its text; then a
    ``purged`` event without text and an audit step ("Erase Note") record that it was.

    Like ``purge_user``, dropping old table versions invalidates readers that hold them:
    run it while no other process reads an old version. The whole erasure runs under the
    home's Memory Manager lease, waiting up to ``lease_wait_s`` for it (default
    ``ManagerConfig.lease_wait_s``); past the wait it raises ``ManagerBusyError`` having
    changed nothing.
    """
    get_note(mem, note_id, key)  # an unknown note, or one outside the key's binding: 404 first
    if not unrestricted(key):
        raise PermissionDeniedError("only an admin API key may erase a note")
    # see purge_user: no Memory Manager commits meanwhile; taken before the first change,
    # so a busy home leaves the note whole
    with exclusive(mem, wait_s=lease_wait_s):
        return _erase(mem, get_note(mem, note_id, key))  # as it is now, after any wait


def _erase(mem: MemoryContext, current: Note) -> dict[str, Any]:
    src = mem.sources
    src.flush_injection_events()
    mem.store.notes.delete(eq("id", current.id))
    events = src.delete_note_events(note_ids=[current.id])
    injections = src.delete_note_injections([current.id])
    emb = mem.embedder
    texts = [t for t in (current.note, current.comments) if t]
    forgotten = emb.forget(texts) if isinstance(emb, CachedEmbedder) else 0
    # audit steps that hold its id or its text (the "Memory Write" that stored it, a phase
    # naming it); short texts would match by accident, so only texts of some length count
    needles = [current.id, *(t for t in texts if len(t) >= 12)]
    steps = src.delete_run_steps(
        lambda step: any(
            mentions(step[k], needles) for k in ("input_json", "output_json", "error_message")
        )
    )
    removed = mem.store.notes.erase_old_versions()
    src.vacuum()
    purged = NoteEvent(
        note_id=current.id,
        event=EventKind.PURGED.value,
        actor=Actor.ANALYST.value,
        phase=PHASE,
        status_before=str(current.status),
        agent_id=current.agent_id,
        user_id=current.user_id,
        company_id=current.company_id,
        details={"reason": "erased by an administrator"},
    )
    mem.notebook.record([purged])
    counts = {
        "note_id": current.id,
        "notes": 1,
        "note_events": events,
        "injection_events": injections,
        "run_steps": steps,
        "embedding_cache": forgotten,
        "lance_versions_removed": removed,
    }
    _audit(mem, "Erase Note", current, {}, {k: v for k, v in counts.items() if k != "note_id"})
    return counts
