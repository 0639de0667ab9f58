"""Which of some ids a table holds, at its latest version, at a cost that follows the ids
asked and the fragments written since the previous question, not the rows outside the id
index.

Before an append the write path asks whether its new ids are stored (a retried write
merges its row instead of adding a second one: ``RowTable.put``). One filtered scan
answers that through the BTree index on ``id`` for the fragments the index covers, but
reads the ``id`` column of every row written since the index was last refreshed (the
background compaction folds them in only every few thousand rows), so under a trickle
of single writes the question cost more the longer the table went without a refresh.

:class:`IdLookup` splits it. The fragments the id index covers are asked through the
index alone (a scan restricted to them: Lance answers it from the index). Every other
fragment's ids are read once and kept, keyed by the fragment's data files: a data file
never changes once written (every commit writes new ones, under fresh names), so the ids
of a fragment with those files are those ids for good, whichever process wrote it. A
fragment with deleted rows (a deletion file) is not kept: its live ids are scanned, with
the filter, each time. Fragments that leave the table (compacted, indexed) are forgotten
at the next question. The fragments this process's own appends and merges added since
its previous question are not even read: their ids are the rows its commit journal
recorded (:meth:`IdLookup._own_writes` says when that holds). The ids kept are bounded (:data:`MAX_KEPT_IDS`); a fragment that
does not fit is scanned as before. Anything Lance cannot answer here (pylance missing, an
error) returns None and the caller asks LanceDB.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from memory_pipelines.store.filters import in_

log = logging.getLogger(__name__)

#: ids of fragments outside the id index kept in memory at most (about 100 bytes each,
#: so some 6.5 MB): the background compaction keeps the rows outside the indexes under
#: ``TableTuning.index_lag_rows`` (8,192), or 5 % of a larger table, so at up to 1.3M
#: rows every one fits; a fragment beyond it is scanned at each question
MAX_KEPT_IDS = 65_536

#: the name of the column looked up
ID_COLUMN = "id"


def _files(fragment: Any) -> tuple[str, ...] | None:
    """The fragment's data file paths (its identity), or None when it has deleted rows.
    (The fragment's own accessors: building its ``metadata`` cost ~18 us a fragment.)"""
    if fragment.deletion_file() is not None:
        return None
    return tuple(d.path for d in fragment.data_files())


class IdLookup:
    """The ids of one table's fragments outside its id index, read once each (see the
    module notes). ``dataset``: returns the Lance dataset at the table's latest version."""

    def __init__(
        self, dataset: Callable[[], Any], journal: Any = None, max_kept_ids: int = MAX_KEPT_IDS
    ):
        self._dataset = dataset
        self._journal = journal
        #: the version of the previous question and its fragment ids
        self._seen: tuple[int, frozenset[int]] | None = None
        self.max_kept_ids = max_kept_ids
        self._lock = threading.Lock()
        #: a fragment's data files -> its ids
        self._kept: dict[tuple[str, ...], frozenset[str]] = {}
        self._kept_count = 0
        #: fragments whose ids were read (tests and benches count them)
        self.fragments_read = 0

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
            self._kept_count = 0
            self._seen = None

    @property
    def kept_ids(self) -> int:
        """How many ids are kept now."""
        return self._kept_count

    def existing(self, ids: Sequence[str]) -> set[str] | None:
        """The ids among ``ids`` (distinct) the table holds at its latest version; None
        when only LanceDB can say."""
        try:
            ds = self._dataset()
            return self._existing(ds, ids)
        except ImportError:
            return None
        except Exception as e:
            log.debug("id lookup fell back to LanceDB: %s", e)
            return None

    def _existing(self, ds: Any, ids: Sequence[str]) -> set[str]:
        indexed: set[int] = set()
        for idx in ds.describe_indices():  # (``list_indices`` warns: deprecated)
            if list(idx.field_names) == [ID_COLUMN]:
                for segment in idx.segments:
                    indexed.update(segment.fragment_ids or ())
        covered, scanned, unread = [], [], []
        wanted = frozenset(ids)
        found: set[str] = set()
        with self._lock:
            live: dict[tuple[str, ...], frozenset[str]] = {}
            fragments = ds.get_fragments()
            for fragment in fragments:
                if fragment.fragment_id in indexed:
                    covered.append(fragment)
                    continue
                files = _files(fragment)
                if files is None:
                    scanned.append(fragment)
                elif (kept := self._kept.get(files)) is not None:
                    live[files] = kept
                else:
                    unread.append((files, fragment))
            room = self.max_kept_ids - sum(len(v) for v in live.values())
            written = self._own_writes(int(ds.version), fragments, unread)
            for files, fragment in unread:
                rows = int(fragment.physical_rows)  # no deleted rows: all of them
                if rows > room:
                    scanned.append(fragment)
                    continue
                live[files] = written.get(files) or self._read(fragment)
                room -= rows
            self._seen = (int(ds.version), frozenset(f.fragment_id for f in fragments))
            self._kept = live  # fragments no longer in the table are forgotten
            self._kept_count = self.max_kept_ids - room
            for kept in live.values():
                found.update(wanted & kept)
        sql = in_(ID_COLUMN, list(wanted)).sql
        for group in (covered, scanned):
            if group:  # over the fragments the id index covers Lance reads only the index
                tbl = ds.scanner(columns=[ID_COLUMN], filter=sql, fragments=group).to_table()
                found.update(tbl.column(ID_COLUMN).to_pylist())
        return found

    def _own_writes(
        self, version: int, fragments: list[Any], unread: list[tuple[tuple[str, ...], Any]]
    ) -> dict[tuple[str, ...], frozenset[str]]:
        """The ids of the fragments this process's own appends and merges added since the
        previous question, from its commit journal, without reading them: when every
        version since was one of them (``CommitJournal.since``: no other process's commit,
        no delete, no compaction between), each added exactly one fragment holding
        exactly the rows it wrote (an append adds its rows, a merge on id writes every
        row it got, marking the replaced ones deleted), and Lance numbers fragments in
        commit order, so the n-th new fragment holds the n-th version's rows (their row
        counts must agree too). Otherwise nothing: those fragments are read."""
        seen = self._seen
        if self._journal is None or seen is None or not unread:
            return {}
        since = self._journal.since(seen[0], version)
        if not since:
            return {}
        new = sorted(f.fragment_id for f in fragments if f.fragment_id not in seen[1])
        by_id = {f.fragment_id: files for files, f in unread}
        if len(new) != len(since) or any(i not in by_id for i in new):
            return {}  # a compaction's rewrite, a deleted row, a commit of several fragments
        out = {}
        counts = {f.fragment_id: int(f.physical_rows) for _, f in unread}
        for fragment_id, rows in zip(new, since, strict=True):
            if rows.num_rows == 0 or counts[fragment_id] != rows.num_rows:
                return {}
            out[by_id[fragment_id]] = frozenset(rows.column(ID_COLUMN).to_pylist())
        return out

    def _read(self, fragment: Any) -> frozenset[str]:
        """The ids a fragment without deleted rows holds."""
        self.fragments_read += 1
        return frozenset(fragment.to_table(columns=[ID_COLUMN]).column(ID_COLUMN).to_pylist())
