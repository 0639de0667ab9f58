"""The in-process read cache of injection: a scope's injectable notes (vectors and rows),
kept exact by the note table's version.

Each entry holds the rows of ``injectable AND lattice AND multi-tenant prefilter``
(everything in the note filter except the clock) at one table version. On every call
:meth:`ReadCache.rows` reads the table's latest committed version
(:meth:`RowTable.latest_version`: on a local disk the names in its ``_versions`` folder,
which show other processes' commits, without a ``checkout_latest``) and serves the entry
only at that same version. Any write anywhere in the table (add, update, archive, revoke,
delete, a scope change, compaction, another process's commit) makes a new version. When
every version since the entry's is a commit of this process that the table's journal
holds (:class:`~memory_pipelines.store.journal.CommitJournal`: the rows each append or
merge wrote, and no row for each version of a background compaction), the entry is
brought forward without reading the table: each written id dies where it was, and a
written row that passes the scope's filter (:meth:`Cond.matches`, SQL's rules evaluated
in Python) joins as a new segment. A scope without an entry in a table this process
created and filled (every version since its creation journalled, a few thousand rows at
most) is built the same way from all the rows written since, without a scan. Otherwise
the scope is read again. From a table of at least ``tuning.narrow_read_min_rows`` rows a
read fetches only the columns the ranking and the guards read (:data:`RANKING_COLUMNS`)
and each row's ``_rowid``; the rest of a row is read by that row id, at the version the
read saw, only for the notes a ranking materialises (:meth:`ScopeRows.models`): at a
million notes a user's rows are spread over the table's files, and their thirty-odd
columns cost several times their five. A smaller table is read whole, so a warm
injection there never reads the table. Expiry, the one
condition that changes without a write, is evaluated against the clock on each call
(:meth:`ScopeRows.live`). So the cache never serves a row the table would not return at
the version read at the start of the call.

The search then runs in process over the entry's segments: the vector side in numpy (an
exact scan, as LanceDB's flat search is), the text side BM25 over each segment's lexical
index with the statistics of their live rows together (:meth:`ScopeRows.lexical`, built
on first use and shared by the views that hold the segment), and rows become ``Note``
objects only when they are candidates. A view with many segments or many dead rows is
merged in memory (:meth:`ScopeView.patched`). Entries are bounded by ``max_rows`` held
rows in all (least recently used first out); a scope larger than that is not cached and
takes the LanceDB path.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from typing import Any, Generic

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memory_pipelines.injection.lexical import LexicalIndex
from memory_pipelines.injection.similarity import cosine_similarities
from memory_pipelines.notes import utc
from memory_pipelines.store import Cond, M, RowTable
from memory_pipelines.store.filters import matching_positions

log = logging.getLogger(__name__)

#: entries used this recently are read again after a compaction, in its thread
REFRESH_USED_WITHIN_S = 60.0
#: ... at most this many of them, the most recently used (the scopes in use right now)
REFRESH_MAX_ENTRIES = 16
#: Rows (vectors) cached per table at most: ~300 MB of 384-d float32 vectors.
DEFAULT_MAX_ROWS = 200_000
#: the columns a scope's read fetches for every row: what the ranking (vector, text,
#: creation time, type, conversation and turn), the expiry test and the write path's
#: near-duplicate guard read
RANKING_COLUMNS = (
    "id",
    "note",
    "created_at",
    "type",
    "expires_at",
    "source_conversation_id",
    "source_conversation_detail_id",
    "vector",
)
#: the columns a :class:`RankedRow` answers from itself
_RANKED_FIELDS = (
    "id",
    "note",
    "created_at",
    "expires_at",
    "source_conversation_id",
    "source_conversation_detail_id",
)
#: the row id a read returns beside them (what the rest of a row is read by)
ROW_ID = "_rowid"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NEVER = np.iinfo(np.int64).max


def _micros(ts: datetime) -> int:
    return (ts.astimezone(UTC) - _EPOCH) // timedelta(microseconds=1)


class ScopeRows(Generic[M]):
    """One scope's injectable rows read at one table version (immutable once built,
    except for the lazily materialised model objects). ``rows`` holds every column, or
    (:attr:`complete` False) the :data:`RANKING_COLUMNS` and :data:`ROW_ID` as a read
    at version ``read_at`` returned them: the rest is read when a row becomes a model."""

    def __init__(
        self,
        table: RowTable[M],
        version: int,
        rows: pa.Table,
        vectors: np.ndarray | None = None,
        *,
        read_at: int | None = None,
    ):
        self.table = table
        self.version = version
        self.read_at = read_at
        self.size = rows.num_rows
        if vectors is None:
            vec = rows.column("vector").combine_chunks() if self.size else None
            vectors = (
                np.asarray(vec.values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(
                    -1, table.dim
                )
                if vec is not None
                else np.zeros((0, table.dim), dtype=np.float32)
            )
            rows = rows.drop_columns(["vector"])
        self.vectors = vectors
        self.norms = np.linalg.norm(self.vectors, axis=1).astype(np.float32)
        self.rows = rows
        held = set(rows.column_names)
        #: whether ``rows`` holds every column (or the ranking ones, completed by row id)
        self.complete = all(f.name in held for f in table.schema if f.name != "vector")
        self.ids: list[str] = self.rows.column("id").to_pylist()
        self.index = {i: k for k, i in enumerate(self.ids)}
        expires = self.rows.column("expires_at")
        self.expires = (
            pc.fill_null(expires.cast(pa.int64()), _NEVER).to_numpy()
            if self.size
            else np.zeros(0, dtype=np.int64)
        )
        self._models: dict[int, M] = {}
        self._ranked: dict[int, RankedRow] = {}  # rows a ranking compared, not yet built
        self._lock = threading.Lock()
        self._lexical: dict[str, LexicalIndex] = {}
        self._lexical_lock = threading.Lock()
        self._created: np.ndarray | None = None
        self._types: list[str | None] | None = None
        #: what callers derive from the rows once (a ``nbytes`` attribute counts as held)
        self.memo: dict[str, Any] = {}

    @property
    def created(self) -> np.ndarray:
        """Creation times in epoch seconds (0 when unset)."""
        if self._created is None:
            micros = self.rows.column("created_at").cast(pa.int64())
            self._created = pc.fill_null(micros, 0).to_numpy().astype(np.float64) / 1e6
        return self._created

    @property
    def types(self) -> list[str | None]:
        """The rows' ``type`` column."""
        if self._types is None:
            self._types = self.rows.column("type").to_pylist()
        return self._types

    def lexical(self, stemmer: str = "light") -> LexicalIndex:
        """The lexical index of the rows' texts with ``stemmer`` (built once per entry)."""
        with self._lexical_lock:
            found = self._lexical.get(stemmer)
            if found is None:
                texts = self.rows.column("note").to_pylist()
                found = self._lexical[stemmer] = LexicalIndex(texts, stemmer)
            return found

    def live(self, now: datetime) -> np.ndarray:
        """Rows not expired at ``now`` (``expires_at`` NULL or after ``now``)."""
        return self.expires > _micros(now)

    def similarities(self, query: np.ndarray) -> np.ndarray:
        """Cosine similarity of every row to ``query``, rounded as LanceDB reports it
        (``1 - float32 cosine distance``)."""
        return cosine_similarities(self.vectors, self.norms, query)

    def models(self, positions: list[int]) -> list[M | None]:
        """The model objects of these rows (built once per entry, then reused). Rows read
        with the ranking columns only are completed first, all of ``positions`` in one
        small read (:meth:`full_rows`); None for a row that could not be (deleted since,
        its read version cleaned up: a caller skips it, as the next read would)."""
        with self._lock:
            todo = [p for p in dict.fromkeys(positions) if p not in self._models]
            if todo:
                full = self._full(np.asarray(todo, dtype=np.int64))
                built = self.table.models(full)
                if self.complete:
                    self._models.update(zip(todo, built, strict=True))
                else:
                    at = {i: k for k, i in enumerate(full.column("id").to_pylist())}
                    for p in todo:
                        k = at.get(self.ids[p])
                        if k is not None:
                            self._models[p] = built[k]
            return [self._models.get(p) for p in positions]

    def ranked(self, positions: list[int]) -> list[Any]:
        """These rows as a ranking compares them: the notes themselves where they are
        built, otherwise a :class:`RankedRow` each (the columns held, the rest read or
        built when asked); :func:`whole` turns the ones picked into notes, so a ranking
        builds only the notes it returns, not its pools."""
        with self._lock:
            out = [self._models.get(p) or self._ranked.get(p) for p in positions]
            todo = [p for p, n in zip(positions, out, strict=True) if n is None]
            if not todo:
                return out
            held = [name for name in _RANKED_FIELDS if name in self.rows.column_names]
            values = self.rows.select(held).take(pa.array(todo, type=pa.int64())).to_pylist()
            for p, v in zip(todo, values, strict=True):  # kept: the next query reuses them
                self._ranked[p] = RankedRow(self, p, v)
            return [
                n if n is not None else self._ranked[p] for n, p in zip(out, positions, strict=True)
            ]

    def full_rows(self, mask: np.ndarray) -> pa.Table:
        """Every column but ``vector`` of the rows at ``mask`` (bool), in order; a
        ``LookupError`` when one could not be read (see :meth:`models`)."""
        positions = np.flatnonzero(mask)
        full = self._full(positions)
        found = full.column("id").to_pylist()
        want = [self.ids[p] for p in positions.tolist()]
        if found != want:
            at = {i: k for k, i in enumerate(found)}
            missing = [i for i in want if i not in at]
            if missing:
                raise LookupError(f"rows no longer readable: {missing[:3]}")
            full = full.take(pa.array([at[i] for i in want], type=pa.int64()))
        return full

    def _full(self, positions: np.ndarray) -> pa.Table:
        """The rows at ``positions`` with every column but ``vector``: as held, or read by
        row id at :attr:`read_at` (by id at the latest version where that is gone); rows
        found, in no promised order."""
        picked = self.rows.take(pa.array(positions, type=pa.int64()))
        if self.complete:
            return picked
        row_ids = picked.column(ROW_ID).to_pylist() if ROW_ID in picked.column_names else None
        return self.table.rows_by_row_id(picked.column("id").to_pylist(), row_ids, self.read_at)


class RankedRow:
    """A row of a segment as the ranking sees a note: ``id``, ``note``, ``created_at``,
    ``expires_at`` and the conversation and turn ids as the note has them; any other
    attribute builds the whole note (read by row id when the segment holds the ranking
    columns only) and answers from it. Never handed out: :func:`whole` replaces the
    picked ones by their notes."""

    __slots__ = ("_rows", "_position", *_RANKED_FIELDS)

    def __init__(self, rows: ScopeRows[Any], position: int, values: dict[str, Any]):
        self._rows = rows
        self._position = position
        for name, value in values.items():
            setattr(self, name, utc(value) if isinstance(value, datetime) else value)

    def whole(self) -> Any:
        """The note (None when it could not be read, :meth:`ScopeRows.models`)."""
        return self._rows.models([self._position])[0]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        note = self.whole()
        if note is None:
            raise AttributeError(name)
        return getattr(note, name)


def whole(items: list[Any]) -> list[Any]:
    """``items`` with each :class:`RankedRow` replaced by its note (one read per segment
    for all of them), in order; a row that could not be read is left out."""
    by_rows: dict[int, tuple[ScopeRows[Any], list[int]]] = {}
    for item in items:
        if isinstance(item, RankedRow):
            by_rows.setdefault(id(item._rows), (item._rows, []))[1].append(item._position)
    if not by_rows:
        return items
    built = {
        (key, p): note
        for key, (rows, positions) in by_rows.items()
        for p, note in zip(positions, rows.models(positions), strict=True)
    }
    out = []
    for item in items:
        note = built[(id(item._rows), item._position)] if isinstance(item, RankedRow) else item
        if note is not None:
            out.append(note)
    return out


#: delta segments a view holds before they are merged into one
MAX_SEGMENTS = 16
#: share of a view's held rows that may be dead (replaced or left the scope) before the
#: view is rebuilt from its live rows
MAX_DEAD_SHARE = 0.25


class ScopeView(Generic[M]):
    """A scope's injectable rows at one table version: the rows of its last scan and of the
    commits this process made since, as segments (:class:`ScopeRows`), with which
    positions of each are current (``alive``: a row a later commit replaced, or moved out
    of the scope, is dead). Immutable: a patch makes a new view that shares the segments."""

    def __init__(
        self, version: int, segments: list[ScopeRows[M]], alive: list[np.ndarray], where: Cond
    ):
        self.version = version
        self.segments = segments
        self.alive = alive
        self.where = where  # the scope's filter
        self.used = time.monotonic()  # last served (the compactor refreshes recent ones)
        self.held = sum(seg.size for seg in segments)
        self.size = sum(int(a.sum()) for a in alive)
        #: what callers derive from the view once (it never changes)
        self.memo: dict[str, Any] = {}

    @classmethod
    def scanned(cls, rows: ScopeRows[M], where: Cond) -> ScopeView[M]:
        return cls(rows.version, [rows], [np.ones(rows.size, dtype=bool)], where)

    @classmethod
    def written(
        cls, table: RowTable[M], rows: pa.Table, where: Cond, version: int
    ) -> ScopeView[M] | None:
        """The scope at ``version`` out of ``rows``, the whole table at that version as
        this process wrote it (:meth:`CommitJournal.from_empty`): the rows that match
        ``where``, without reading the table. None when a row cannot be tested."""
        if rows.num_rows == 0:
            return cls.scanned(ScopeRows(table, version, table.schema.empty_table()), where)
        if rows.num_rows and rows.column(0).num_chunks > 1:
            rows = rows.combine_chunks()  # one chunk per commit: a take of many is slow
        try:
            keep = pa.array(matching_positions(rows, where), type=pa.int64())
            return cls.scanned(ScopeRows(table, version, rows.take(keep)), where)
        except (LookupError, TypeError, ValueError, pa.ArrowException):
            return None

    def kept(self, now: datetime) -> list[tuple[ScopeRows[M], np.ndarray]]:
        """Each segment with the positions that are live and unexpired at ``now``."""
        return [
            (seg, a & seg.live(now)) for seg, a in zip(self.segments, self.alive, strict=True)
        ]

    def patched(self, changes: list[pa.Table], where: Cond, version: int) -> ScopeView[M] | None:
        """This view after ``changes`` (the rows each later commit wrote, by id), at
        ``version``: every written id dies where it was, and a written row that matches
        ``where`` joins as a new segment. None when a row cannot be tested (the caller
        reads the scope again)."""
        table = self.segments[0].table
        segments = list(self.segments)
        alive = [a.copy() for a in self.alive]
        try:
            for rows in changes:
                ids = rows.column("id").to_pylist()
                for seg, a in zip(segments, alive, strict=True):
                    for i in ids:
                        k = seg.index.get(i)
                        if k is not None:
                            a[k] = False
                plain = rows.drop_columns(["vector"]).to_pylist()
                keep = [k for k, row in enumerate(plain) if where.matches(row)]
                if keep:
                    kept = rows if len(keep) == rows.num_rows else rows.take(keep)
                    segments.append(ScopeRows(table, version, kept))
                    alive.append(np.ones(len(keep), dtype=bool))
            view = ScopeView(version, segments, alive, where)
            return view._merged() if view._crowded() else view
        except (LookupError, TypeError, ValueError, pa.ArrowException):
            return None

    def _crowded(self) -> bool:
        return len(self.segments) > MAX_SEGMENTS or (
            self.held > 64 and self.held - self.size > MAX_DEAD_SHARE * self.held
        )

    def _merged(self) -> ScopeView[M]:
        """The same live rows in the same order, in fewer segments. Too many segments:
        the newest ones merged like a binary counter (:meth:`_tail_start`), so a row is
        copied about log2(rows written) times, not once every few writes. Too many dead
        rows: the delta segments merged into one, or everything when the first segment
        holds many of them. (A merged segment's lexical index is built again on first
        use.)"""
        if self.held > 64 and self.held - self.size > MAX_DEAD_SHARE * self.held:
            base_dead = self.segments[0].size - int(self.alive[0].sum())
            start = 0 if base_dead > MAX_DEAD_SHARE * max(1, self.segments[0].size) else 1
        else:
            start = self._tail_start()
        merged = _concat(self.segments[start:], self.alive[start:], self.version)
        if merged is None:
            return ScopeView(self.version, self.segments[:start], self.alive[:start], self.where)
        return ScopeView(
            self.version,
            [*self.segments[:start], merged],
            [*self.alive[:start], np.ones(merged.size, dtype=bool)],
            self.where,
        )

    def _tail_start(self) -> int:
        """Where the merge of the newest delta segments starts: back to the oldest one
        holding no more live rows than all newer ones together (every segment left then
        holds more than all newer ones, so there are about log2(rows) of them); when
        that still leaves :data:`MAX_SEGMENTS`, back to half of them. The first segment
        (the scope's scan) is not merged here."""
        live = [int(a.sum()) for a in self.alive]
        if len(live) < 3:
            return 1
        start, newer = len(live) - 2, live[-1] + live[-2]  # at least the newest two
        while start > 1 and live[start - 1] <= newer:
            start -= 1
            newer += live[start]
        return min(start, MAX_SEGMENTS // 2) if start >= MAX_SEGMENTS else start


def _concat(
    segments: list[ScopeRows[M]], alive: list[np.ndarray], version: int
) -> ScopeRows[M] | None:
    """One segment of the live rows of ``segments``, in order (None when none is live)."""
    if not segments or not any(a.any() for a in alive):
        return None
    if all(seg.complete for seg in segments):
        schema = segments[0].rows.schema
    else:  # a segment read with the ranking columns only: its rows are completed
        schema = pa.schema([f for f in segments[0].table.schema if f.name != "vector"])
    rows = pa.concat_tables(
        [
            seg.full_rows(a).select(schema.names).cast(schema)
            for seg, a in zip(segments, alive, strict=True)
        ]
    ).combine_chunks()
    vectors = np.concatenate([seg.vectors[a] for seg, a in zip(segments, alive, strict=True)])
    return ScopeRows(segments[0].table, version, rows, vectors)


def _scan(table: RowTable[Any], where: Cond) -> tuple[pa.Table, int | None]:
    """The rows of ``where``: the :data:`RANKING_COLUMNS` and row ids where the table has
    them all (a note table) and holds at least ``tuning.narrow_read_min_rows`` rows, with
    the version read; every column otherwise."""
    names = set(table.schema.names)
    narrow = all(c in names for c in RANKING_COLUMNS)
    if narrow and table.count() >= table.tuning.narrow_read_min_rows:
        return table.scan_with_row_ids(where, RANKING_COLUMNS)
    return table.scan_arrow(where), None


class ReadCache:
    """Scope entries of one table, most recently used last, at most ``max_rows`` rows."""

    def __init__(self, table: RowTable[Any], max_rows: int = DEFAULT_MAX_ROWS):
        self._table = weakref.ref(table)
        self.max_rows = max_rows
        self.enabled = True
        self._entries: OrderedDict[str, ScopeView] = OrderedDict()
        self._too_big: dict[str, int] = {}  # scope -> version at which it was too big
        self._lock = threading.Lock()
        self.scans = 0  # scope scans done (a test and benchmark signal)
        self.patches = 0  # entries brought forward from this process's commits
        self.unread = 0  # first reads built from every row written since the table was empty

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._too_big.clear()

    def holds(self, where: Cond) -> bool:
        """Whether an entry for ``where`` is cached (at any version)."""
        with self._lock:
            return where.sql in self._entries

    def rows(self, where: Cond) -> ScopeView | None:
        """The rows matching ``where`` at the table's latest version, or None when the
        cache is disabled or the scope holds more than ``max_rows`` rows. An entry behind
        the latest version is brought to it from this process's commits since
        (:meth:`RowTable.changes_since`) when the journal holds them all, else read again."""
        table = self._table()
        if not self.enabled or table is None or self.max_rows <= 0:
            return None
        key = where.sql
        latest = table.latest_version()  # no checkout: an entry at it is served as is
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.version == latest:
                self._entries.move_to_end(key)
                entry.used = time.monotonic()
                return entry
            if self._too_big.get(key) == latest:
                return None
        if entry is not None and entry.version < latest and where.testable:
            latest, changes = table.changes_since(entry.version, latest)
            patched = entry.patched(changes, where, latest) if changes is not None else None
            if patched is not None and patched.held <= self.max_rows:
                self.patches += 1
                return self._install(key, patched)
        if where.testable:
            view = self._from_empty(table, where, latest)
            if view is not None:
                return self._install(key, view)
        version = latest
        # read after the version was listed (the scan checks out the latest version
        # itself): the rows are at least as new as the version they carry
        rows, read_at = _scan(table, where)
        self.scans += 1
        if rows.num_rows > self.max_rows:
            with self._lock:
                self._entries.pop(key, None)
                self._too_big[key] = version
            return None
        scanned = ScopeRows(table, version, rows, read_at=read_at)
        return self._install(key, ScopeView.scanned(scanned, where))

    def _from_empty(self, table: RowTable[Any], where: Cond, latest: int) -> ScopeView | None:
        """A first read served from the rows this process wrote since it created the
        table (:meth:`RowTable.rows_from_empty`), when they are all known; None otherwise."""
        latest, rows = table.rows_from_empty(latest)
        if rows is None:
            return None
        view = ScopeView.written(table, rows, where, latest)
        if view is None or view.held > self.max_rows:
            return None
        self.unread += 1
        return view

    def held_bytes(self) -> int:
        """Bytes of the rows, vectors and norms the cached entries hold, and of what was
        derived from them with a size (a segment two entries share counted once; the
        lexical indexes built on them not counted)."""
        with self._lock:
            segments = {id(seg): seg for e in self._entries.values() for seg in e.segments}
        return sum(
            seg.rows.nbytes + seg.vectors.nbytes + seg.norms.nbytes
            + sum(getattr(m, "nbytes", 0) for m in list(seg.memo.values()))
            for seg in segments.values()
        )  # fmt: skip

    def refresh(
        self, used_within: float = REFRESH_USED_WITHIN_S, most: int = REFRESH_MAX_ENTRIES
    ) -> int:
        """Bring the entries used in the last ``used_within`` seconds (the ``most`` most
        recently used) to the latest version
        (after a compaction: the background one's versions are journalled as writing
        nothing, so this only brings entries forward; after any other, the compactor's
        thread pays the scans, not the next request); returns how many were read."""
        cutoff = time.monotonic() - used_within
        with self._lock:  # entries are kept least recently used first
            recent = [e for e in reversed(self._entries.values()) if e.used >= cutoff]
        wanted = [e.where for e in recent[:most]]
        before = self.scans
        for where in wanted:
            try:
                self.rows(where)
            except Exception as e:  # a warm-up only: the next request reads on its own
                log.debug("refreshing a cached scope failed: %s", e)
        return self.scans - before

    def _install(self, key: str, view: ScopeView) -> ScopeView:
        """Keep ``view`` for its scope (unless a newer one is kept already) and evict the
        least recently used entries beyond ``max_rows``; returns the kept one."""
        with self._lock:
            current = self._entries.get(key)
            if current is None or current.version <= view.version:
                self._entries[key] = current = view
            self._entries.move_to_end(key)
            current.used = time.monotonic()
            total = sum(e.held for e in self._entries.values())
            while total > self.max_rows and len(self._entries) > 1:
                _, old = self._entries.popitem(last=False)
                total -= old.held
            return current


_CACHES_LOCK = threading.Lock()


def read_cache(table: RowTable[Any]) -> ReadCache:
    """The read cache of ``table`` in this process (created on first use; refreshed by
    the table's background compactor after each compaction). It lives in the table's
    ``caches``, not in a module-level map: its entries hold the table, so a map keyed by
    the table (even weakly) would keep every table, and its home, alive for good; closing
    the table drops it."""
    with _CACHES_LOCK:
        cache = table.caches.get("read")
        if cache is None:
            cache = table.caches["read"] = ReadCache(table)
            refresh = weakref.WeakMethod(cache.refresh)
            table.compaction_listeners.append(lambda: (r := refresh()) and r())
        return cache
