"""Lifecycle events of notes (``note_events``): append, read by note, by time, by kind."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, insert, select

from memory_pipelines.note_events import Actor, EventKind, NoteEvent
from memory_pipelines.sources.base import SourcesBase, chunks
from memory_pipelines.sources.tables import jsonable, note_events


def _row(event: NoteEvent, at: datetime) -> dict[str, Any]:
    row = event.model_dump(exclude={"id"})
    row["at"] = event.at or at
    row["related_note_ids"] = list(event.related_note_ids)
    row["details"] = jsonable(event.details)
    return row


def _event(row: Any) -> NoteEvent:
    data = dict(row)
    data["related_note_ids"] = list(data.get("related_note_ids") or [])
    data["details"] = dict(data.get("details") or {})
    return NoteEvent.model_validate(data)


class EventQueries(SourcesBase):
    """The ``note_events`` table."""

    def add_note_events(self, events: Sequence[NoteEvent], at: datetime | None = None) -> int:
        """Append events in one transaction (an event without ``at`` gets ``at`` or now)."""
        if not events:
            return 0
        now = at or self.clock()
        rows = [_row(e, now) for e in events]
        with self.begin() as c:
            for part in chunks(rows, 500):
                c.execute(insert(note_events), part)
        return len(rows)

    def note_history(self, note_id: str) -> list[NoteEvent]:
        """Every event of one note, oldest first (``[]`` for an unknown id)."""
        with self.begin() as c:
            rows = c.execute(
                select(note_events)
                .where(note_events.c.note_id == note_id)
                .order_by(note_events.c.id)
            ).mappings()
            return [_event(r) for r in rows]

    def events_of(
        self, note_ids: Iterable[str], *, until: datetime | None = None
    ) -> dict[str, list[NoteEvent]]:
        """The events of each note (oldest first), only those at or before ``until`` when given."""
        out: dict[str, list[NoteEvent]] = {}
        ids = list(dict.fromkeys(note_ids))
        with self.begin() as c:
            for part in chunks(ids, 500):
                q = select(note_events).where(note_events.c.note_id.in_(part))
                if until is not None:
                    q = q.where(note_events.c.at <= until)
                for r in c.execute(q.order_by(note_events.c.id)).mappings():
                    out.setdefault(r["note_id"], []).append(_event(r))
        return out

    def events_between(
        self,
        start: datetime | None = None,
        end: datetime | None = None,
        *,
        kinds: Iterable[str] | None = None,
        note_ids: Iterable[str] | None = None,
    ) -> list[NoteEvent]:
        """Events with ``start < at <= end`` (either bound optional), oldest first."""
        q = select(note_events)
        if start is not None:
            q = q.where(note_events.c.at > start)
        if end is not None:
            q = q.where(note_events.c.at <= end)
        if kinds is not None:
            q = q.where(note_events.c.event.in_(list(kinds)))
        if note_ids is not None:
            ids = list(note_ids)
            if not ids:
                return []
            q = q.where(note_events.c.note_id.in_(ids))
        with self.begin() as c:
            return [_event(r) for r in c.execute(q.order_by(note_events.c.id)).mappings()]

    def event_counts(
        self, *, since: datetime | None = None, run_id: str | None = None
    ) -> Counter[str]:
        """Events by kind (since an instant, or of one run)."""
        q = select(note_events.c.event, func.count()).group_by(note_events.c.event)
        if since is not None:
            q = q.where(note_events.c.at >= since)
        if run_id is not None:
            q = q.where(note_events.c.run_id == run_id)
        with self.begin() as c:
            return Counter({k: int(n) for k, n in c.execute(q)})

    def event_note_ids(self) -> set[str]:
        """Every note id some event names, but notes erased on purpose (a ``purged`` event):
        the asset check compares these with the table."""
        with self.begin() as c:
            named = {r for (r,) in c.execute(select(note_events.c.note_id).distinct())}
            erased = {
                r
                for (r,) in c.execute(
                    select(note_events.c.note_id).where(note_events.c.event == "purged").distinct()
                )
            }
        return named - erased

    def delete_note_events(
        self, *, user_id: str | None = None, note_ids: Iterable[str] | None = None
    ) -> int:
        """Erase the events of a user, or of some notes (purge, erase); returns the count."""
        if user_id is None and note_ids is None:
            raise ValueError("name a user or notes whose events to delete")
        deleted = 0
        with self.begin() as c:
            if user_id is not None:
                deleted += (
                    c.execute(delete(note_events).where(note_events.c.user_id == user_id)).rowcount
                    or 0
                )
            for part in chunks(list(note_ids or []), 500):
                deleted += (
                    c.execute(delete(note_events).where(note_events.c.note_id.in_(part))).rowcount
                    or 0
                )
        return deleted

    def restored_rules(self, note_ids: Iterable[str]) -> dict[str, set[str]]:
        """For candidate notes, the rules an analyst's restore still holds against: the
        ``details.rule`` of each ``restored`` event with no later analyst change of the
        note (an update or a status change clears them). Notes without any: absent."""
        ids = list(dict.fromkeys(note_ids))
        restored: list[str] = []
        with self.begin() as c:
            for part in chunks(ids, 500):
                restored.extend(
                    r
                    for (r,) in c.execute(
                        select(note_events.c.note_id)
                        .where(note_events.c.note_id.in_(part))
                        .where(note_events.c.event == EventKind.RESTORED.value)
                        .distinct()
                    )
                )
            out: dict[str, set[str]] = {}
            for part in chunks(restored, 500):
                rows = c.execute(
                    select(note_events.c.note_id, note_events.c.event, note_events.c.details)
                    .where(note_events.c.note_id.in_(part))
                    .where(note_events.c.actor == Actor.ANALYST.value)
                    .order_by(note_events.c.id)
                )
                for note_id, event, details in rows:
                    if event != EventKind.RESTORED.value:
                        out.pop(note_id, None)  # the analyst changed the note again
                        continue
                    rule = (details or {}).get("rule")
                    if rule:
                        out.setdefault(note_id, set()).add(str(rule))
        return out

    def events_of_run(self, run_id: str, limit: int | None = None) -> list[NoteEvent]:
        """The events one run recorded (a Memory Manager run, a write run), oldest first;
        at most ``limit`` when given."""
        q = select(note_events).where(note_events.c.run_id == run_id).order_by(note_events.c.id)
        if limit is not None:
            q = q.limit(limit)
        with self.begin() as c:
            return [_event(r) for r in c.execute(q).mappings()]

    def run_event_counts(self, run_ids: Iterable[str]) -> list[tuple[str | None, str, int]]:
        """``(phase, event, count)`` of the events some runs recorded (the inventory's
        "what the last maintenance did"), by phase then kind."""
        ids = [r for r in dict.fromkeys(run_ids) if r]
        if not ids:
            return []
        q = (
            select(note_events.c.phase, note_events.c.event, func.count())
            .where(note_events.c.run_id.in_(ids))
            .group_by(note_events.c.phase, note_events.c.event)
        )
        with self.begin() as c:
            rows = [(p, e, int(n)) for p, e, n in c.execute(q)]
        return sorted(rows, key=lambda r: (r[0] or "", r[1]))
