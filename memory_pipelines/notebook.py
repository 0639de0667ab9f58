"""The notebook: stamps, embeds and saves notes and examples, the one way code writes them.

Storage layer, below every phase: a note saved here gets ``created_at`` (kept when set),
``updated_at`` from the service clock and the embedder's ``embedding_model_id``; its vector
comes from the embedder unless the caller already has it.

Lifecycle events (:mod:`memory_pipelines.note_events`) are recorded here too, right after the
notes they describe are saved: ``save_notes(notes, events=...)`` and ``update_notes(...,
event=...)`` stamp each event with the save's instant (``at`` == the note's
``updated_at``) and hand them to the journal (the SQL sources' ``note_events``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

import numpy as np

from memory_pipelines.embeddings import Embedder
from memory_pipelines.errors import EmbeddingError, MemoryPipelineError, ValidationError
from memory_pipelines.note_events import Actor, EventKind, NoteEvent, note_event
from memory_pipelines.notes import Example, Note
from memory_pipelines.store import NoteStore

Item = TypeVar("Item", Note, Example)

#: Where events go: ``journal(events, at)`` appends them (``Sources.add_note_events``).
Journal = Callable[[Sequence[NoteEvent], datetime], Any]


class Notebook:
    """Stamps, embeds and saves notes and examples into a ``NoteStore``."""

    def __init__(
        self,
        store: NoteStore,
        embedder: Embedder,
        clock: Callable[[], datetime],
        journal: Journal | None = None,
    ):
        self.store = store
        self.embedder = embedder
        self.clock = clock
        self.journal = journal
        self._local = threading.local()

    def record(self, events: Sequence[NoteEvent], at: datetime | None = None) -> None:
        """Append lifecycle events (without ``at``: ``at`` or now) to the journal."""
        if events and self.journal is not None:
            self.journal(events, at or self.clock())  # an event without ``at`` gets this one

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts (cached by content hash; batched). Any failure of the embedder is
        an ``EmbeddingError``, so callers can fail open or fall back on one error type."""
        try:
            return self.embedder.embed(list(texts))
        except MemoryPipelineError:
            raise
        except Exception as e:
            raise EmbeddingError(str(e) or type(e).__name__) from e

    def save_notes(
        self,
        notes: Sequence[Note],
        vectors: np.ndarray | None = None,
        *,
        events: Sequence[NoteEvent] = (),
        keep_stamps: bool = False,
        append: bool = False,
        fresh: bool = False,
    ) -> list[Note]:
        """Save notes by id (embedding their text unless vectors are given); stamps timestamps
        and records ``events`` (the lifecycle events of these changes) at the save's instant.
        ``keep_stamps``: keep the notes' own ``updated_at`` too (an import's, set when given).

        By default a ``merge_insert`` on id (``RowTable.upsert``): callers may name any id
        (``add_note(id=...)``), and two processes saving one new id at once must end with
        one row. ``append``: the caller guarantees that no other writer creates these ids
        at the same moment, or decides afterwards which one did (a fresh uuid; the write
        path's ids, which the run ledger's claim decides, the loser collapsing its copy):
        new ids are appended without reading the table (``RowTable.put``; a stored id,
        such as a retry after a crash, is still merged). :meth:`appending` sets it for
        every save of a block. ``fresh``: the ids were generated for this save
        (:func:`~memory_pipelines.notes.new_id`), so no row can hold them: one append,
        without even the id lookup (``RowTable.add``)."""
        if not notes:
            return []
        stamped = self._stamp(notes, keep_stamps)
        if vectors is None:
            vectors = self.embed([n.note for n in stamped])
        if fresh:
            self.store.notes.add(stamped, vectors)
        elif append or getattr(self._local, "append", False):
            self.store.notes.put(stamped, vectors)
        else:
            self.store.notes.upsert(stamped, vectors)
        self.record(events, stamped[0].updated_at)
        return stamped

    @contextmanager
    def appending(self) -> Iterator[None]:
        """Within the block, this thread's :meth:`save_notes` calls save with ``append``:
        for callers whose claim decides the ids they create (the write path)."""
        before = getattr(self._local, "append", False)
        self._local.append = True
        try:
            yield
        finally:
            self._local.append = before

    def create_notes(
        self,
        notes: Sequence[Note],
        vectors: np.ndarray | None = None,
        *,
        actor: str | Actor = Actor.ANALYST,
        phase: str | None = None,
        run_id: str | None = None,
        append: bool = False,
        fresh: bool = False,
        **details: Any,
    ) -> list[Note]:
        """Save new notes with one ``created`` event each, built from the note as stamped (so
        the event's fields carry the ``created_at`` the note is saved with); ``append`` and
        ``fresh`` as in :meth:`save_notes`."""
        if not notes:
            return []
        stamped = self._stamp(notes)
        events = [
            note_event(EventKind.CREATED, n, actor=actor, phase=phase, run_id=run_id, **details)
            for n in stamped
        ]
        return self.save_notes(stamped, vectors, events=events, append=append, fresh=fresh)

    def save_examples(
        self,
        examples: Sequence[Example],
        vectors: np.ndarray | None = None,
        *,
        keep_stamps: bool = False,
    ) -> list[Example]:
        """Save examples by id like notes (their input text is what gets embedded)."""
        if not examples:
            return []
        stamped = self._stamp(examples, keep_stamps)
        if vectors is None:
            vectors = self.embed([e.example_input for e in stamped])
        self.store.examples.upsert(stamped, vectors)
        return stamped

    def _stamp(self, items: Sequence[Item], keep_stamps: bool = False) -> list[Item]:
        """``created_at`` (kept when set), ``updated_at`` now (kept when set and
        ``keep_stamps``), the embedder's model id."""
        now = self.clock()
        return [
            item.model_copy(
                update={
                    "created_at": item.created_at or now,
                    "updated_at": (item.updated_at if keep_stamps else None) or now,
                    "embedding_model_id": self.embedder.model_id,
                }
            )
            for item in items
        ]

    def update_notes(
        self,
        changes: Iterable[tuple[Note, Mapping[str, Any]]],
        *,
        event: str | EventKind | None = EventKind.UPDATED,
        actor: str | Actor = Actor.ANALYST,
        phase: str | None = None,
        run_id: str | None = None,
        **details: Any,
    ) -> list[Note]:
        """Apply field changes to notes and save them in one upsert, recording one ``event``
        per note (None: no event, for changes that are not lifecycle changes, such as access
        counts); ``details`` go into each event."""
        pairs: list[tuple[Note, Note]] = []
        for n, ch in changes:  # validated (and enum values normalised) like a new note
            try:
                pairs.append((n, Note.model_validate({**n.model_dump(), **dict(ch)})))
            except ValueError as e:  # pydantic's ValidationError is a ValueError
                raise ValidationError(f"invalid note update for {n.id!r}: {e}") from e
        events = (
            []
            if event is None
            else [
                note_event(
                    event, after, before=before, actor=actor, phase=phase, run_id=run_id, **details
                )
                for before, after in pairs
            ]
        )
        return self.save_notes([after for _, after in pairs], events=events)
