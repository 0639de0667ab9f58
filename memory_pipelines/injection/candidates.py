"""In-memory candidate sets: the parts the ``Relevant`` ranking runs over (a scope's cached
rows, or notes as they were at an instant)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from memory_pipelines.injection.cache import ScopeRows, ScopeView
from memory_pipelines.injection.lexical import LexicalIndex
from memory_pipelines.notes import Note


@dataclass
class CandidatePart:
    """Part of an in-memory candidate set (the scope's cached rows, or notes as they were
    at an instant): positions with their vectors, ids, creation times (epoch seconds),
    types, a lexical index of their texts, which positions are candidates (``keep``), how
    to build the notes of some positions, the vectors' norms (computed when None), and
    how a ranking sees positions before it picks (``ranked``)."""

    ids: list[str]
    vectors: np.ndarray
    created: np.ndarray
    types: list[str | None]
    lexical: LexicalIndex
    keep: np.ndarray
    models: Callable[[list[int]], list[Note | None]]
    norms: np.ndarray | None = None
    #: how a ranking sees some positions before it picks (notes, or rows that answer
    #: its fields: :meth:`ScopeRows.ranked`); None: :attr:`models`
    ranked: Callable[[list[int]], list] | None = None

    def __post_init__(self) -> None:
        if self.norms is None:
            self.norms = np.linalg.norm(self.vectors, axis=1).astype(np.float32)


def scope_part(rows: ScopeRows[Note], keep: np.ndarray, stemmer: str) -> CandidatePart:
    """The cached rows of a scope as a candidate part (``keep``: which rows count)."""
    return CandidatePart(
        ids=rows.ids,
        vectors=rows.vectors,
        created=rows.created,
        types=rows.types,
        lexical=rows.lexical(stemmer),
        keep=keep,
        models=rows.models,
        norms=rows.norms,
        ranked=rows.ranked,
    )


def view_parts(view: ScopeView[Note], now: datetime, stemmer: str) -> list[CandidatePart]:
    """The segments of a cached scope as candidate parts: live rows unexpired at ``now``."""
    return [scope_part(seg, keep, stemmer) for seg, keep in view.kept(now)]
