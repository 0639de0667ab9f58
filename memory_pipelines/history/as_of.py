"""Time travel (CONTRACT §2.7): what the service would have injected at a past instant.

The state of a note at ``as_of`` comes from its events (``note_events``) and the present
rows, never from old table versions (compaction drops them): a note without an event
after ``as_of`` is as it is now (every lifecycle change records an event); a note with
later events is its ``created`` event folded with its events up to ``as_of``
(:func:`memory_pipelines.note_events.fold_changes`), or absent when it was created later. A
note stored before events existed (no ``created`` event) counts from its ``created_at``
and takes the status its first later event says it had before.

Candidates: the scope's injectable rows now (the injection read cache, so no extra scan
when it is warm) that did not change since ``as_of``, plus the notes changed since whose
state then was injectable, unexpired at ``as_of`` and in the scope. Their vector is the
stored one when the text is the same, else the embedding of the text they had (the embed
cache makes repeats cheap). They are ranked by the injection's own strategies over that
in-memory set (:func:`memory_pipelines.injection.retrieval.rank_candidates`) and rendered
the same way. Nothing is written: no attribution, no access count, no cache entry of its
own. The agent's configuration is the present one (it has no history).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import numpy as np

from memory_pipelines.agents import get_agent
from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import ValidationError
from memory_pipelines.injection import (
    Injection,
    render_examples,
    render_message,
    render_notes,
    select_examples,
)
from memory_pipelines.injection.cache import ScopeRows, ScopeView
from memory_pipelines.injection.candidates import scope_part
from memory_pipelines.injection.inject import query_of
from memory_pipelines.injection.lexical import LexicalIndex
from memory_pipelines.injection.read_filters import cached_scope, injectable_in_scope
from memory_pipelines.injection.retrieval import CandidatePart, rank_candidates
from memory_pipelines.note_events import EventKind, NoteEvent, fold_changes
from memory_pipelines.notes import Note, RunContext, is_injectable, utc
from memory_pipelines.scope import RunScope, visible

#: events that bring a note into this home (a note whose first one is later did not exist)
_BIRTH = frozenset({EventKind.CREATED.value})


def check_as_of(value: Any) -> datetime:
    """``as_of`` as an aware datetime (``ValidationError`` for a naive one, one outside the
    instants the service stores, or another type)."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError as e:
            raise ValidationError(f"as_of {value[:40]!r} is not an ISO 8601 instant") from e
    if not isinstance(value, datetime):
        raise ValidationError(f"as_of must be a datetime, got {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError("as_of must be timezone-aware (e.g. 2026-05-01T10:00:00+00:00)")
    try:
        utc(value)
    except ValueError as e:
        raise ValidationError(f"as_of {value.isoformat()[:40]!r}: {e}") from None
    return value


def state_at(
    now: Note | None, before: Sequence[NoteEvent], after: Sequence[NoteEvent]
) -> Note | None:
    """The note as it was: ``now`` is its present row (None when gone), ``before`` its
    events at or before the instant, ``after`` the later ones (both oldest first). None
    when it did not exist then."""
    if not after:
        return now
    born = [e for e in before if e.event in _BIRTH]
    if not born:
        if any(e.event in _BIRTH for e in after) or now is None:
            return None
        status = after[0].status_before or str(now.status)  # stored before events existed
        return now.model_copy(update={"status": status})
    start = before.index(born[-1])
    fields = fold_changes(before[start:]) or {}
    fields["id"] = born[-1].note_id
    fields["updated_at"] = before[-1].at
    if now is not None:
        fields["comments"] = now.comments
    if not fields.get("created_at"):  # stamped by the save, after the event was built
        fields["created_at"] = now.created_at if now is not None else born[-1].at
    try:
        return Note.model_validate(fields)
    except ValueError:
        return None


def _events_after(mem: MemoryContext, as_of: datetime, scope: RunScope) -> dict[str, list[NoteEvent]]:
    """Events after ``as_of`` of notes whose scope (as the event records it) the run's
    lattice admits, by note."""
    out: dict[str, list[NoteEvent]] = {}
    for e in mem.sources.events_between(as_of, None):
        if scope.in_lattice(e):
            out.setdefault(e.note_id, []).append(e)
    return out


def _created_seconds(values: Sequence[Any]) -> np.ndarray:
    return np.asarray([v.timestamp() if v is not None else 0.0 for v in values], dtype=np.float64)


def _present_parts(
    mem: MemoryContext, scope: RunScope, as_of: datetime, changed: set[str]
) -> list[CandidatePart]:
    table = mem.store.notes
    views = cached_scope(table, scope)
    if views is None:  # a scope too large to cache: one scan, not kept
        where = injectable_in_scope(scope)
        rows = ScopeRows(table, table.version, table.scan_arrow(where))
        views = [ScopeView.scanned(rows, where)]
    parts = []
    for rows, keep in (pair for view in views for pair in view.kept(as_of)):
        keep = keep & (rows.created <= as_of.timestamp())
        if changed:
            keep &= np.asarray([i not in changed for i in rows.ids], dtype=bool)
        if rows.size:
            parts.append(scope_part(rows, keep, mem.inject_config.lexical_stemmer))
    return parts


def _past_part(
    mem: MemoryContext,
    scope: RunScope,
    as_of: datetime,
    later: dict[str, list[NoteEvent]],
    *,
    injectable_only: bool = True,
) -> tuple[CandidatePart | None, list[Note]]:
    """The notes changed since ``as_of`` as they were then (in the scope; injectable and
    unexpired then unless ``injectable_only`` is False)."""
    table = mem.store.notes
    ids = list(later)
    if not ids:
        return None, []
    present = {n.id: n for n in table.get_many(ids)}
    before = mem.sources.events_of(ids, until=as_of)
    notes: list[Note] = []
    for i in ids:
        past = state_at(present.get(i), before.get(i, []), later[i])
        if past is None or not visible(past, scope):
            continue
        if past.created_at is not None and past.created_at > as_of and i not in before:
            continue
        if injectable_only and not (
            is_injectable(past.status) and (past.expires_at is None or past.expires_at > as_of)
        ):
            continue
        notes.append(past)
    if not notes:
        return None, []
    stored = table.vectors([n.id for n in notes if n.id in present])
    vectors = np.zeros((len(notes), table.dim), dtype=np.float32)
    fresh = [
        k
        for k, n in enumerate(notes)
        if n.id not in stored or present[n.id].note != n.note
    ]
    for k, n in enumerate(notes):
        if k not in fresh:
            vectors[k] = stored[n.id]
    if fresh:
        vectors[fresh] = np.asarray(mem.embed([notes[k].note for k in fresh]), dtype=np.float32)
    part = CandidatePart(
        ids=[n.id for n in notes],
        vectors=vectors,
        created=_created_seconds([n.created_at for n in notes]),
        types=[str(n.type) for n in notes],
        lexical=LexicalIndex([n.note for n in notes], mem.inject_config.lexical_stemmer),
        keep=np.ones(len(notes), dtype=bool),
        models=lambda positions: [notes[p] for p in positions],
    )
    return part, notes


def candidates_at(mem: MemoryContext, scope: RunScope, as_of: datetime) -> list[CandidatePart]:
    """The scope's notes that were injectable at ``as_of``, as they were then."""
    later = _events_after(mem, as_of, scope)
    past = _past_part(mem, scope, as_of, later)[0]
    return _present_parts(mem, scope, as_of, set(later)) + ([past] if past is not None else [])


def notes_at(
    mem: MemoryContext, scope: RunScope, as_of: datetime, ids: Sequence[str]
) -> dict[str, Note]:
    """Some notes (any status) as they were at ``as_of``; absent ones are left out."""
    later = {i: evs for i, evs in _events_after(mem, as_of, scope).items() if i in set(ids)}
    _, past = _past_part(mem, scope, as_of, later, injectable_only=False)
    out = {n.id: n for n in past}
    rest = [i for i in ids if i not in later]
    for n in mem.store.notes.get_many(rest):
        if n.created_at is None or n.created_at <= as_of:
            out[n.id] = n
    return out


def changed_at(mem: MemoryContext, scope: RunScope, as_of: datetime) -> list[Note]:
    """The scope's notes changed since ``as_of``, as they were then (any status)."""
    later = _events_after(mem, as_of, scope)
    return _past_part(mem, scope, as_of, later, injectable_only=False)[1]


def inject_as_of(
    mem: MemoryContext, ctx: RunContext, current_input: str | None, as_of: datetime
) -> Injection:
    """The injection the service would have answered at ``as_of`` (see the module
    docstring); writes nothing."""
    as_of = check_as_of(as_of)
    agent = get_agent(mem.sources, ctx.agent_id)
    if not agent.inject_notes and not agent.inject_examples:
        return Injection()
    cfg = mem.inject_config
    scope = RunScope.of(ctx, agent)
    query, vec = query_of(mem, agent, current_input)
    notes: list[Note] = []
    if agent.inject_notes:
        notes = rank_candidates(
            mem, scope, agent, query, vec, candidates_at(mem, scope, as_of), as_of
        )
    examples = (
        select_examples(mem, scope, agent, query, vec, as_of, created_before=as_of)
        if agent.inject_examples
        else []
    )
    message = render_message(
        render_notes(notes, include_memory_policy=cfg.include_memory_policy),
        render_examples(examples),
    )
    return Injection(message=message, notes=notes, examples=examples)
