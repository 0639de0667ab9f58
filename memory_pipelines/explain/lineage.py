"""Step 4: how a note got there and what happened to it since: its lifecycle events
(``note_events``, never its comments), the ``Memory Write`` audit steps naming it, its
injections, its origin and its merge lineage both ways."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from memory_pipelines.context import MemoryContext
from memory_pipelines.explain.models import LifecycleEvent, Lineage, WriteRecord
from memory_pipelines.note_events import EventKind, NoteEvent
from memory_pipelines.notes import AuthorType, Note, is_injectable
from memory_pipelines.store import eq, in_

#: the audit step every in-flight write records (memory_pipelines.writes.STEP_NAME)
WRITE_STEP_NAME = "Memory Write"
_LINEAGE_DEPTH = 20
_SOURCES_CAP = 200

#: the event kinds that retire a note (its status leaves the injectable set)
RETIRING_EVENTS = frozenset(
    {
        EventKind.DEDUPED.value,
        EventKind.SUPERSEDED.value,
        EventKind.MERGED.value,
        EventKind.REVOKED.value,
        EventKind.ARCHIVED.value,
        EventKind.STATUS_CHANGED.value,
    }
)


def _detail(event: NoteEvent) -> str:
    """A human line for the event: its reason (or comment), else who did it and how."""
    details = event.details
    for key in ("reason", "comment"):
        text = details.get(key)
        if isinstance(text, str) and text.strip():
            return text.strip()
    who = event.actor + (f" ({event.phase})" if event.phase else "")
    rule = details.get("rule")
    text = f"by {who}" + (f", rule {rule}" if rule else "")
    if event.status_before and event.status_after and event.status_before != event.status_after:
        text += f": {event.status_before} -> {event.status_after}"
    elif event.status_after and event.event == EventKind.CREATED.value:
        text += f": {event.status_after}"
    return text


def lifecycle_event(event: NoteEvent) -> LifecycleEvent:
    """One ``note_events`` row as the explanation shows it."""
    rule = event.details.get("rule")
    return LifecycleEvent(
        kind=event.event,
        detail=_detail(event),
        related_note_id=event.related_note_ids[0] if event.related_note_ids else None,
        at=event.at,
        actor=event.actor,
        phase=event.phase,
        run_id=event.run_id,
        rule=rule if isinstance(rule, str) else None,
        status_before=event.status_before,
        status_after=event.status_after,
        related_note_ids=list(event.related_note_ids),
    )


def lifecycle_events(events: Sequence[NoteEvent]) -> list[LifecycleEvent]:
    """A note's events (oldest first) as the explanation's lifecycle list."""
    return [lifecycle_event(e) for e in events]


def note_events(mem: MemoryContext, note_ids: Sequence[str]) -> dict[str, list[LifecycleEvent]]:
    """The lifecycle of each note from its ``note_events`` rows (one query for all); a note
    written before events existed has none and is explained from its fields."""
    if not note_ids:
        return {}
    return {i: lifecycle_events(evs) for i, evs in mem.sources.events_of(note_ids).items()}


def retiring_event(events: Sequence[LifecycleEvent]) -> LifecycleEvent | None:
    """The last event that took the note out of the injectable statuses (None when no
    event did: a note created retired, or one without events)."""
    for e in reversed(events):
        if e.kind in RETIRING_EVENTS and not is_injectable(e.status_after or ""):
            return e
        if e.kind == EventKind.RESTORED.value:
            return None
    return None


def write_records(mem: MemoryContext, note_ids: Sequence[str]) -> dict[str, list[WriteRecord]]:
    """``Memory Write`` audit steps whose output ``noteId`` is one of ``note_ids``."""
    if not note_ids:
        return {}
    out: dict[str, list[WriteRecord]] = {}
    for step in mem.sources.steps_naming_notes(WRITE_STEP_NAME, note_ids):
        output = step["output_json"]
        output = output if isinstance(output, dict) else {}
        out.setdefault(step["note_id"], []).append(
            WriteRecord(
                run_id=step["run_id"],
                disposition=output.get("disposition"),
                reason=output.get("reason"),
                final_scope=output.get("finalScope"),
                status=step["status"],
                at=step["finished_at"],
            )
        )
    return out


def injection_counts(mem: MemoryContext, note_ids: Sequence[str]) -> dict[str, tuple[int, datetime | None]]:
    """How often each note was injected, and when last (``injection_events``)."""
    if not note_ids:
        return {}
    return mem.sources.injection_counts(note_ids, "note")


def origin_of(note: Note, events: Sequence[LifecycleEvent], writes: Sequence[WriteRecord]) -> str:
    if note.author_type == AuthorType.AGENT.value:
        created = next((w for w in writes if w.disposition in ("written", "superseded-own")), None)
        how = f" (disposition {created.disposition})" if created else ""
        return f"written in flight by the agent in run {note.source_run_id}{how}"
    if note.author_type == AuthorType.MEMORY_MANAGER.value:
        if note.derived_from_note_ids:
            return (
                f"consolidated by the Memory Manager from {len(note.derived_from_note_ids)} notes "
                f"(generation {note.consolidation_count})"
            )
        if any(e.kind == EventKind.CREATED.value and e.phase == "extraction" for e in events):
            if note.source_conversation_id:
                return f"extracted by the Memory Manager from conversation {note.source_conversation_id}"
            source = f" from run {note.source_run_id}" if note.source_run_id else ""
            return "extracted by the Memory Manager" + source
        source = note.source_conversation_id or note.source_run_id
        return "created by the Memory Manager" + (f" from {source}" if source else "")
    return "added manually (author User)"


def lineage_of(mem: MemoryContext, note: Note) -> Lineage:
    """``consolidated_into`` followed to the survivor; sources followed back (both
    ``derived_from_note_ids`` and notes whose ``consolidated_into`` is this note)."""
    table = mem.store.notes
    chain: list[str] = []
    survivor: Note | None = None
    seen = {note.id}
    nxt = note.consolidated_into_note_id
    while nxt and nxt not in seen and len(chain) < _LINEAGE_DEPTH:
        chain.append(nxt)
        seen.add(nxt)
        survivor = table.get(nxt)
        nxt = survivor.consolidated_into_note_id if survivor else None
    absorbed = table.scan(eq("consolidated_into_note_id", note.id), columns=["id"])["id"].tolist()
    sources: list[str] = []
    frontier = list(dict.fromkeys([*(note.derived_from_note_ids or []), *absorbed]))
    visited = {note.id}
    while frontier and len(sources) < _SOURCES_CAP:
        ids = [i for i in frontier if i not in visited]
        visited.update(ids)
        sources.extend(ids)
        if not ids:
            break
        rows = table.get_many(ids)
        more = table.scan(in_("consolidated_into_note_id", ids), columns=["id"])["id"].tolist()
        frontier = [*(d for r in rows for d in (r.derived_from_note_ids or [])), *more]
    return Lineage(
        merged_into=chain,
        survivor_id=chain[-1] if chain else None,
        survivor_status=str(survivor.status)
        if chain and survivor
        else ("missing" if chain else None),
        derived_from=list(note.derived_from_note_ids or []),
        absorbed=absorbed,
        all_sources=sources[:_SOURCES_CAP],
    )
