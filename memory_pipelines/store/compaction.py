"""Keeping tables small: the background compactor and the rewrites purge relies on."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

from memory_pipelines.errors import StoreError

log = logging.getLogger(__name__)



#: how much less CPU priority background threads take (Linux ``nice`` steps)
BACKGROUND_NICENESS = 10


def background_priority() -> bool:
    """Lower the calling thread's CPU priority (Linux, where a thread has its own nice
    value): the compactor and the HTTP writer then yield the cores to request threads
    when both want them, and take them when they are idle. False where it is not
    possible (another platform, or no permission)."""
    setpriority = getattr(os, "setpriority", None)
    if setpriority is None or not sys.platform.startswith("linux"):
        return False
    try:
        tid = threading.get_native_id()
        setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICENESS))
        return True
    except OSError:
        return False


#: attempts of one background compaction that meets concurrent commits
CONFLICT_ATTEMPTS = 3


class Compactor:
    """Compacts one table in a background thread when its writer asks.

    A trickle of single writes leaves one small fragment per write, and every read and
    merge pays for each fragment until compaction; this keeps their number bounded
    without making a writer wait for the compaction (it costs more than a write). One
    daemon thread per table, started on the first request; requests that arrive while it
    runs fold into one more run. ``lock`` serialises compactions with the maintenance and
    erasure paths of this process (erasure deletes unreferenced files, which would include
    a compaction's files before its commit). A failed compaction is logged and left for
    the next request: it never changes a row.
    """

    def __init__(self, table: Any):
        self.table = table
        self.lock = threading.Lock()
        self._wake = threading.Condition()
        self._pending = False
        self._running = False
        self._thread: threading.Thread | None = None
        self.runs = 0
        self.failures = 0
        self.conflicts = 0  # compactions tried again after a concurrent commit
        #: called in the compactor's thread after each compaction (the read cache reads
        #: its recently used scopes again at the new version, off the request path)
        self.listeners: list[Any] = []

    def request(self) -> None:
        with self._wake:
            self._pending = True
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._loop, name=f"compact-{self.table.name}", daemon=True
                )
                self._thread.start()
            self._wake.notify_all()

    def _loop(self) -> None:
        background_priority()
        while True:
            with self._wake:
                while not self._pending:
                    if not self._wake.wait(timeout=30.0):
                        self._thread = None  # idle: end the thread; a request starts another
                        return
                self._pending = False
                self._running = True
            try:
                self._compact()
                self.runs += 1
                for listener in list(self.listeners):
                    listener()
            except Exception as e:  # logged and retried on the next request
                self.failures += 1
                log.warning("background compaction of %s failed: %s", self.table.name, e)
            finally:
                with self._wake:
                    self._running = False
                    self._wake.notify_all()

    def _compact(self) -> None:
        """One compaction; a commit conflict with a concurrent write (an update commits
        while the rewrite runs, and Lance rejects the rewrite) is tried again at once, up
        to :data:`CONFLICT_ATTEMPTS` times, rather than left for the next request."""
        for attempt in range(CONFLICT_ATTEMPTS):
            try:
                self.table.compact_small_fragments()
                return
            except StoreError as e:
                text = str(e).lower()
                if attempt + 1 == CONFLICT_ATTEMPTS or not ("conflict" in text or "retry" in text):
                    raise
                self.conflicts += 1
                log.debug("compaction of %s met a concurrent commit; again", self.table.name)
                time.sleep(0.05 * (attempt + 1))

    def wait(self, timeout: float = 60.0) -> bool:
        """True once no compaction is pending or running."""
        deadline = time.monotonic() + timeout
        with self._wake:
            while self._pending or self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(timeout=left)
        return True


def _rebuild_fts(table: Any) -> None:
    """Drop and recreate the full-text index so no posting list keeps a deleted token."""
    t = table.lance
    for idx in list(t.list_indices()):
        if table.text_column in list(getattr(idx, "columns", [])) and "FTS" in str(
            getattr(idx, "index_type", "")
        ).upper():
            t.drop_index(idx.name)
            table._fts_ready = False
    if t.count_rows() > 0:
        table.ensure_fts()


def _table_dir(table: Any) -> Path | None:
    uri = str(getattr(table.lance, "uri", "") or "")
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    path = Path(uri) if uri and "://" not in uri else None
    return path if path is not None and path.is_dir() else None


def _has_deletion_files(table: Any) -> bool:
    """True when a fragment of a local table still hides deleted rows behind a deletion
    file (compaction left it: too few deletions), so its data file still holds them."""
    folder = _table_dir(table)
    if folder is None:
        return False
    deletions = folder / "_deletions"
    return deletions.is_dir() and any(deletions.iterdir())


def _rewrite(table: Any) -> None:
    """Rewrite the live rows into fresh data files, drop the old version and rebuild the
    indexes (the fallback when compaction did not materialise every deletion)."""
    t = table.lance
    data = t.to_arrow()
    indexed = [list(getattr(i, "columns", [])) for i in t.list_indices()]
    t.add(data, mode="overwrite")
    t.optimize(cleanup_older_than=timedelta(0), delete_unverified=True)
    t.checkout_latest()
    table._fts_ready = False
    if t.count_rows() > 0:
        table.ensure_fts()
        scalar = [c[0] for c in indexed if c and c[0] != table.text_column and c[0] != "vector"]
        table.ensure_scalar_indexes(scalar)


def erase_old_versions_of(table: Any) -> int:
    """Materialise deletions, rebuild the FTS index and drop every older version/file."""
    t = table.lance
    table.wait_for_compaction()
    with table._compactor.lock, table._lock, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*cleanup_older_than.*")
        before = len(t.list_versions())
        try:
            t.optimize()
            t.checkout_latest()
            _rebuild_fts(table)
            t.optimize(cleanup_older_than=timedelta(0), delete_unverified=True)
            t.checkout_latest()
            if _has_deletion_files(table):
                _rewrite(table)
        except Exception as e:  # LanceDB raises plain exceptions
            raise StoreError(f"{table.name}: could not erase old versions: {e}") from e
        return max(0, before - len(t.list_versions()))
