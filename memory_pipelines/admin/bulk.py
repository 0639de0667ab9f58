"""Bulk notes: many notes added, or many notes' status changed, in one call.

:func:`add_notes` is :meth:`MemoryService.add_note` for a list: each item is a mapping of
``add_note``'s arguments (``note`` required). The whole list is validated first (a bad
item is a ``ValidationError`` naming its index and field, and nothing is saved); the
texts are then embedded in batches and the notes committed in few table versions (one
append for notes with generated ids, one merge on id for notes that name their id), each
with its ``created`` event, as ``add_note`` records it.

:func:`set_notes_status` changes the status of many notes in one upsert: one status event
per changed note (``archived``, ``revoked``, ...), one audit step per call.

With an API key (the HTTP routes), the key must be an analyst or admin key and every note
must lie inside its binding, checked per item like ``PATCH /v1/notes/{id}``: a new note
outside it is refused (403), a stored note outside it does not exist for the key (404).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import NotFoundError, PermissionDeniedError, ValidationError
from memory_pipelines.keys import ANALYST, require_role
from memory_pipelines.limits import check_fields, check_id, check_ids
from memory_pipelines.note_events import Actor, status_event
from memory_pipelines.notes import (
    AuthorType,
    Note,
    NoteStatus,
    NoteType,
    ProtectionTier,
    append_comment,
)
from memory_pipelines.scope.binding import in_binding

#: At most this many notes in one call of the HTTP routes (the request body is bounded
#: too); the Python call takes any number and embeds them in batches.
MAX_HTTP_ITEMS = 1000

#: ``add_note``'s defaults for the fields a bulk item may leave out.
DEFAULTS: dict[str, str] = {
    "type": NoteType.PREFERENCE.value,
    "status": NoteStatus.ACTIVE.value,
    "author_type": AuthorType.USER.value,
    "protection_tier": ProtectionTier.STANDARD.value,
}


def build_note(fields: Mapping[str, Any], where: str = "") -> Note:
    """The ``Note`` ``add_note(**fields)`` would save, validated like it (``where``
    prefixes every message, e.g. ``notes[3].``); ``ValidationError`` naming the field."""
    if not isinstance(fields, Mapping):
        raise ValidationError(
            f"{where.rstrip('.') or 'note'} must be an object of add_note's arguments"
        )
    note = fields.get("note")
    if not isinstance(note, str) or not note.strip():
        raise ValidationError(f"{where}note must be a non-empty string")
    args = {**DEFAULTS, **fields}
    try:
        check_fields(args)
        check_ids({k: args.get(k) for k in ("agent_id", "user_id", "company_id")})
    except ValidationError as e:
        raise ValidationError(f"{where}{e}") from None
    unknown = sorted(set(args) - set(Note.model_fields))
    if unknown:
        raise ValidationError(f"{where}{unknown[0]}: unknown note field")
    try:
        return Note(**{**args, "note": note.strip()})
    except Exception as e:  # pydantic's ValidationError: name the first bad field
        errors = getattr(e, "errors", None)
        first = errors()[0] if callable(errors) and errors() else None
        if first is not None:
            field = ".".join(str(p) for p in first.get("loc", ())) or "note"
            raise ValidationError(f"{where}{field}: {first.get('msg', e)}") from None
        raise ValidationError(f"{where}invalid note: {e}") from None


def validate_notes(items: Any, key: Mapping[str, Any] | None = None) -> list[tuple[Note, bool]]:
    """Every item as ``(note, fresh)`` (``fresh``: its id was generated here), or the
    first problem as a ``ValidationError`` naming ``notes[i].field``; with ``key``, an
    item outside the key's binding is a ``PermissionDeniedError`` naming its index."""
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
        raise ValidationError("notes must be a list of objects holding add_note's arguments")
    out: list[tuple[Note, bool]] = []
    seen: dict[str, int] = {}
    for i, fields in enumerate(items):
        where = f"notes[{i}]."
        note = build_note(fields, where)
        if note.id in seen:
            raise ValidationError(f"{where}id: {note.id!r} is also notes[{seen[note.id]}]'s id")
        seen[note.id] = i
        if key is not None and not in_binding(key, note):
            raise PermissionDeniedError(
                f"notes[{i}] lies outside this API key's binding (its company, agent, user or scopes)"
            )
        out.append((note, "id" not in fields))
    return out


def add_notes(
    mem: MemoryContext,
    items: Sequence[Mapping[str, Any]],
    *,
    key: Mapping[str, Any] | None = None,
    batch_size: int = 8192,
) -> list[Note]:
    """Validate every item, embed the texts in batches of ``batch_size``, then save: one
    append for generated ids, one merge on id for given ids, a ``created`` event each.
    Returns the saved notes in the order given."""
    if key is not None:
        require_role(key, ANALYST, "adding notes")
    checked = validate_notes(items, key)
    if not checked:
        return []
    named = [n.id for n, fresh in checked if not fresh]
    if key is not None and named:
        # a given id must not overwrite a note the key cannot see
        for stored in mem.store.notes.get_many(named):
            if not in_binding(key, stored):
                i = next(k for k, (n, _) in enumerate(checked) if n.id == stored.id)
                raise PermissionDeniedError(
                    f"notes[{i}].id: {stored.id!r} names a note outside this API key's binding"
                )
    texts = [n.note for n, _ in checked]
    step = max(1, int(batch_size))
    vectors = np.concatenate(
        [mem.notebook.embed(texts[i : i + step]) for i in range(0, len(texts), step)]
    )
    saved: dict[str, Note] = {}
    for fresh in (True, False):
        part = [k for k, (_, f) in enumerate(checked) if f is fresh]
        if not part:
            continue
        notes = mem.notebook.create_notes(
            [checked[k][0] for k in part], vectors[part], phase="manual", fresh=fresh
        )
        saved.update((n.id, n) for n in notes)
    return [saved[n.id] for n, _ in checked]


def set_notes_status(
    mem: MemoryContext,
    note_ids: Sequence[str],
    status: str,
    comment: str | None = None,
    *,
    key: Mapping[str, Any] | None = None,
) -> list[Note]:
    """Set ``status`` on every note of ``note_ids`` in one upsert (a note already in it is
    returned as it is): the status event of each change, one audit step for the call.
    Every id is checked first (unknown, or outside ``key``'s binding: ``NotFoundError``
    naming its index); nothing changes unless all are found."""
    if key is not None:
        require_role(key, ANALYST, "changing notes")
    try:
        status = NoteStatus(status).value
    except ValueError:
        raise ValidationError(f"unknown note status {status!r}") from None
    if isinstance(note_ids, (str, bytes)) or not isinstance(note_ids, Sequence):
        raise ValidationError("ids must be a list of note ids")
    if comment is not None:
        if not isinstance(comment, str):
            raise ValidationError("comment must be a string")
        check_fields({"comment": comment})
    ids: list[str] = []
    for i, note_id in enumerate(note_ids):
        if not isinstance(note_id, str) or not note_id:
            raise ValidationError(f"ids[{i}] must be a non-empty string")
        try:
            check_id(f"ids[{i}]", note_id)
        except ValidationError:
            raise NotFoundError(f"ids[{i}]: note {note_id!r} does not exist") from None
        ids.append(note_id)
    unique = list(dict.fromkeys(ids))
    found = {n.id: n for n in mem.store.notes.get_many(unique)}
    for i, note_id in enumerate(ids):
        note = found.get(note_id)
        if note is None or (key is not None and not in_binding(key, note)):
            raise NotFoundError(f"ids[{i}]: note {note_id!r} does not exist")
    out = {nid: found[nid] for nid in unique}
    by_event: dict[str, list[tuple[Note, dict[str, Any]]]] = {}
    for nid in unique:
        note = found[nid]
        if note.status == status:
            continue
        change: dict[str, Any] = {"status": status}
        if comment:
            change["comments"] = append_comment(note.comments, comment)
        by_event.setdefault(str(status_event(note.status, status)), []).append((note, change))
    for event, changes in by_event.items():
        for n in mem.notebook.update_notes(
            changes,
            event=event,
            actor=Actor.ANALYST,
            phase="manual",
            **({"comment": comment} if comment else {}),
        ):
            out[n.id] = n
    changed = sum(len(c) for c in by_event.values())
    if changed:
        now = mem.now()
        mem.sources.add_step(
            "",
            "Admin",
            "Set Notes Status",
            input={"noteIds": unique, "status": status},
            output={"changed": changed, "unchanged": len(unique) - changed},
            started_at=now,
            finished_at=now,
        )
    return [out[nid] for nid in ids]
