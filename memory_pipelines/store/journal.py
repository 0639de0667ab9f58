"""The rows this process committed to a table, by the version each commit made.

A commit made through :class:`~memory_pipelines.store.rowtable.RowTable`'s append or
merge is recorded with the version LanceDB reports for it and the rows it wrote (vectors
included): the whole change from the version before, since an append adds exactly those
rows and a merge on ``id`` replaces the rows of those ids and adds the others. The
background compaction records its own versions as writing no row
(:func:`~memory_pipelines.store.compaction.journal_unchanged`: a rewrite keeps every row).
Deletes, whole-table compactions, restores and every other process's commits are not
recorded, so a reader that finds a version missing here knows it cannot replay the change
and reads the table again (:mod:`memory_pipelines.injection.cache`).

A table this process created (empty) also keeps every row written since its creation
while each version since is recorded here, in order, and they are few
(:data:`FROM_EMPTY_MAX_ROWS`): the table's whole content is then known without reading
it, so the first read of a scope in a home filled by this process is built from those rows
(:meth:`CommitJournal.from_empty`). The first version not recorded in order (a delete,
another process's commit, a full compaction) or one row too many ends it for good.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import pyarrow as pa

#: versions remembered (oldest first out)
MAX_VERSIONS = 512
#: a commit writing more rows than this is not recorded (a bulk load: read it again)
MAX_ROWS = 5_000
#: rows written since an empty start kept at most (a table holding more is read)
FROM_EMPTY_MAX_ROWS = 5_000


class CommitJournal:
    """Recent commits of this process: version -> the rows written."""

    def __init__(self, max_versions: int = MAX_VERSIONS, max_rows: int = MAX_ROWS):
        self.max_versions = max_versions
        self.max_rows = max_rows
        self._changes: OrderedDict[int, pa.Table] = OrderedDict()
        self._lock = threading.Lock()
        self.from_empty_max_rows = FROM_EMPTY_MAX_ROWS
        #: every row written since the table was empty (None: not known), up to version
        #: ``_from_empty_at``, holding ``_from_empty_rows`` rows
        self._from_empty: list[pa.Table] | None = None
        self._from_empty_at = -1
        self._from_empty_rows = 0

    def started_empty(self, version: int) -> None:
        """The table held no row at ``version`` (this process created it): from now on the
        rows of each version recorded in order are kept (:meth:`from_empty`)."""
        with self._lock:
            self._from_empty = []
            self._from_empty_at = int(version)
            self._from_empty_rows = 0

    def record(self, version: int | None, rows: pa.Table) -> None:
        """Remember that ``version`` replaced or added exactly ``rows`` (by id)."""
        if version is None or rows.num_rows > self.max_rows:
            with self._lock:
                self._from_empty = None
            return
        with self._lock:
            self._follow_from_empty(int(version), rows)
            self._changes[int(version)] = rows
            while len(self._changes) > self.max_versions:
                self._changes.popitem(last=False)

    def since(self, version: int, latest: int) -> list[pa.Table] | None:
        """The rows written by each version after ``version`` up to ``latest``, in order;
        None when any of those versions is not recorded (another process's commit, a
        delete, a compaction, or one forgotten)."""
        with self._lock:
            out = []
            for v in range(version + 1, latest + 1):
                rows = self._changes.get(v)
                if rows is None:
                    return None
                out.append(rows)
            return out

    def _follow_from_empty(self, version: int, rows: pa.Table) -> None:
        if self._from_empty is None:
            return
        total = self._from_empty_rows + rows.num_rows
        if version != self._from_empty_at + 1 or total > self.from_empty_max_rows:
            self._from_empty = None  # a version not seen (or too many rows): not known now
            return
        if rows.num_rows:
            self._from_empty.append(rows)
        self._from_empty_at = version
        self._from_empty_rows = total

    @property
    def follows_from_empty(self) -> bool:
        """Whether the rows written since the table was empty are still all known."""
        return self._from_empty is not None

    def from_empty(self, latest: int) -> pa.Table | None:
        """The table's rows at ``latest`` (the last row written for each id, in the order
        of those writes) when every version since the table was empty up to ``latest``
        was recorded here in order; None otherwise. An empty table without columns when
        no row was written."""
        with self._lock:
            if self._from_empty is None or self._from_empty_at != latest:
                return None
            if not self._from_empty:
                return pa.table({})
            if len(self._from_empty) > 1:  # fold them once; later calls reuse the fold
                rows = pa.concat_tables(self._from_empty)
                last = {i: k for k, i in enumerate(rows.column("id").to_pylist())}
                rows = rows.take(sorted(last.values()))
                self._from_empty = [rows]
                self._from_empty_rows = rows.num_rows
            return self._from_empty[0]

    def clear(self) -> None:
        with self._lock:
            self._changes.clear()
            self._from_empty = None
