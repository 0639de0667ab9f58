"""One LanceDB table of notes or examples: writes with conflict retries, indexes,
compaction and versions (reads: :mod:`.table_reads`; search: :mod:`.table_search`)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Generic

import numpy as np
import pyarrow as pa

from memory_pipelines.config import TableTuning
from memory_pipelines.errors import HomeError, StoreError, ValidationError
from memory_pipelines.retries import STORE_COMMIT_CONFLICT, STORE_VERSION_LISTING_RACE
from memory_pipelines.store.compaction import Compactor, compact_tail, erase_old_versions_of
from memory_pipelines.store.dataset import DatasetReads
from memory_pipelines.store.filters import Cond, in_
from memory_pipelines.store.idlookup import IdLookup
from memory_pipelines.store.journal import CommitJournal
from memory_pipelines.store.lance_internals import dataset_session
from memory_pipelines.store.schema import M, table_schema, to_row
from memory_pipelines.store.table_reads import TableReads
from memory_pipelines.store.table_search import TableSearch
from memory_pipelines.store.versions import LatestVersion

log = logging.getLogger(__name__)



#: single writes of one process between two automatic compactions of a table
COMPACT_EVERY = 32


#: an automatic compaction keeps the newest this many versions, and every version younger
#: than :data:`MIN_CLEANUP_AGE` (a query holds its version for milliseconds to seconds,
#: and nothing reads an older version by number; the daily maintenance keeps its own,
#: longer age): every commit and cleanup reads each version kept, so at a fast trickle
#: (100 adds/s) a 30 s age alone held ~1,300 versions and single adds slowed 3.7x
AUTO_KEEP_VERSIONS = 100
#: with ``auto_keep_versions`` 0, versions younger than this are kept instead
AUTO_CLEANUP_OLDER_THAN = timedelta(seconds=30)
#: the youngest version an automatic compaction may drop (by default: a table's
#: ``tuning.min_cleanup_age``)
MIN_CLEANUP_AGE = TableTuning.min_cleanup_age


#: rows from which a table gets a BTree index on ``id`` (below it a scan is as cheap; by
#: default: a table's ``tuning.id_index_min_rows``)
ID_INDEX_MIN_ROWS = TableTuning.id_index_min_rows


class RowTable(TableReads[M], TableSearch[M], Generic[M]):
    """One LanceDB table of ``Note`` or ``Example`` rows plus their vectors: writes,
    compaction, indexes and versions here; reads in :class:`.TableReads`, search in
    :class:`.TableSearch`."""

    def __init__(
        self,
        db: Any,
        name: str,
        model: type[M],
        dim: int,
        text_column: str,
        create: bool = True,
        tuning: TableTuning | None = None,
    ):
        self.name = name
        #: when it gets its indexes and how its background compaction runs
        self.tuning = TableTuning() if tuning is None else tuning
        self.model = model
        self.dim = dim
        self.text_column = text_column
        self.schema = table_schema(model, dim)
        #: how stale LanceDB's handle may be (``timedelta(0)``: it sees every commit)
        self._db_interval = getattr(db, "read_consistency_interval", None)
        self._lock = threading.RLock()
        created_at: int | None = None  # the version this process created it (empty) at
        try:
            self._t = db.open_table(name)
        except Exception:
            if not create:
                raise HomeError(f"table {name!r} does not exist") from None
            try:
                self._t = db.create_table(name, schema=self.schema)
                # a new table's first version is its creation; a later one may hold
                # another process's rows already
                created_at = 1 if int(self._t.version) == 1 else None
            except Exception:  # another process created it first
                self._t = db.open_table(name)
        stored = self._t.schema.field("vector").type
        if getattr(stored, "list_size", dim) != dim:
            raise StoreError(
                f"table {name!r} holds {stored.list_size}-d vectors but the embedder gives {dim}-d;"
                " use another home or re-embed"
            )
        self._fts_ready = False
        self.compact_every = COMPACT_EVERY
        self.auto_cleanup_older_than = AUTO_CLEANUP_OLDER_THAN
        self.auto_keep_versions = AUTO_KEEP_VERSIONS
        #: columns that get a Bitmap index at every compaction once the table holds
        #: ``tuning.id_index_min_rows`` rows (filtered scans, such as the write path's candidate
        #: fetch, then read the index instead of every row)
        self.scalar_columns: tuple[str, ...] = ()
        self._writes_since_compact = 0
        #: a callable returning a context manager that says (True/False) whether the
        #: background compaction may drop old versions now, and keeps it so for its block
        #: (the service's: while no Memory Manager run, which may still commit what those
        #: versions hold, has the home); None: always
        self.cleanup_guard: Any = None
        self._compactor = Compactor(self)
        #: caches other layers keep for this table in this process (the injection read
        #: cache), dropped by :meth:`close`
        self.caches: dict[str, Any] = {}
        #: this process's appends and merges by the version each made
        self.journal = CommitJournal()
        if created_at is not None:
            self.journal.started_empty(created_at)
        self.compaction_listeners = self._compactor.listeners
        self._reads = DatasetReads(self._t, self.latest_version, self._dataset_session)
        #: the ids of the fragments outside the id index, read once each (``existing_ids``)
        self.id_lookup = IdLookup(self._reads.dataset, self.journal)

    # -- writes ---------------------------------------------------------------

    def _retry(self, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, again on a commit conflict (:data:`STORE_COMMIT_CONFLICT`);
        any other error, or a conflict that outlasts the policy, is a ``StoreError``."""
        try:
            return STORE_COMMIT_CONFLICT.call(fn, *args, **kwargs)
        except Exception as e:  # LanceDB raises plain exceptions
            raise StoreError(f"{self.name}: write failed: {e}") from e

    def upsert(self, items: Sequence[M], vectors: np.ndarray) -> None:
        """Insert or replace rows by id (``merge_insert``); one vector per row."""
        if not items:
            return
        self._merge(self._checked(items, vectors))

    def _merge(self, data: pa.Table) -> None:
        """``merge_insert`` on ``id``: with the BTree index on ``id`` it reads the index and
        the fragments written since, not the table; the primary-key metadata makes two
        writers inserting one new id conflict, so one of them updates."""
        with self._lock:
            result = self._retry(
                lambda: self._t.merge_insert("id")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute(data)
            )
            self.journal.record(getattr(result, "version", None), data)
        self._wrote()

    def _checked(self, items: Sequence[M], vectors: np.ndarray) -> pa.Table:
        vecs = np.asarray(vectors, dtype=np.float32)
        if vecs.shape != (len(items), self.dim):
            raise StoreError(
                f"{self.name}: expected vectors of shape {(len(items), self.dim)}, got {vecs.shape}"
            )
        if not np.isfinite(vecs).all():
            row = int(np.flatnonzero(~np.isfinite(vecs).all(axis=1))[0])
            raise StoreError(f"{self.name}: the vector of row {row} holds NaN or infinity")
        ids = [i.id for i in items]
        if len(set(ids)) != len(ids):
            raise StoreError(f"{self.name}: duplicate ids in one write")
        return pa.Table.from_pylist(
            [to_row(i, v) for i, v in zip(items, vecs, strict=True)], schema=self.schema
        )

    def put(self, items: Sequence[M], vectors: np.ndarray) -> None:
        """Insert or replace rows by id without reading the table: a batch of new ids is
        one append, a batch holding a stored id one ``merge_insert`` through the id index.

        Which ids are stored is read at the latest version; two writers creating the
        same new id at the same moment would both append it, so callers make that
        impossible or decide it afterwards (``Notebook.appending``: the write ledger's
        claim decides an in-flight write and the loser collapses its copy; ``add_note``
        without an id gets a fresh uuid) or call :meth:`upsert`, whose commit conflict
        decides.
        """
        if not items:
            return
        data = self._checked(items, vectors)
        if self.existing_ids([i.id for i in items]):
            self._merge(data)
        else:
            self._append(data)

    def existing_ids(self, ids: Sequence[str]) -> set[str]:
        """The ids among ``ids`` that the table holds at its latest version: the id index
        for the fragments it covers, each other fragment's ids read once
        (:class:`~memory_pipelines.store.idlookup.IdLookup`), so the cost follows the ids
        asked and the fragments written since, not the rows outside the index."""
        if not ids:
            return set()
        wanted = list(dict.fromkeys(ids))
        found = self.id_lookup.existing(wanted)
        if found is not None:
            return found
        return set(self._arrow(in_("id", wanted), ["id"]).column("id").to_pylist())

    def add(self, items: Sequence[M], vectors: np.ndarray) -> None:
        """Append rows whose ids no row holds (fresh uuids, bulk loads into a new table):
        one append, without reading the table."""
        if not items:
            return
        self._append(self._checked(items, vectors))

    def _append(self, data: pa.Table) -> None:
        with self._lock:
            version = self._retry(self._append_once, data)
            self.journal.record(version, data)
        self._wrote()

    def _append_once(self, data: pa.Table) -> int | None:
        """One append, through the Lance dataset where it can (its commit does not slow
        down with the versions kept, LanceDB's ``add`` does), else LanceDB; the version
        made (None: unknown)."""
        version = self._reads.append(data)
        if version is None:
            return getattr(self._t.add(data), "version", None)
        if self._db_interval != timedelta(0):  # LanceDB's handle would not see it
            self._refresh()
        return version

    def delete(self, where: Cond) -> None:
        with self._lock:
            self._retry(self._t.delete, where.sql)
        self._wrote()

    def _wrote(self) -> None:
        """Count a commit; every ``compact_every`` of them wake the compactor."""
        if self.compact_every <= 0:
            return
        self._writes_since_compact += 1
        if self._writes_since_compact >= self.compact_every:
            self._writes_since_compact = 0
            self._compactor.request()

    def compact_small_fragments(self, cleanup: bool = True) -> dict:
        """What the compactor runs (:func:`compact_tail`; safe beside writers of this and
        other processes), creating the id and ``scalar_columns`` indexes once the table is
        large enough. ``cleanup`` drops every version but the newest
        ``auto_keep_versions`` and those younger than ``tuning.min_cleanup_age``
        (:meth:`version_bound`); with ``auto_keep_versions`` 0, the versions older than
        ``auto_cleanup_older_than``."""
        bound = self.version_bound() if cleanup else None
        if bound is not None:
            return self.compact(None, tail=True, retain=bound)
        return self.compact(self.auto_cleanup_older_than if cleanup else None, tail=True)

    def version_bound(self) -> tuple[timedelta, int] | None:
        """The automatic cleanup's rule: (age, n), versions older than ``age`` beyond the
        newest ``n`` go; None when ``auto_keep_versions`` is 0 (then the time rule of
        ``auto_cleanup_older_than`` alone). Lance applies it as it reads the versions for
        the cleanup (finding the n-th newest version's age first read every manifest
        once more: 60 ms at 500 versions, in every compaction). At a slow trickle it
        keeps up to n versions older than ``auto_cleanup_older_than``: a few manifests
        and the small files they hold."""
        if self.auto_keep_versions <= 0:
            return None
        return self.tuning.min_cleanup_age, self.auto_keep_versions

    def compact(
        self,
        cleanup_older_than: timedelta | None,
        scalar_columns: Sequence[str] = (),
        tail: bool = False,
        retain: tuple[timedelta, int] | None = None,
    ) -> dict:
        """Compact the table and refresh its indexes; returns what it did. ``tail``: only
        the small fragments at the table's tail (:func:`compact_tail`, what the
        background compaction runs), not every fragment and index; ``retain``: with
        ``tail``, the count rule of :meth:`version_bound` too."""
        started = time.perf_counter()
        with self._compactor.lock:
            before = self.stats()
            report = self._optimize(cleanup_older_than, tail=tail, retain=retain)
            if before["rows"] >= self.tuning.id_index_min_rows:  # then index the merged rows
                self.ensure_id_index()
                scalar_columns = (*scalar_columns, *self.scalar_columns)
            if scalar_columns:
                self.ensure_scalar_indexes(tuple(dict.fromkeys(scalar_columns)))
            after = self.stats()
        return {
            "version_before": report["version_before"],
            "version_after": self.version,
            "fragments_before": before["fragments"],
            "fragments_after": after["fragments"],
            "rows": after["rows"],
            "seconds": round(time.perf_counter() - started, 4),
        }

    def stats(self) -> dict[str, int]:
        """Rows and data fragments of the latest version, from its manifest (LanceDB's
        ``stats`` took 7 ms of its runtime in every background compaction; it answers
        where the dataset cannot)."""
        try:
            ds = self._reads.dataset()
            return {"rows": int(ds.count_rows()), "fragments": len(ds.get_fragments())}
        except Exception as e:
            log.debug("%s: stats through LanceDB: %s", self.name, e)
        self._refresh()
        st = self._t.stats()
        frags = st.get("fragment_stats", {}) if isinstance(st, dict) else {}
        return {
            "rows": int(st.get("num_rows", 0)) if isinstance(st, dict) else self._t.count_rows(),
            "fragments": int(frags.get("num_fragments", 0)),
        }

    def indexed_columns(self) -> set[tuple[str, ...]]:
        """The columns of each index of the latest version, from its manifest (LanceDB's
        ``list_indices``, which answers where the dataset cannot, took 5-12 ms)."""
        try:
            return {tuple(i.get("fields") or ()) for i in self._reads.dataset().list_indices()}
        except Exception as e:
            log.debug("%s: indexes through LanceDB: %s", self.name, e)
        return {tuple(getattr(i, "columns", [])) for i in self._t.list_indices()}

    def ensure_id_index(self) -> bool:
        """A BTree index on ``id`` (by-id lookups and merges read it, not the table)."""
        from lancedb.index import BTree

        with self._lock:
            if ("id",) in self.indexed_columns():
                return True
            if self.stats()["rows"] == 0:
                return False
            try:
                self._t.create_index("id", config=BTree())
            except Exception as e:  # another process created it first
                if ("id",) not in self.indexed_columns():
                    raise StoreError(f"{self.name}: could not index id: {e}") from e
        return True

    def _dataset_session(self) -> Any:
        """A pylance session bounded by the table's tuning, for its dataset reads."""
        return dataset_session(self.tuning.metadata_cache_bytes, self.tuning.index_cache_bytes)

    def dataset_cache_bytes(self) -> int:
        """What the table's dataset reads keep cached now (manifests, file metadata, index
        pages), in bytes: at most the tuning's ``metadata_cache_bytes`` plus
        ``index_cache_bytes``."""
        return self._reads.cache_bytes()

    def close(self, timeout: float = 60.0) -> None:
        """Release what the table holds beyond its handle: the compactor's thread ends (a
        running compaction first finishes), its listeners and the cached Lance dataset
        are dropped. A write afterwards still works and starts the compactor again."""
        self._compactor.close(timeout)
        self._compactor.listeners.clear()
        self.caches.clear()
        self._reads.release()
        self.id_lookup.clear()

    def wait_for_compaction(self, timeout: float = 60.0) -> bool:
        """Block until a requested background compaction has finished (tests, benches)."""
        return self._compactor.wait(timeout)

    # -- maintenance ------------------------------------------------------------

    def erase_old_versions(self) -> int:
        """Materialise deletions, rebuild the FTS index and drop every older version and
        file, so deleted rows cannot be read back (purge); returns versions removed."""
        return erase_old_versions_of(self)

    @property
    def lance(self) -> Any:
        """The underlying LanceDB table (indices, versions, cleanup: what purge and
        compaction manage directly)."""
        return self._t

    @property
    def version(self) -> int:
        self._refresh()
        return int(self._t.version)

    def latest_version(self) -> int:
        """The latest committed version, without checking it out: on a local disk the
        names of the manifests tell it (:class:`~.versions.LatestVersion`: a few ``stat``
        calls, against about a millisecond for :attr:`version`); elsewhere it is
        :attr:`version`."""
        probe = self.__dict__.get("_version_probe", "")
        if probe == "":
            uri = str(getattr(self._t, "uri", "") or "")
            local = uri.removeprefix("file://") if "://" not in uri.removeprefix("file://") else ""
            probe = LatestVersion(os.path.join(local, "_versions")) if local else None
            self.__dict__["_version_probe"] = probe
        found = probe.get() if probe is not None else None
        return found if found is not None else self.version

    def settled_version(self) -> int:
        """:meth:`latest_version` once no commit of this process is between its commit
        and its journal record (waits for one in flight, such as the background
        compaction's)."""
        with self._lock:
            return self.latest_version()

    def changes_since(self, version: int, latest: int) -> tuple[int, list[pa.Table] | None]:
        """(``latest``, this process's commits from ``version`` to it, as the journal
        records them, or None when it does not hold them all). When ``latest`` was listed
        between a commit of this process and its record (the background compaction's, say),
        the answer is at :meth:`settled_version` instead, once the record is in."""
        changes = self.journal.since(version, latest)
        if changes is None:
            latest = self.settled_version()
            changes = self.journal.since(version, latest)
        return latest, changes

    def rows_from_empty(self, latest: int) -> tuple[int, pa.Table | None]:
        """(``latest``, the table's rows at it from the journal, or None when it does not
        know them all), settled as :meth:`changes_since` is."""
        rows = self.journal.from_empty(latest)
        if rows is None and self.journal.follows_from_empty:
            latest = self.settled_version()
            rows = self.journal.from_empty(latest)
        return latest, rows

    def ensure_scalar_indexes(self, columns: Sequence[str] = ("agent_id", "status")) -> None:
        from lancedb.index import Bitmap

        existing = {c for fields in self.indexed_columns() for c in fields}
        missing = [c for c in columns if c not in existing]
        with self._lock:
            if missing and self.stats()["rows"] > 0:
                for c in missing:
                    self._retry(self._t.create_index, c, config=Bitmap())

    def ensure_vector_index(
        self, min_rows: int = 50_000, index_type: str = "ivf_hnsw_sq", replace: bool = False
    ) -> bool:
        """Build an approximate cosine index on ``vector`` once the table holds ``min_rows``.

        ``index_type``: ``ivf_hnsw_sq`` (default; best recall and latency under scope
        prefilters, slowest build), ``ivf_flat`` or ``ivf_pq``. Run it from maintenance,
        never on the hot path; rows added later are still searched (flat) until the next
        build. Returns True when a vector index exists afterwards.
        """
        from lancedb.index import HnswSq, IvfFlat, IvfPq

        configs = {"ivf_hnsw_sq": HnswSq, "ivf_flat": IvfFlat, "ivf_pq": IvfPq}
        if index_type not in configs:
            raise ValidationError(f"unknown vector index type {index_type!r}")
        with self._lock:
            exists = any("vector" in getattr(i, "columns", []) for i in self._t.list_indices())
            if exists and not replace:
                return True
            if self._t.count_rows() < max(1, min_rows):
                return exists
            self._retry(
                self._t.create_index,
                "vector",
                config=configs[index_type](distance_type="cosine"),
                replace=True,
            )
        return True

    def optimize(
        self,
        cleanup_older_than: timedelta | None = timedelta(hours=1),
        delete_unverified: bool = False,
    ) -> dict:
        """Compact small files, refresh indexes and drop versions older than the age given.

        ``delete_unverified`` also removes files no version references yet: only safe
        when no other process writes to the table (a concurrent writer's uncommitted data
        file would be deleted and its commit would then point at a missing file).
        """
        with self._compactor.lock, self._lock:
            return self._optimize(cleanup_older_than, delete_unverified)

    def _optimize(
        self,
        cleanup_older_than: timedelta | None,
        delete_unverified: bool = False,
        tail: bool = False,
        retain: tuple[timedelta, int] | None = None,
    ) -> dict:
        before = self.version
        try:
            if not (tail and compact_tail(self, cleanup_older_than, retain)):
                kwargs = {} if cleanup_older_than is None else {
                    "cleanup_older_than": cleanup_older_than, "delete_unverified": delete_unverified
                }
                self._t.optimize(**kwargs)
        except Exception as e:
            raise StoreError(f"{self.name}: optimize failed: {e}") from e
        return {"version_before": before, "version_after": self.version}

    def list_versions(self) -> list[int]:
        """The table's version numbers. A compaction (this process's or another's) may
        delete an old manifest between LanceDB's listing and its read of it, which fails
        with "Not found"; the listing is then taken again
        (:data:`STORE_VERSION_LISTING_RACE`)."""
        try:
            versions = STORE_VERSION_LISTING_RACE.call(self._t.list_versions)
        except Exception as e:
            raise StoreError(f"{self.name}: listing versions failed: {e}") from e
        return [int(v["version"]) for v in versions]


