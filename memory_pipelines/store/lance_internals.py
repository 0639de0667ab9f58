"""Every LanceDB and pylance name the store uses beyond their documented table API, in one
place: a LanceDB or Lance upgrade that moves or drops one of them fails here, by name
(``tests/store/test_lance_internals.py`` resolves each of :data:`INTERNALS`), rather than
somewhere in a write path.

- ``lancedb.background_loop.LOOP`` and ``LanceTable._table`` (the async table under the
  sync one): the text search sends one query to LanceDB's event loop instead of the sync
  builder's several round trips (~3x faster).
- ``lance.optimize.Compaction`` (``plan``, ``commit``, a task's ``execute``, a rewrite's
  ``new_fragments``): the background tail compaction with its own options and a commit
  under the table's write lock, which LanceDB's ``optimize`` does not expose.
- ``lance.LanceOperation.Rewrite`` and ``LanceDataset.read_transaction``: telling a
  compaction's commit (the same rows in new files) from a write.
- ``FragmentMetadata.data_files``/``to_json``/``deletion_file`` and a data file's ``path``
  and ``base_id``, and the ``data``/``_deletions`` folders of a local table: the layout
  a compaction reads and the files a rejected rewrite leaves behind.
- ``lancedb.Session`` and ``lance.Session`` (given to ``lancedb.connect(session=...)`` and
  through ``LanceTable.to_lance(session=...)`` to ``lance.dataset``): the caches of
  manifests, file metadata and index pages, with our bounds. Left to themselves both
  libraries give every connection or dataset its own session of 1 GiB of metadata and
  6 GiB of index pages; every commit is a new version whose manifest and files enter the
  metadata cache, and nothing leaves it below the bound, so a long-lived writer grew by
  ~130 KB a write until it reached several GB.
- ``LanceDataset._take_rows``: the rest of a row the injection read cache read only the
  ranking columns of, by the ``_rowid`` its scan returned, at the version it read.

pylance is imported only when a function here needs it, as before.
"""

from __future__ import annotations

from typing import Any

from lancedb.background_loop import LOOP

#: a local Lance table's folders of data files and deletion files
DATA_DIR = "data"
DELETIONS_DIR = "_deletions"

#: each internal name, as ``module:attribute.path``, resolved by the test
INTERNALS = (
    "lancedb.background_loop:LOOP.run",
    "lancedb.table:LanceTable",  # its ``_table`` (an AsyncTable) is checked on a real table
    "lancedb.table:AsyncTable.query",
    "lance.optimize:Compaction.plan",
    "lance.optimize:Compaction.commit",
    "lance.optimize:CompactionTask.execute",
    "lance.optimize:RewriteResult",  # its ``new_fragments``, on a real rewrite
    "lance:LanceOperation.Rewrite",
    "lance.dataset:LanceDataset.read_transaction",
    "lance.fragment:FragmentMetadata.data_files",
    "lance.fragment:FragmentMetadata.to_json",
    "lance.fragment:FragmentMetadata.deletion_file",
    "lance.fragment:DataFile",  # its ``path`` and ``base_id``, on a real fragment
    "lance.dataset:LanceDataset._take_rows",
    # the id check (``store/idlookup.py``): a fragment's files and rows, the id index's
    # coverage, a scan restricted to some fragments
    "lance.fragment:LanceFragment.data_files",
    "lance.fragment:LanceFragment.deletion_file",
    "lance.fragment:LanceFragment.physical_rows",
    "lance.dataset:LanceDataset.describe_indices",
    "lance.dataset:LanceDataset.scanner",
)


def run_on_lancedb_loop(awaitable: Any) -> Any:
    """Run a coroutine of LanceDB's async API on LanceDB's own event loop."""
    return LOOP.run(awaitable)


def async_table(table: Any) -> Any | None:
    """The async table under a sync ``LanceTable`` (None where there is none, as for a
    remote table: the caller then uses the sync API)."""
    native = getattr(table, "_table", None)
    return native if native is not None and hasattr(native, "query") else None


def lancedb_session(metadata_cache_bytes: int, index_cache_bytes: int) -> Any:
    """A LanceDB session whose metadata and index caches hold at most these many bytes
    (for ``lancedb.connect(session=...)``)."""
    import lancedb

    return lancedb.Session(
        index_cache_size_bytes=index_cache_bytes, metadata_cache_size_bytes=metadata_cache_bytes
    )


def dataset_session(metadata_cache_bytes: int, index_cache_bytes: int) -> Any:
    """A pylance session with these bounds, for the datasets :func:`open_dataset` opens
    (ImportError when pylance is not importable)."""
    import lance

    return lance.Session(
        index_cache_size_bytes=index_cache_bytes, metadata_cache_size_bytes=metadata_cache_bytes
    )


def open_dataset(table: Any, session: Any | None) -> Any:
    """The Lance dataset under a LanceDB table, its caches in ``session`` (a
    :func:`dataset_session`; None: a session of pylance's own defaults)."""
    return table.to_lance() if session is None else table.to_lance(session=session)


def session_bytes(session: Any) -> int:
    """What a LanceDB or pylance session's caches hold now, in bytes (their own estimate)."""
    size = session.size_bytes
    return int(size() if callable(size) else size)


def compaction() -> Any | None:
    """pylance's ``Compaction`` (``plan``/``commit``), or None when pylance is not
    importable."""
    try:
        from lance.optimize import Compaction
    except ImportError:
        return None
    return Compaction


def append_rows(ds: Any, data: Any) -> Any:
    """``ds`` (a ``LanceDataset``) with ``data`` appended: one commit onto the latest
    version, in the dataset's session; returns the dataset at the version it made."""
    import lance

    return lance.write_dataset(data, ds, mode="append")


def take_rows(ds: Any, row_ids: list[int], columns: list[str]) -> Any:
    """The ``columns`` of the rows of ``ds`` (a ``LanceDataset`` at one version) with
    these ``_rowid`` values, in the order given (an Arrow table)."""
    return ds._take_rows(row_ids, columns=columns)


def is_rewrite(ds: Any, version: int) -> bool:
    """Whether ``version`` of the dataset was committed by a compaction (a ``Rewrite``:
    the same rows in new files)."""
    from lance import LanceOperation

    txn = ds.read_transaction(version)
    return txn is not None and isinstance(txn.operation, LanceOperation.Rewrite)


def fragment_layout(ds: Any) -> list[tuple[Any, ...]]:
    """Every fragment's id, data file paths, overlays, deletion file and row count: what
    decides its rows. (Its metadata's JSON holds the same and more, and cost ~0.5 ms per
    version at 40 fragments of the note table, in Python.)"""
    out = []
    for f in ds.get_fragments():
        m = f.metadata
        out.append(
            (m.id, tuple(d.path for d in m.files), m.overlays, m.deletion_file, m.physical_rows)
        )
    return out


def data_file_paths(ds: Any) -> set[str]:
    """The paths, relative to the data folder, of every data file the dataset holds."""
    return {d.path for f in ds.get_fragments() for d in f.metadata.data_files()}


def rewritten_local_files(rewrite: Any) -> list[str]:
    """The paths of the data files a rewrite wrote into the table's own data folder."""
    return [
        d.path
        for fragment in rewrite.new_fragments
        for d in fragment.data_files()
        if getattr(d, "base_id", None) is None
    ]


def has_deletion_file(fragment: Any) -> bool:
    """Whether a fragment hides deleted rows behind a deletion file."""
    return fragment.metadata.deletion_file is not None
