"""What the near-duplicate guard of the batched write path compares a write with: a
scope's stored notes as the parts they were read in (the read cache's segments, shared
and never copied, or the rows of one filtered scan), fetched beside the batch's embedding
call."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from memory_pipelines.blas import single_blas_thread
from memory_pipelines.context import MemoryContext
from memory_pipelines.injection.cache import ScopeView, read_cache
from memory_pipelines.notes import RunContext
from memory_pipelines.scope.placement import WriteScope, near_dup_filter
from memory_pipelines.writes.sketch import Sketch, SketchQuery, segment_sketch

log = logging.getLogger(__name__)


#: fetches a batch's scope candidates while its texts are embedded (the scan waits on
#: LanceDB's own threads, the embedding on the model: the two overlap)
_PREFETCH = ThreadPoolExecutor(max_workers=2, thread_name_prefix="write-prefetch")


@dataclass(frozen=True)
class StoredRow:
    """A stored note as the near-duplicate guard compares with it: its id and text (the
    guard loads the whole note only for the match it acts on)."""

    id: str
    note: str


#: the columns of the candidate fetch besides the vector
_CANDIDATE_COLUMNS = ("id", "note")


@dataclass(eq=False)
class CandidatePart:
    """One run of stored rows a scope's guard compares with: a segment of the read cache's
    view of the scope (shared with it, never copied) or the rows of a scan, with which of
    them are current (``alive``)."""

    ids: list[str]
    index: dict[str, int]
    vectors: np.ndarray  # (n, dim) as stored
    norms: np.ndarray  # their L2 norms
    alive: np.ndarray  # bool (n,)
    texts: Any  # the ``note`` column (an Arrow array, or a list)
    #: the rows' sketch, which rules most of them out before the full comparison (None:
    #: every row is compared in full)
    sketch: Sketch | None = None

    def text(self, k: int) -> str:
        value = self.texts[k]
        return value if isinstance(value, str) else value.as_py()


class Candidates:
    """The stored notes one scope's near-duplicate guard compares with, as the parts they
    were read in. A cached scope keeps its segments from write to write (the read cache
    brings a view forward by adding the rows of each commit as a segment and merges
    them now and then), so nothing here is rebuilt per write: a write computes its
    similarities part by part. Positions are (part, row) pairs, in the order of the
    rows the store would list."""

    def __init__(self, parts: list[CandidatePart]):
        self.parts = parts

    def position(self, note_id: str) -> tuple[int, int] | None:
        """Where the current row of ``note_id`` is, None when it is not a candidate."""
        for n, part in enumerate(self.parts):
            k = part.index.get(note_id)
            if k is not None and part.alive[k]:
                return n, k
        return None

    def above(
        self, query: np.ndarray, threshold: float
    ) -> list[tuple[float, tuple[int, int], StoredRow]]:
        """The current rows at or above ``threshold`` cosine similarity to the unit
        vector ``query``: (similarity, position, the row's id and text)."""
        out: list[tuple[float, tuple[int, int], StoredRow]] = []
        sketched = SketchQuery.of(query) if any(p.sketch is not None for p in self.parts) else None
        with single_blas_thread():  # one thread: OpenBLAS's spinning workers took a core
            for n, part in enumerate(self.parts):
                for k, sim in _above_in(part, query, sketched, threshold):
                    out.append((sim, (n, k), StoredRow(part.ids[k], part.text(k))))
        return out

    def vector(self, note_id: str) -> np.ndarray | None:
        at = self.position(note_id)
        return None if at is None else self.parts[at[0]].vectors[at[1]]


def _above_in(
    part: CandidatePart, query: np.ndarray, sketched: SketchQuery | None, threshold: float
) -> list[tuple[int, float]]:
    """The current rows of ``part`` at or above ``threshold``: (row, similarity). With a
    sketch, only the rows it does not rule out are compared in full."""
    if part.sketch is not None and sketched is not None:
        rows = np.flatnonzero(part.sketch.possible(sketched, threshold) & part.alive)
        sims = _similarities(part.vectors[rows], part.norms[rows], query)
        keep = sims >= threshold
        return list(zip(rows[keep].tolist(), sims[keep].tolist(), strict=True))
    sims = _similarities(part.vectors, part.norms, query)
    rows = np.flatnonzero((sims >= threshold) & part.alive)
    return list(zip(rows.tolist(), sims[rows].tolist(), strict=True))


def _similarities(vectors: np.ndarray, norms: np.ndarray, unit_query: np.ndarray) -> np.ndarray:
    return (vectors @ unit_query) / np.where(norms == 0, 1.0, norms)


def fetch_candidates(mem: MemoryContext, ctx: RunContext, scope: WriteScope) -> Candidates | None:
    """The stored notes the near-duplicate guard compares a write at ``scope`` with: the
    read cache's entry for :func:`near_dup_filter` (kept exact by the table version and
    brought forward from this process's commits, :mod:`memory_pipelines.injection.cache`),
    or a filtered scan (id, text and vector only) when the scope is too large to cache;
    None when the fetch fails."""
    where = near_dup_filter(scope, ctx)
    try:
        view = read_cache(mem.store.notes).rows(where)
        if view is not None:
            return _view_candidates(view)
        rows, mat = mem.store.notes.scan_with_vectors(where, columns=_CANDIDATE_COLUMNS)
    except Exception as e:  # fail-open by design (reference §2.3 item 5e)
        log.warning("near-dup check failed — proceeding fail-open with the write: %s", e)
        return None
    ids = list(rows["id"])
    vecs = np.asarray(mat, dtype=np.float32).reshape(len(ids), -1)
    return Candidates(
        [
            CandidatePart(
                ids,
                {i: k for k, i in enumerate(ids)},
                vecs,
                np.linalg.norm(vecs, axis=1).astype(np.float32),
                np.ones(len(ids), dtype=bool),
                list(rows["note"]),
            )
        ]
    )


def prefetch_candidates(mem: MemoryContext, ctx: RunContext, scope: WriteScope) -> Future:
    """:func:`fetch_candidates` in the background (beside an embedding call)."""
    return _PREFETCH.submit(fetch_candidates, mem, ctx, scope)


def _view_candidates(view: ScopeView) -> Candidates:
    """A cached scope's live rows as near-duplicate candidates: its segments as they are
    (their vectors, norms and id index are the cache's own), so the cost of a write does
    not grow with the scope beyond one similarity per row."""
    found = view.memo.get("near_dup")
    if found is None:
        found = view.memo["near_dup"] = Candidates(
            [
                CandidatePart(
                    seg.ids,
                    seg.index,
                    seg.vectors,
                    seg.norms,
                    alive,
                    seg.rows.column("note"),
                    segment_sketch(seg.memo, seg.vectors, seg.norms),
                )
                for seg, alive in zip(view.segments, view.alive, strict=True)
            ]
        )
    return found


def unit_rows(mat: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(mat, axis=1, keepdims=True)
    return mat / np.where(norms == 0, 1.0, norms)
