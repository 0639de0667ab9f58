"""Filtered reads through Lance's own dataset API, at the table's latest version.

LanceDB's query builder spends 6-10 ms of Python and planning on every call on these
machines, whatever the result: a lookup of 5 ids through the id index took 12 ms against
2 ms as a scan of the same dataset with the same filter, and a 20-row scope scan 17 ms
against 12 ms. Both read the same files with the same scalar indexes and return the same
rows in the same order. The write path asks such questions on every run (which of its
note ids are stored, the scope's candidates on a cold read cache), so those reads go
through here.

:class:`DatasetReads` keeps one ``lance.LanceDataset`` per table and checks it out at
the latest committed version before each read (a commit of another process included:
the version comes from the table's manifest listing). Where it cannot answer (pylance
missing, a table it cannot open, an error), it returns None and the caller asks LanceDB,
whose answer or error stands.

**The tail in memory.** Every single write commits a small fragment, and a filtered scan
pays ~0.4 ms per fragment whatever it holds (32 one-row fragments after a 10k-note
compacted one: 4.7 -> 17.7 ms for a scope's scan), until the background compaction merges
them. So the rows of the small fragments at the end of the table (at most
``SMALL_FRAGMENT_ROWS`` rows each, ``MAX_HELD_ROWS`` in all, ``MAX_HELD_FRAGMENTS``
fragments) are read once per fragment
and held: a read scans the large fragments with the filter, and tests the held rows with
the filter's own row test (:meth:`~memory_pipelines.store.filters.Cond.matches`), in
the table's fragment order. A fragment is held under its data files and its deletion
file, which are immutable: a row deleted or updated since gives the fragment a new
deletion file, hence a new entry, and a compaction gives new fragments; entries no longer
in the latest version are dropped on the next read. A filter without a row test, small
fragments before a large one, a schema the held rows do not match, or a row the test
cannot judge, and the whole scan goes to Lance as before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from memory_pipelines.store.filters import Cond

log = logging.getLogger(__name__)

#: fragments of at most this many rows are held in memory once read (the tail)
SMALL_FRAGMENT_ROWS = 256
#: the most rows held per table; a larger tail is scanned
MAX_HELD_ROWS = 20_000
#: held reads start at this many small fragments (fewer cost Lance little) and stop beyond
#: the most (the background compaction keeps the tail far shorter)
MIN_SMALL_FRAGMENTS = 2
MAX_HELD_FRAGMENTS = 1024


class _Held:
    """The small fragments' live rows in fragment order: the table, and the rows as dicts
    (no vector) for the row tests; ``stamp`` names the version they are of."""

    __slots__ = ("table", "rows", "stamp")

    def __init__(self, table: pa.Table, rows: list[dict[str, Any]] | None = None) -> None:
        self.table = table
        self.stamp: tuple[Any, ...] = ()
        if rows is None:
            rows = table.drop_columns([c for c in table.column_names if c == "vector"]).to_pylist()
        self.rows = rows


class DatasetReads:
    """Scans of one LanceDB table through its Lance dataset (see the module notes)."""

    def __init__(self, table: Any, latest_version: Callable[[], int]):
        self._table = table
        self._latest_version = latest_version
        self._dataset: Any = None
        self._lock = threading.Lock()
        self._held: dict[tuple[Any, ...], _Held] = {}  # each small fragment's live rows
        self._tail: _Held | None = None  # the latest tail, in fragment order
        self.available = True

    def _at_latest(self) -> Any:
        version = self._latest_version()
        ds = self._dataset
        if ds is None:
            with self._lock:
                if self._dataset is None:
                    self._dataset = self._table.to_lance()
                ds = self._dataset
        if ds.version != version:
            ds = self._dataset = ds.checkout_version(version)
        return ds

    def to_table(self, columns: Sequence[str], where: Cond | None) -> pa.Table | None:
        """The matching rows' ``columns`` at the latest version, or None when only LanceDB
        can say."""
        if not self.available:
            return None
        try:
            ds = self._at_latest()
            found = self._with_tail(ds, list(columns), where)
            if found is not None:
                return found
            return ds.to_table(columns=list(columns), filter=_sql(where))
        except ImportError:  # pylance absent: LanceDB answers from now on
            self.available = False
        except Exception as e:
            log.debug("dataset read fell back to LanceDB: %s", e)
        return None

    def _with_tail(self, ds: Any, columns: list[str], where: Cond | None) -> pa.Table | None:
        """The scan with the small fragments' rows from memory (see the module notes), or
        None where Lance must scan them."""
        if where is not None and not where.testable:
            return None
        fragments = ds.get_fragments()
        metas = [f.metadata for f in fragments]
        rows = [m.physical_rows for m in metas]
        large = sum(1 for n in rows if n > SMALL_FRAGMENT_ROWS)
        if (
            not MIN_SMALL_FRAGMENTS <= len(rows) - large <= MAX_HELD_FRAGMENTS
            or any(n > SMALL_FRAGMENT_ROWS for n in rows[large:])  # not all at the end
            or sum(rows[large:]) > MAX_HELD_ROWS
        ):
            if self._tail is not None:  # e.g. compacted: what was held is gone
                with self._lock:
                    self._held, self._tail = {}, None
            return None
        tail = self._tail_of(ds.version, fragments[large:], metas[large:])
        picked = tail.table.select(columns)
        if where is not None:
            hits = [i for i, row in enumerate(tail.rows) if where.matches(row)]
            picked = picked.take(pa.array(hits, pa.int64()))
        if not large:
            return picked
        head = ds.scanner(columns=columns, filter=_sql(where), fragments=fragments[:large])
        scanned = head.to_table()
        if picked.schema != scanned.schema:
            picked = picked.cast(scanned.schema)
        return pa.concat_tables([scanned, picked])

    def _tail_of(self, version: int, fragments: list[Any], metas: list[Any]) -> _Held:
        """The small fragments' live rows, in order, as one held table."""
        tail = self._tail
        # the version, and the last fragment's data files (their names are unique: a table
        # dropped and created again does not reuse them), name the tail of this version
        stamp = (version, len(metas), _key(metas[-1]))
        if tail is not None and tail.stamp == stamp:
            return tail
        keys = tuple(_key(m) for m in metas)
        with self._lock:
            held = dict(self._held)
        parts: list[_Held] = []
        for fragment, key in zip(fragments, keys, strict=True):
            if key not in held:
                held[key] = _Held(fragment.to_table())
            parts.append(held[key])
        tail = _Held(
            pa.concat_tables([p.table for p in parts]), [row for p in parts for row in p.rows]
        )
        tail.stamp = stamp
        with self._lock:  # only the latest version's fragments stay held
            self._held = {key: held[key] for key in keys}
            self._tail = tail
        return tail


def _key(meta: Any) -> tuple[Any, ...]:
    """A fragment's identity: its data files and its deletion file (all immutable)."""
    deletion = meta.deletion_file
    return (
        tuple(f.path for f in meta.files),
        None if deletion is None else (deletion.id, deletion.read_version, deletion.file_type),
    )


def _sql(where: Cond | None) -> str | None:
    return None if where is None else where.sql
