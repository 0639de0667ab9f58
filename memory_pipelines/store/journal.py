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
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import pyarrow as pa

#: versions remembered (oldest first out)
MAX_VERSIONS = 512
#: a commit writing more rows than this is not recorded (a bulk load: read it again)
MAX_ROWS = 5_000


class CommitJournal:
    """Recent commits of this process: version -> the rows written."""

    def __init__(self, max_versions: int = MAX_VERSIONS, max_rows: int = MAX_ROWS):
        self.max_versions = max_versions
        self.max_rows = max_rows
        self._changes: OrderedDict[int, pa.Table] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, version: int | None, rows: pa.Table) -> None:
        """Remember that ``version`` replaced or added exactly ``rows`` (by id)."""
        if version is None or rows.num_rows > self.max_rows:
            return
        with self._lock:
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

    def clear(self) -> None:
        with self._lock:
            self._changes.clear()
