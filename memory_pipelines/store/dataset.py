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
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pyarrow as pa

from memory_pipelines.store.lance_internals import (
    append_rows,
    open_dataset,
    session_bytes,
    take_rows,
)

log = logging.getLogger(__name__)

T = TypeVar("T")


class DatasetReads:
    """Scans of one LanceDB table through its Lance dataset (see the module notes)."""

    def __init__(
        self,
        table: Any,
        latest_version: Callable[[], int],
        new_session: Callable[[], Any] | None = None,
    ):
        """``new_session``: makes the bounded pylance session the dataset keeps its
        manifests, file metadata and index pages in (None: pylance's own defaults); a
        fresh one after :meth:`release`."""
        self._table = table
        self._latest_version = latest_version
        self._new_session = new_session
        self._session: Any = None
        self._dataset: Any = None
        self._lock = threading.Lock()
        self.available = True

    def _at_latest(self) -> Any:
        version = self._latest_version()
        ds = self._dataset
        if ds is None:
            with self._lock:
                if self._dataset is None:
                    if self._session is None and self._new_session is not None:
                        self._session = self._new_session()
                    self._dataset = open_dataset(self._table, self._session)
                ds = self._dataset
        if ds.version != version:
            ds = self._dataset = ds.checkout_version(version)
        return ds

    def dataset(self) -> Any:
        """The Lance dataset at the table's latest version (``ImportError`` without
        pylance: LanceDB answers from then on)."""
        if not self.available:
            raise ImportError("pylance is not importable")
        try:
            return self._at_latest()
        except ImportError:
            self.available = False
            raise

    def release(self) -> None:
        """Drop the cached dataset and its session (the Lance caches it holds); the next
        read opens it again."""
        with self._lock:
            self._dataset = None
            self._session = None

    def cache_bytes(self) -> int:
        """What the dataset's session caches hold now, in bytes (0 before the first read)."""
        session = self._session
        return 0 if session is None else session_bytes(session)

    def plan(self, columns: Sequence[str], where: str | None) -> str | None:
        """Lance's plan of :meth:`to_table`'s read (a ``ScalarIndexQuery`` line names the
        indexes the filter reads), or None when only LanceDB can say."""
        if not self.available:
            return None
        try:
            return self._at_latest().scanner(columns=list(columns), filter=where).explain_plan()
        except Exception as e:
            log.debug("dataset plan unavailable: %s", e)
        return None

    def scan_with_row_ids(
        self, columns: Sequence[str], where: str | None
    ) -> tuple[pa.Table, int] | None:
        """The matching rows' ``columns`` and their ``_rowid`` at the latest version, with
        that version (a later :meth:`take_rows` at it finds the same rows), or None when
        only LanceDB can say."""

        def read(ds: Any) -> tuple[pa.Table, int]:
            rows = ds.to_table(columns=list(columns), filter=where, with_row_id=True)
            return rows, int(ds.version)

        return self._attempt(read, "dataset read fell back to LanceDB")

    def take_rows(
        self, version: int, row_ids: Sequence[int], columns: Sequence[str]
    ) -> pa.Table | None:
        """The ``columns`` of the rows with these ``_rowid`` values as :meth:`scan_with_row_ids`
        read them at ``version``, in the order given; None when that version cannot be read
        any more (its files cleaned up after a compaction) or only LanceDB could say."""

        def read(ds: Any) -> pa.Table:
            at = ds if ds.version == version else ds.checkout_version(version)
            return take_rows(at, list(row_ids), list(columns))

        return self._attempt(read, f"rows by row id unavailable at version {version}")

    def to_table(self, columns: Sequence[str], where: str | None) -> pa.Table | None:
        """The matching rows' ``columns`` at the latest version, or None when only LanceDB
        can say."""
        return self._attempt(
            lambda ds: ds.to_table(columns=list(columns), filter=where),
            "dataset read fell back to LanceDB",
        )

    def append(self, data: pa.Table) -> int | None:
        """Append ``data`` through the dataset (one commit) and return the version it made,
        or None when only LanceDB can write it: pylance absent, the dataset unreadable, or
        a stored schema that differs from ``data``'s (LanceDB casts). The commit's own
        error is raised as it is, for the caller's retry policy. LanceDB's ``add`` of the
        same row cost 3 ms at 100 kept versions and 6.6 ms at 1,400; this stays near
        2 ms."""
        if not self.available:
            return None
        try:
            ds = self._at_latest()
        except ImportError:
            self.available = False
            return None
        except Exception as e:
            log.debug("dataset append fell back to LanceDB: %s", e)
            return None
        if not ds.schema.equals(data.schema, check_metadata=False):
            return None
        new = append_rows(ds, data)
        with self._lock:
            if self._dataset is None or self._dataset.version < new.version:
                self._dataset = new
        return int(new.version)

    def _attempt(self, read: Callable[[Any], T], failing: str) -> T | None:
        """``read`` of the dataset at the latest version, or None when only LanceDB can
        say: pylance absent (LanceDB answers from now on) or an error (logged at debug,
        prefixed by ``failing``)."""
        if not self.available:
            return None
        try:
            return read(self._at_latest())
        except ImportError:  # pylance absent: LanceDB answers from now on
            self.available = False
        except Exception as e:
            log.debug("%s: %s", failing, e)
        return None
