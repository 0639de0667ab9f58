"""The in-process read cache of injection: a scope's injectable notes (vectors and rows),
kept exact by the note table's version.

Each entry is the result of one scan of ``injectable AND lattice AND multi-tenant
prefilter`` (everything in the note filter except the clock) at one table version. On
every call :meth:`ReadCache.rows` reads the table's latest committed version
(:meth:`RowTable.latest_version`: on a local disk the names in its ``_versions`` folder,
which show other processes' commits, without a ``checkout_latest``) and serves the entry
only when it was read at that same version; a scan checks the latest version out first; any write anywhere in the table (add, update, archive, revoke, delete, a
scope change, compaction) makes a new version, and the scope is scanned again. Expiry,
the one condition that changes without a write, is evaluated against the clock on each
call (:meth:`ScopeRows.live`). So the cache never serves a row the table would not
return at the version read at the start of the call.

The search then runs in process over the entry: the vector side in numpy (an exact scan,
as LanceDB's flat search is), the text side BM25 over a lexical index of the entry's texts
(:meth:`ScopeRows.lexical`, built on first use and dropped with the entry, so it is exact
by version too), and rows become ``Note`` objects only when they are candidates. Entries are bounded by ``max_rows`` in all (least recently used first out);
a scope larger than that is not cached and takes the LanceDB path.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from datetime import UTC, datetime, timedelta
from typing import Any, Generic

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memory_pipelines.injection.lexical import LexicalIndex
from memory_pipelines.store import Cond, M, RowTable

#: Rows (vectors) cached per table at most: ~300 MB of 384-d float32 vectors.
DEFAULT_MAX_ROWS = 200_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NEVER = np.iinfo(np.int64).max


def _micros(ts: datetime) -> int:
    return (ts.astimezone(UTC) - _EPOCH) // timedelta(microseconds=1)


class ScopeRows(Generic[M]):
    """One scope's injectable rows read at one table version (immutable once built,
    except for the lazily materialised model objects)."""

    def __init__(self, table: RowTable[M], version: int, rows: pa.Table):
        self.table = table
        self.version = version
        self.size = rows.num_rows
        vec = rows.column("vector").combine_chunks() if self.size else None
        self.vectors = (
            np.asarray(vec.values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(
                -1, table.dim
            )
            if vec is not None
            else np.zeros((0, table.dim), dtype=np.float32)
        )
        self.norms = np.linalg.norm(self.vectors, axis=1).astype(np.float32)
        self.rows = rows.drop_columns(["vector"])
        self.ids: list[str] = self.rows.column("id").to_pylist()
        self.index = {i: k for k, i in enumerate(self.ids)}
        expires = self.rows.column("expires_at")
        self.expires = (
            pc.fill_null(expires.cast(pa.int64()), _NEVER).to_numpy()
            if self.size
            else np.zeros(0, dtype=np.int64)
        )
        self._models: dict[int, M] = {}
        self._lock = threading.Lock()
        self._lexical: dict[str, LexicalIndex] = {}
        self._lexical_lock = threading.Lock()
        self._created: np.ndarray | None = None
        self._types: list[str | None] | None = None

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

    def models(self, positions: list[int]) -> list[M]:
        """The model objects of these rows (built once per entry, then reused)."""
        with self._lock:
            todo = [p for p in dict.fromkeys(positions) if p not in self._models]
            if todo:
                built = self.table.models(self.rows.take(pa.array(todo, type=pa.int64())))
                self._models.update(zip(todo, built, strict=True))
            return [self._models[p] for p in positions]


def cosine_similarities(vectors: np.ndarray, norms: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``vectors`` (with their ``norms``) to ``query``,
    rounded as LanceDB reports it (``1 - float32 cosine distance``)."""
    q = np.asarray(query, dtype=np.float32)
    qn = np.float32(np.linalg.norm(q))
    dots = vectors @ q
    denom = norms * qn
    cos = np.divide(dots, denom, out=np.zeros_like(dots), where=denom > 0)
    distance = (np.float32(1.0) - cos).astype(np.float32)
    return 1.0 - distance.astype(np.float64)


class ReadCache:
    """Scope entries of one table, most recently used last, at most ``max_rows`` rows."""

    def __init__(self, table: RowTable[Any], max_rows: int = DEFAULT_MAX_ROWS):
        self._table = weakref.ref(table)
        self.max_rows = max_rows
        self.enabled = True
        self._entries: OrderedDict[str, ScopeRows] = OrderedDict()
        self._too_big: dict[str, int] = {}  # scope -> version at which it was too big
        self._lock = threading.Lock()
        self.scans = 0  # scope scans done (a test and benchmark signal)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._too_big.clear()

    def holds(self, where: Cond) -> bool:
        """Whether an entry for ``where`` is cached (at any version)."""
        with self._lock:
            return where.sql in self._entries

    def rows(self, where: Cond) -> ScopeRows | None:
        """The rows matching ``where`` at the table's latest version, or None when the
        cache is disabled or the scope holds more than ``max_rows`` rows."""
        table = self._table()
        if not self.enabled or table is None or self.max_rows <= 0:
            return None
        key = where.sql
        latest = table.latest_version()  # no checkout: an entry at it is served as is
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.version == latest:
                self._entries.move_to_end(key)
                return entry
            if self._too_big.get(key) == latest:
                return None
        version = table.version  # checks out the latest version for the scan
        # read after the version: the rows are at least as new as the version they carry
        rows = table.scan_arrow(where)
        self.scans += 1
        with self._lock:
            if rows.num_rows > self.max_rows:
                self._entries.pop(key, None)
                self._too_big[key] = version
                return None
            entry = ScopeRows(table, version, rows)
            self._entries[key] = entry
            self._entries.move_to_end(key)
            total = sum(e.size for e in self._entries.values())
            while total > self.max_rows and len(self._entries) > 1:
                _, old = self._entries.popitem(last=False)
                total -= old.size
            return entry


_CACHES: weakref.WeakKeyDictionary[RowTable[Any], ReadCache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def read_cache(table: RowTable[Any]) -> ReadCache:
    """The read cache of ``table`` in this process (created on first use)."""
    with _CACHES_LOCK:
        cache = _CACHES.get(table)
        if cache is None:
            cache = _CACHES[table] = ReadCache(table)
        return cache
