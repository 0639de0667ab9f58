"""The note store: the only code that touches LanceDB.

Two tables, ``notes`` and ``examples``, each with an explicit Arrow schema and a
float32 ``vector`` column of the embedder's dimension. ``upsert`` replaces rows by id
through ``merge_insert``; ``put`` appends rows whose ids are new and merges only the
others, so a single new note never reads the table. A table that has taken
``compact_every`` writes in this process compacts its small fragments in a background
thread (see :class:`~memory_pipelines.store.compaction.Compactor`), so the fragment count,
and with it the cost of every read and write, stays bounded between maintenance runs.
Filters are built with :class:`Cond` helpers that render every value through LanceDB's
own literal encoder (``lancedb.expr.lit``), so an id or scope value holding quotes, ``OR 1=1`` or comment markers matches nothing and widens nothing.

Modules: :mod:`.filters` (``Cond`` and its builders), :mod:`.schema` (Arrow schemas, row
conversions), :mod:`.rowtable` (``RowTable``: one table; its reads in
:mod:`.table_reads`, its search in :mod:`.table_search`), :mod:`.compaction` (the
background compactor and the rewrites purge relies on); this one holds ``NoteStore``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from memory_pipelines.config import INDEXED_NOTE_COLUMNS, TableTuning
from memory_pipelines.errors import StoreError
from memory_pipelines.notes import Example, Note
from memory_pipelines.store.filters import (
    FALSE,
    TRUE,
    Cond,
    and_,
    cmp,
    eq,
    icontains,
    in_,
    injectable,
    is_null,
    ne,
    not_null,
    or_,
)
from memory_pipelines.store.lance_internals import lancedb_session, session_bytes
from memory_pipelines.store.native_memory import hold_mmap_threshold, trim_native_heap
from memory_pipelines.store.rowtable import (
    AUTO_CLEANUP_OLDER_THAN,
    COMPACT_EVERY,
    ID_INDEX_MIN_ROWS,
    RowTable,
)
from memory_pipelines.store.schema import EXAMPLES_TABLE, NOTES_TABLE, M, fts_query, table_schema
from memory_pipelines.store.table_search import Hit

__all__ = [
    "AUTO_CLEANUP_OLDER_THAN",
    "COMPACT_EVERY",
    "EXAMPLES_TABLE",
    "FALSE",
    "ID_INDEX_MIN_ROWS",
    "NOTES_TABLE",
    "TRUE",
    "Cond",
    "Hit",
    "M",
    "NoteStore",
    "RowTable",
    "and_",
    "cmp",
    "eq",
    "fts_query",
    "icontains",
    "in_",
    "injectable",
    "is_null",
    "ne",
    "not_null",
    "or_",
    "table_schema",
]


class NoteStore:
    """The LanceDB database of one memory home: ``notes`` and ``examples`` tables."""

    def __init__(
        self,
        uri: str,
        dim: int,
        *,
        storage_options: dict[str, str] | None = None,
        read_consistency_interval: timedelta | None = timedelta(0),
        create: bool = True,
        compact_every: int = COMPACT_EVERY,
        tuning: TableTuning | None = None,
    ):
        """Connect to the database at ``uri``; missing tables are created unless
        ``create`` is False, when a missing table is a ``HomeError``. ``compact_every``:
        commits of this process after which a table compacts in the background (0: only
        when asked, by :meth:`compact` or the maintenance run); ``tuning``: when the
        tables get their indexes and how their background compaction runs (the
        :class:`~memory_pipelines.config.TableTuning` defaults when None)."""
        import lancedb

        self.uri = str(uri)
        self.dim = dim
        bounds = tuning if tuning is not None else TableTuning()
        hold_mmap_threshold(bounds.mmap_threshold_bytes)
        #: LanceDB's caches of manifests, file metadata and index pages for this home,
        #: bounded by ``tuning`` (see :meth:`cache_bytes`)
        self.session = lancedb_session(bounds.metadata_cache_bytes, bounds.index_cache_bytes)
        try:
            self.db = lancedb.connect(
                self.uri,
                read_consistency_interval=read_consistency_interval,
                storage_options=storage_options,
                session=self.session,
            )
        except Exception as e:
            raise StoreError(f"cannot open LanceDB at {self.uri!r}: {e}") from e
        self.notes: RowTable[Note] = RowTable(
            self.db, NOTES_TABLE, Note, dim, "note", create, tuning
        )
        self.examples: RowTable[Example] = RowTable(
            self.db, EXAMPLES_TABLE, Example, dim, "example_input", create, tuning
        )
        for table in (self.notes, self.examples):
            table.compact_every = compact_every
        self.notes.scalar_columns = INDEXED_NOTE_COLUMNS
        self.examples.scalar_columns = ("agent_id", "status")

    def cache_bytes(self) -> dict[str, int]:
        """What the home's Lance caches hold now, in bytes: LanceDB's (``lancedb``) and
        each table's dataset reads' (by table name); each is bounded by the store's
        :class:`~memory_pipelines.config.TableTuning` cache sizes."""
        return {
            "lancedb": session_bytes(self.session),
            NOTES_TABLE: self.notes.dataset_cache_bytes(),
            EXAMPLES_TABLE: self.examples.dataset_cache_bytes(),
        }

    def close(self, timeout: float = 60.0) -> None:
        """End both tables' background compaction threads and drop their cached datasets
        (see :meth:`RowTable.close`), so nothing of this store outlives its last user."""
        for table in (self.notes, self.examples):
            table.close(timeout)
        trim_native_heap()  # what the tables' caches freed goes back to the system

    def compact(
        self,
        cleanup_older_than: timedelta | None = timedelta(hours=1),
        note_columns: Sequence[str] = ("agent_id", "status"),
    ) -> dict[str, dict]:
        """Compact both tables, refresh their indexes (creating the scalar ones of
        ``note_columns`` on notes, agent and status on examples) and drop versions older
        than ``cleanup_older_than``; per table what it did (versions, fragments, seconds)."""
        return {
            NOTES_TABLE: self.notes.compact(cleanup_older_than, note_columns),
            EXAMPLES_TABLE: self.examples.compact(cleanup_older_than, ("agent_id", "status")),
        }

    def optimize(self, cleanup_older_than: timedelta | None = timedelta(hours=1)) -> dict:
        return {
            NOTES_TABLE: self.notes.optimize(cleanup_older_than),
            EXAMPLES_TABLE: self.examples.optimize(cleanup_older_than),
        }



