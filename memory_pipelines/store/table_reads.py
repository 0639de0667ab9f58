"""Reads of one LanceDB table (:class:`~memory_pipelines.store.rowtable.RowTable`'s
``get``/``scan``/``count`` family): rows by id or by filter, at the table's latest
version, through the Lance dataset where it can answer (:mod:`.dataset`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Generic

import numpy as np
import pyarrow as pa

from memory_pipelines.store.filters import TRUE, Cond, in_
from memory_pipelines.store.schema import M, from_row


class TableReads(Generic[M]):
    """The read half of a ``RowTable``: needs its ``_t`` (the LanceDB table), ``_reads``
    (:class:`~memory_pipelines.store.dataset.DatasetReads`), ``schema``, ``model`` and
    ``dim``."""

    _t: Any
    _reads: Any
    schema: pa.Schema
    model: type[M]
    dim: int

    def _refresh(self) -> None:
        try:
            self._t.checkout_latest()
        except Exception:
            pass

    def get(self, item_id: str) -> M | None:
        found = self.get_many([item_id])
        return found[0] if found else None

    def get_many(self, ids: Sequence[str]) -> list[M]:
        """Rows for these ids, in the order given; unknown ids are left out."""
        if not ids:
            return []
        by_id = {r["id"]: r for r in self._rows(in_("id", list(dict.fromkeys(ids))))}
        return [from_row(self.model, by_id[i]) for i in ids if i in by_id]

    def vectors(self, ids: Sequence[str]) -> dict[str, np.ndarray]:
        if not ids:
            return {}
        tbl = self._arrow(in_("id", list(dict.fromkeys(ids))), ["id", "vector"])
        mat = _vector_matrix(tbl, self.dim)
        return {i: mat[k] for k, i in enumerate(tbl.column("id").to_pylist())}

    def _arrow(self, where: Cond | None, columns: Sequence[str] | None) -> pa.Table:
        """The matching rows' columns (all but ``vector`` by default) at the latest version:
        through the Lance dataset (:mod:`.dataset`), or LanceDB where it cannot answer."""
        sql = where.sql if where is not None and where is not TRUE else None
        cols = list(columns) if columns else [f.name for f in self.schema if f.name != "vector"]
        found = self._reads.to_table(cols, sql)
        if found is not None:
            return found
        return self._lancedb_scan(sql, cols)

    def _lancedb_scan(self, sql: str | None, columns: list[str], row_ids: bool = False) -> pa.Table:
        """LanceDB's answer where the dataset cannot give one (latest version checked out)."""
        self._refresh()
        q = self._t.search()
        if sql is not None:
            q = q.where(sql)
        q = q.select(columns)
        return (q.with_row_id(True) if row_ids else q).limit(None).to_arrow()

    def _rows(self, where: Cond | None = None) -> list[dict[str, Any]]:
        return self._arrow(where, None).to_pylist()

    def scan(self, where: Cond | None = None, columns: Sequence[str] | None = None):
        """Matching rows as a pandas DataFrame (no vectors unless asked for)."""
        return self._arrow(where, columns).to_pandas()

    def scan_with_vectors(
        self, where: Cond | None = None, columns: Sequence[str] | None = None
    ) -> tuple[list[M] | Any, np.ndarray]:
        """Matching rows (``Note``/``Example`` objects, or a DataFrame when ``columns`` is
        given) and their vectors as one ``(n, dim)`` float32 matrix."""
        cols = list(columns) if columns else [f.name for f in self.schema]
        if "vector" not in cols:
            cols.append("vector")
        tbl = self._arrow(where, cols)
        mat = _vector_matrix(tbl, self.dim)
        rest = tbl.drop_columns(["vector"])
        if columns:
            return rest.to_pandas(), mat
        return [from_row(self.model, r) for r in rest.to_pylist()], mat

    def all(self, where: Cond | None = None) -> list[M]:
        return [from_row(self.model, r) for r in self._rows(where)]

    def count(self, where: Cond | None = None) -> int:
        if where is None or where is TRUE:
            return self._t.count_rows()
        return self._t.count_rows(where.sql)

    def indexes_read(self, where: Cond) -> list[str]:
        """The scalar indexes a filtered read of ``where`` reads (the names Lance's plan
        gives, such as ``user_id_idx``), so callers and benches can tell a scope read
        that reads indexes from one that scans every row; empty when it scans (or the
        plan is unavailable)."""
        plan = self._reads.plan(["id"], None if where is TRUE else where.sql) or ""
        line = next((ln for ln in plan.splitlines() if "ScalarIndexQuery" in ln), "")
        return sorted(set(re.findall(r"@([A-Za-z0-9_]+)\(", line)))

    def scan_arrow(self, where: Cond | None = None, *, with_vectors: bool = True) -> pa.Table:
        """Every column of the matching rows (with ``vector`` unless told not to) as one
        Arrow table, read at the table's latest version."""
        cols = [f.name for f in self.schema if with_vectors or f.name != "vector"]
        return self._arrow(where, cols)

    def scan_with_row_ids(
        self, where: Cond | None, columns: Sequence[str]
    ) -> tuple[pa.Table, int | None]:
        """Only ``columns`` of the matching rows, plus their ``_rowid`` (what
        :meth:`rows_by_row_id` finds the rest of each row by), at the table's latest
        version, and the version read (None when LanceDB answered: it does not say; the
        rest is then found by id)."""
        sql = where.sql if where is not None and where is not TRUE else None
        found = self._reads.scan_with_row_ids(list(columns), sql)
        if found is not None:
            return found
        return self._lancedb_scan(sql, list(columns), row_ids=True), None

    def rows_by_row_id(
        self, ids: Sequence[str], row_ids: Sequence[int] | None, version: int | None
    ) -> pa.Table:
        """Every column but ``vector`` of the rows ``ids``, as :meth:`scan_with_row_ids`
        read them: by their ``row_ids`` at the ``version`` read (a few random reads), or
        by id at the latest version when that version cannot be read any more (a
        compaction rewrote its files and they were cleaned up: every row a cached view
        still holds is then the same at the latest version). Rows found, in any order; an
        id deleted since is left out."""
        cols = [f.name for f in self.schema if f.name != "vector"]
        if row_ids is not None and version is not None and ids:
            found = self._reads.take_rows(version, row_ids, cols)
            if found is not None and found.column("id").to_pylist() == list(ids):
                return found
        if not ids:
            return self.schema.empty_table().select(cols)
        return self._arrow(in_("id", list(dict.fromkeys(ids))), cols)

    def models(self, rows: pa.Table) -> list[M]:
        """``Note``/``Example`` objects of Arrow rows read from this table."""
        return [from_row(self.model, r) for r in rows.to_pylist()]


def _vector_matrix(tbl: pa.Table, dim: int) -> np.ndarray:
    if tbl.num_rows == 0:
        return np.zeros((0, dim), dtype=np.float32)
    col = tbl.column("vector").combine_chunks()
    return np.asarray(col.values.to_numpy(zero_copy_only=False), dtype=np.float32).reshape(-1, dim)
