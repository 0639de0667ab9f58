"""An exact prefilter for the near-duplicate guard: which stored rows could reach the
threshold at all, read from a quarter of their dimensions.

For unit vectors ``q`` and ``u``, ``cos(q, u) >= t`` exactly when ``|q - u|² <= 2 - 2t``,
and a projection onto orthonormal directions never makes a vector longer:
``|P(q - u)|² <= |q - u|²``. A row whose projected distance to the query is above
``2 - 2t`` therefore cannot reach ``t``, whatever its other coordinates; only the rows
that pass are compared in full, so the guard finds the same rows with the same
similarities. ``P`` is a fixed random rotation onto a quarter of the dimensions (its
pruning then does not depend on how an embedder spreads its coordinates). Over 2,759
distinct texts of the LoCoMo dev split embedded with MiniLM (200 of them against the
rest), at the guard's 0.92, 0.07 % of the pairs passed, so a write over a large cached
scope reads about a quarter of the bytes the full comparison read (at 10,000 notes,
3.7 MB against 15 MB: the part of a write that grew with its user's notes).

A sketch is built once per segment of the read cache (segments never change), for
segments of at least :data:`SKETCH_MIN_ROWS` rows, on the :data:`SKETCH_AFTER_USES`-th
write compared with it: building it costs about fifteen full comparisons (12 ms at 10,000
rows, 118 ms at 100,000), which a segment compared a few times only would not repay. The
smaller segments are compared in full, which costs them less than a sketch would.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from memory_pipelines.blas import single_blas_thread

#: the sketch keeps one coordinate in this many
SKETCH_SHARE = 4
#: vectors with fewer dimensions are compared in full (a sketch of them prunes little)
SKETCH_MIN_DIM = 128
#: segments with fewer rows are compared in full
SKETCH_MIN_ROWS = 2048
#: a segment's sketch is built when this many writes have been compared with it
SKETCH_AFTER_USES = 8
#: how far float32 rounding of the projected distance may err; a row within it of the
#: bound is compared in full, so it costs a comparison, never a miss
_SLACK = 1e-3


@functools.lru_cache(maxsize=8)
def rotation(dim: int) -> np.ndarray:
    """``dim`` x ``dim // SKETCH_SHARE`` orthonormal columns, the same for every process
    (seeded by ``dim``)."""
    basis, _ = np.linalg.qr(np.random.default_rng(dim).standard_normal((dim, dim // SKETCH_SHARE)))
    basis = np.ascontiguousarray(basis, dtype=np.float32)
    basis.setflags(write=False)
    return basis


@dataclass(frozen=True, eq=False)
class Sketch:
    """The unit rows of a segment projected by :func:`rotation`, with their squared
    lengths."""

    rows: np.ndarray  # (n, dim // SKETCH_SHARE) float32
    squares: np.ndarray  # (n,) float32

    @classmethod
    def of(cls, vectors: np.ndarray, norms: np.ndarray) -> Sketch | None:
        """The sketch of ``vectors`` (with their L2 ``norms``), or None when they are too
        few or too short to gain from one."""
        if not _worth_sketching(vectors):
            return None
        unit = vectors / np.where(norms == 0, 1.0, norms).astype(np.float32)[:, None]
        with single_blas_thread():
            rows = unit @ rotation(vectors.shape[1])
        return cls(rows, np.einsum("ij,ij->i", rows, rows))

    @property
    def nbytes(self) -> int:
        return int(self.rows.nbytes + self.squares.nbytes)

    def possible(self, query: SketchQuery, threshold: float) -> np.ndarray:
        """Which rows may be at or above ``threshold`` cosine similarity to the query
        (bool, one per row): every row that is, and a few that are not."""
        with single_blas_thread():
            dots = self.rows @ query.projected
        distances = (query.square + self.squares) - 2.0 * dots
        return distances <= (2.0 - 2.0 * threshold) + _SLACK


@dataclass(frozen=True, eq=False)
class SketchQuery:
    """A query as sketches compare with it: its unit vector projected."""

    projected: np.ndarray
    square: float

    @classmethod
    def of(cls, query: np.ndarray) -> SketchQuery | None:
        """None when the query has no direction (every similarity is 0) or too few
        dimensions."""
        q = np.asarray(query, dtype=np.float32)
        norm = float(np.linalg.norm(q))
        if norm == 0.0 or not np.isfinite(norm) or q.shape[0] < SKETCH_MIN_DIM:
            return None
        projected = (q / np.float32(norm)) @ rotation(q.shape[0])
        return cls(projected, float(projected @ projected))


def segment_sketch(memo: dict[str, Any], vectors: np.ndarray, norms: np.ndarray) -> Sketch | None:
    """The sketch of a read-cache segment (``memo``: the segment's own, where it is kept),
    counting this use: None until the segment has been compared with
    :data:`SKETCH_AFTER_USES` times, and for a segment too small to gain from one."""
    if "near_dup_sketch" not in memo:
        if not _worth_sketching(vectors):
            memo["near_dup_sketch"] = None
            return None
        uses = memo["near_dup_uses"] = memo.get("near_dup_uses", 0) + 1
        if uses < SKETCH_AFTER_USES:
            return None
        memo["near_dup_sketch"] = Sketch.of(vectors, norms)
    return memo["near_dup_sketch"]


def _worth_sketching(vectors: np.ndarray) -> bool:
    """Whether rows this many and this long gain from a sketch (:data:`SKETCH_MIN_ROWS`,
    :data:`SKETCH_MIN_DIM`)."""
    n, dim = vectors.shape
    return n >= SKETCH_MIN_ROWS and dim >= SKETCH_MIN_DIM
