"""Keeping tables small: the background compactor and the rewrites purge relies on."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
import warnings
import weakref
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

from memory_pipelines.config import TableTuning
from memory_pipelines.errors import StoreError
from memory_pipelines.retries import COMPACTION_CONFLICT
from memory_pipelines.store import lance_internals

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


#: the background compaction drops old versions at most this often (reading every kept
#: manifest, it cost more than the merge itself at a fast trickle, and versions younger
#: than the minimum age of 5 s stay anyway); by default: a table's
#: ``tuning.cleanup_every_s``
CLEANUP_EVERY_S = TableTuning.cleanup_every_s


#: every compactor of this process, and whether the interpreter is shutting down
_COMPACTORS: weakref.WeakSet[Compactor] = weakref.WeakSet()
_EXITING = threading.Event()


@atexit.register
def _finish_at_exit(timeout: float = 60.0) -> None:
    """Let a running compaction finish before the interpreter goes, and start no other:
    Lance aborts the process when shutdown cuts a compaction off in its daemon thread."""
    _EXITING.set()
    deadline = time.monotonic() + timeout
    for compactor in list(_COMPACTORS):
        compactor.wait_running(max(0.0, deadline - time.monotonic()))


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
        #: compactions that lost every attempt to concurrent commits (not failures: the
        #: writes that won ask for the next one)
        self.preempted = 0
        self.conflicts = 0  # compactions tried again after a concurrent commit
        self._cleaned_at = float("-inf")  # time.monotonic() of the last version cleanup
        #: called in the compactor's thread after each compaction (the read cache reads
        #: its recently used scopes again at the new version, off the request path)
        self.listeners: list[Any] = []
        self._closed = False
        _COMPACTORS.add(self)

    def request(self) -> None:
        with self._wake:
            self._closed = False  # a table written after close() compacts again
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
                    if self._closed or not self._wake.wait(timeout=30.0):
                        self._thread = None  # idle: end the thread; a request starts another
                        return
                self._pending = False
                if _EXITING.is_set() or self._closed:
                    self._thread = None
                    self._wake.notify_all()
                    return
                self._running = True
            try:
                self._compact()
                self.runs += 1
                for listener in list(self.listeners):
                    listener()
            except Exception as e:  # logged and retried on the next request
                if COMPACTION_CONFLICT.retry_if(e):  # concurrent writes won every attempt
                    self.preempted += 1
                    log.info("compaction of %s gave way to concurrent writes: %s", self.table.name, e)
                else:
                    self.failures += 1
                    log.warning("background compaction of %s failed: %s", self.table.name, e)
            finally:
                with self._wake:
                    self._running = False
                    self._wake.notify_all()

    def _compact(self) -> None:
        """One compaction; a commit conflict with a concurrent write (an update commits
        while the rewrite runs, and Lance rejects the rewrite) is tried again at once, up
        to three times (:data:`~memory_pipelines.retries.COMPACTION_CONFLICT`), rather
        than left for the next request. Old versions are dropped only when the table's ``cleanup_guard`` allows it (the
        service's: no Memory Manager run holds the home); otherwise the next one does."""
        cleanup = time.monotonic() - self._cleaned_at >= self.table.tuning.cleanup_every_s
        guard = getattr(self.table, "cleanup_guard", None)
        with guard() if cleanup and guard is not None else nullcontext(cleanup) as allowed:
            self._compact_attempts(bool(allowed))

    def _compact_attempts(self, cleanup: bool) -> None:
        COMPACTION_CONFLICT.call(
            self.table.compact_small_fragments, cleanup=cleanup, before_sleep=self._conflicted
        )
        if cleanup:
            self._cleaned_at = time.monotonic()

    def _conflicted(self, attempt: int, error: BaseException, wait: float) -> None:
        self.conflicts += 1
        log.debug("compaction of %s met a concurrent commit; again", self.table.name)

    def close(self, timeout: float = 60.0) -> bool:
        """Stop the thread: a running compaction finishes, a pending one is dropped (the
        next writer or the maintenance run compacts), and the idle thread ends now rather
        than after its 30 s wait, releasing the table it holds. True once it has ended."""
        with self._wake:
            self._closed = True
            self._pending = False
            thread = self._thread
            self._wake.notify_all()
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def wait_running(self, timeout: float) -> bool:
        """True once no compaction is running (a pending one may still start)."""
        with self._wake:
            return self._wake.wait_for(lambda: not self._running, timeout)

    def wait(self, timeout: float = 60.0) -> bool:
        """True once no compaction is pending or running."""
        with self._wake:
            return self._wake.wait_for(lambda: not (self._pending or self._running), timeout)


#: the background compaction merges small fragments into fragments of at most this many
#: rows and leaves larger ones alone, so it rewrites the table's tail, not the table
#: (LanceDB's ``optimize`` takes every fragment under a million rows: it rewrote a
#: 100k-row table, 154 MB, to merge 32 one-row appends); within the tail it merges
#: like a binary counter (see :func:`_settled`)
TAIL_FRAGMENT_ROWS = TableTuning.tail_fragment_rows
#: ... and folds the rows outside the indexes into them (a rewrite of each index, so
#: its cost grows with the table) once this many rows, and this share of the table,
#: are outside; until then filters scan those rows, as they do any row written since
INDEX_LAG_ROWS = TableTuning.index_lag_rows
INDEX_LAG_SHARE = TableTuning.index_lag_share
#: (each by default: a table's ``tuning`` holds the ones it uses)


def _index_coverage(ds: Any) -> tuple[dict[int, int], set[int], set[int]]:
    """Rows per fragment, the fragments every index covers and those some index covers
    (all from the manifest: no data is read)."""
    fragments = {f.fragment_id: f.metadata.num_rows for f in ds.get_fragments()}
    covered = [set(idx.get("fragment_ids") or ()) for idx in ds.list_indices()]
    every = set(fragments).intersection(*covered) if covered else set(fragments)
    some = set().union(*covered) & set(fragments) if covered else set()
    return fragments, every, some


def _rows_outside_indexes(ds: Any) -> tuple[int, int]:
    """Rows in fragments that some index does not cover, and all rows."""
    fragments, every, _ = _index_coverage(ds)
    return sum(n for fid, n in fragments.items() if fid not in every), sum(fragments.values())


def _settled(ds: Any, tail_rows: int = TAIL_FRAGMENT_ROWS) -> list[int]:
    """The fragments a tail compaction leaves alone, merging the tail like a binary
    counter. The tail is the run of newest fragments that no index covers and that hold
    fewer than ``tail_rows`` rows; the merge takes its newest fragments back
    to the oldest one holding no more rows than all fragments newer than it together.
    Every tail fragment left then holds more rows than all newer ones together, so the
    tail has at most log2(rows) + 1 fragments, and a row is rewritten at most log2(tail)
    times (each rewrite at least doubles its fragment), where merging the whole tail
    every time rewrote a 2,048-row fragment to add 32 rows. Fragments outside the merge
    are left alone unless they have deleted rows (their rewrite drops them)."""
    _, _, indexed = _index_coverage(ds)
    fragments = ds.get_fragments()
    tail = len(fragments)  # fragments[tail:] is the tail
    while tail and fragments[tail - 1].fragment_id not in indexed:
        if fragments[tail - 1].metadata.num_rows >= tail_rows:
            break
        tail -= 1
    newer, start = 0, len(fragments)
    for i in range(len(fragments) - 1, tail - 1, -1):
        rows = fragments[i].metadata.num_rows
        if rows <= newer:
            start = i
        newer += rows
    return sorted(
        f.fragment_id
        for f in fragments[:start]
        if f.fragment_id in indexed or not lance_internals.has_deletion_file(f)
    )


def compact_tail(
    table: Any, cleanup_older_than: timedelta | None, retain: tuple[timedelta, int] | None = None
) -> bool:
    """The background compaction: merge the small fragments at the table's tail (those
    under ``table.tuning.tail_fragment_rows`` rows that no index covers yet, merged like a
    binary counter: :func:`_settled`), fold the rows outside the indexes into them once
    they pass ``tuning.index_lag_rows`` and ``tuning.index_lag_share``, and drop versions
    older than ``cleanup_older_than`` (None: none) and, with ``retain`` (age, n), those
    older than age beyond the newest n. Its cost follows the rows written since the
    previous one, not the table's size: a fragment an index covers is never rewritten
    here, since that would rewrite the index too. False when pylance is not importable
    (the caller then runs LanceDB's whole-table ``optimize``).

    The fragments are rewritten beside this process's writers; only the commits hold the
    table's write lock. Without it a trickle of appends kept rejecting the compaction's
    commit (measured: 14 s, until the appends stopped)."""
    Compaction = lance_internals.compaction()
    if Compaction is None:
        return False
    tuning = table.tuning
    ds = table.lance.to_lance()
    options = {
        "target_rows_per_fragment": tuning.tail_fragment_rows,
        "excluded_fragment_ids": _settled(ds, tuning.tail_fragment_rows),
    }
    plan = Compaction.plan(ds, options)
    if plan.num_tasks():
        rewrites = [task.execute(ds) for task in plan.tasks]
        with table._lock:
            ds = table.lance.to_lance()
            before = ds.version
            try:
                Compaction.commit(ds, rewrites, options)
            except Exception as e:
                if "conflict" in str(e).lower():  # rejected before any manifest was written
                    _remove_rewritten(table, rewrites)
                raise
            journal_unchanged(table, before)
    with table._lock:
        ds = table.lance.to_lance()
        outside, rows = _rows_outside_indexes(ds)
        if outside and outside >= max(tuning.index_lag_rows, tuning.index_lag_share * rows):
            before = ds.version
            ds.optimize.optimize_indices()
            journal_unchanged(table, before)
    # a tagged version is kept, as LanceDB's optimize keeps it, not an error
    if cleanup_older_than is not None:
        ds.cleanup_old_versions(older_than=cleanup_older_than, error_if_tagged_old_versions=False)
    if retain is not None:
        age, newest = retain
        ds.cleanup_old_versions(
            older_than=age, retain_versions=newest, error_if_tagged_old_versions=False
        )
    return True


def journal_unchanged(table: Any, before: int) -> int:
    """Record in the table's commit journal, as writing no row, the versions after
    ``before`` that left the rows as they were: a compaction's ``Rewrite`` (the same rows
    in new files) and any version whose fragments and schema equal the one before it (the
    fragment-id reservation a compaction commits first, an index update). It stops at
    the first version that may have changed a row (another process's write, say), so the
    journal never covers one. The read cache then brings its entries past a compaction
    without reading the scopes again; they were read again, all at once, by the
    injections that followed each compaction. Returns how many it recorded. Call it with
    the table's write lock held: a commit of this process in between would not be
    covered either (an append changes the layout), but would end the record there."""
    ds = table.lance.to_lance()
    empty = ds.schema.empty_table()
    recorded = 0
    for version in range(before + 1, ds.version + 1):
        if not _rows_unchanged(ds, version):
            break
        table.journal.record(version, empty)
        recorded += 1
    return recorded


def _rows_unchanged(ds: Any, version: int) -> bool:
    """Whether ``version`` left the rows of the version before it as they were."""
    try:
        if lance_internals.is_rewrite(ds, version):
            return True
        old, new = ds.checkout_version(version - 1), ds.checkout_version(version)
        return old.schema == new.schema and _layout(old) == _layout(new)
    except Exception as e:  # a version already cleaned up, say: the cache reads again
        log.debug("could not compare table version %s with the one before: %s", version, e)
        return False


def _layout(ds: Any) -> list[tuple[Any, ...]]:
    """Every fragment's metadata (id, data and overlay files, deletion file, row counts):
    equal layouts hold equal rows (data files never change; a delete writes a new
    deletion file)."""
    return lance_internals.fragment_layout(ds)


def _remove_rewritten(table: Any, rewrites: list[Any]) -> None:
    """Delete the data files of rewrites whose commit failed (an update of one of their
    fragments committed first). No version references them, so nothing else would
    remove them for a week (``cleanup_old_versions`` keeps unreferenced files that long),
    and under a steady stream of updates each failure left up to a tail's worth of rows
    on disk. Local tables only; elsewhere they wait for that cleanup."""
    folder = _table_dir(table)
    if folder is None:
        return
    latest = table.lance.to_lance()  # a file the latest version holds stays, whatever
    kept = lance_internals.data_file_paths(latest)
    for rewrite in rewrites:
        for path in lance_internals.rewritten_local_files(rewrite):
            if path not in kept:
                (folder / lance_internals.DATA_DIR / path).unlink(missing_ok=True)


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
    deletions = folder / lance_internals.DELETIONS_DIR
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
