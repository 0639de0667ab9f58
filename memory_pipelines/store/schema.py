"""The Arrow schemas of the two tables and the conversions between rows and models."""

from __future__ import annotations

import json
import logging
import re
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from memory_pipelines.notes import Example, Note

log = logging.getLogger(__name__)



NOTES_TABLE = "notes"


EXAMPLES_TABLE = "examples"


_TS = pa.timestamp("us", tz="UTC")


_LIST_STR = pa.list_(pa.string())


_PRIMARY_KEY = {"lance-schema:unenforced-primary-key": "true"}


def _fields_for(model: type[Note] | type[Example]) -> list[pa.Field]:
    fields: list[pa.Field] = []
    for name, info in model.model_fields.items():
        ann = str(info.annotation)
        if name == "derived_from_note_ids":
            typ = _LIST_STR
        elif "datetime" in ann:
            typ = _TS
        elif name in ("access_count", "consolidation_count"):
            typ = pa.int64()
        elif name in ("importance_score", "success_score"):
            typ = pa.float64()
        elif name == "is_auto_generated":
            typ = pa.bool_()
        else:  # ids, text, enums, JSON (secondary_scopes)
            typ = pa.string()
        if name == "id":
            # Declaring ``id`` the (unenforced) primary key makes Lance record the keys a
            # merge_insert inserts, so two writers inserting the same new id conflict and
            # retry (one updates) instead of both committing a duplicate row.
            fields.append(pa.field(name, typ, nullable=False, metadata=_PRIMARY_KEY))
        else:
            fields.append(pa.field(name, typ, nullable=True))
    return fields


def table_schema(model: type[Note] | type[Example], dim: int) -> pa.Schema:
    """The Arrow schema of a table of ``model`` rows with vectors of ``dim`` floats."""
    return pa.schema(
        [*_fields_for(model), pa.field("vector", pa.list_(pa.float32(), dim), nullable=False)]
    )


M = TypeVar("M", Note, Example)


def to_row(obj: Note | Example, vector: np.ndarray) -> dict[str, Any]:
    row = obj.model_dump()
    if "secondary_scopes" in row:
        sc = row["secondary_scopes"]
        row["secondary_scopes"] = json.dumps(sc, sort_keys=True) if sc else None
    row["vector"] = np.asarray(vector, dtype=np.float32)
    return row


def from_row(model: type[M], row: dict[str, Any]) -> M:
    data = {k: row.get(k) for k in model.model_fields}
    return model.model_validate(data)


def fts_query(text: str, max_terms: int = 32) -> str:
    """Reduce free text to plain word terms safe for the full-text query parser."""
    terms = re.findall(r"[\w']+", text.lower())
    terms = [t.strip("'") for t in terms if t.strip("'")]
    return " ".join(terms[:max_terms])
