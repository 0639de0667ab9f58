"""The note inventory and the integrity properties the asset checks assert.

``note_inventory(svc)`` counts notes by status, tier, type and agent and summarises the
importance scores: what an analyst reads after a cycle (and what the maintenance
``note_inventory`` asset materializes). The three integrity functions return the rows
that break a property (an empty frame means it holds):

- ``vector_problems``: injectable notes whose vector is missing, zero, non-finite or
  of another dimension than the embedder's;
- ``hardened_with_expiry``: Active agent-authored notes that still carry an expiry
  (hardening must clear it, or TTL would archive a confirmed note);
- ``dangling_lineage``: lineage ids (``consolidated_into_note_id``,
  ``derived_from_note_ids``) that name no existing note;
- ``events_without_notes``: lifecycle events (``note_events``) of a note id the note
  table does not hold (purge and erase delete a note's events with it).

``conversation_source_state`` and ``agent_run_source_state`` summarise the SQL sources
the cycle mines, with a data version that changes exactly when new rated messages or
agent runs arrive; ``note_table_state`` summarises the LanceDB note table.

Everything here reads; nothing writes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from memory_pipelines.context import MemoryContext
from memory_pipelines.notes import AuthorType, NoteStatus
from memory_pipelines.store import and_, eq, injectable, not_null

INVENTORY_COLUMNS = [
    "id",
    "agent_id",
    "status",
    "type",
    "protection_tier",
    "author_type",
    "importance_score",
]

#: Importance score buckets of the distribution table (scores are on a 0-10 scale).
IMPORTANCE_BINS = [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


def _counts(df: pd.DataFrame, column: str) -> pd.DataFrame:
    if df.empty:
        return pd.DataFrame({column: pd.Series(dtype=str), "notes": pd.Series(dtype="int64")})
    out = df[column].fillna("(none)").value_counts().rename_axis(column).reset_index(name="notes")
    return out.sort_values(["notes", column], ascending=[False, True]).reset_index(drop=True)


def note_inventory(mem: MemoryContext) -> dict[str, pd.DataFrame]:
    """Counts of notes by status, tier, type and agent (all statuses), the agent x status
    matrix, and the importance distribution of injectable notes (reads only)."""
    df = mem.store.notes.scan(None, columns=INVENTORY_COLUMNS)
    inventory = {
        "by_status": _counts(df, "status"),
        "by_tier": _counts(df, "protection_tier"),
        "by_type": _counts(df, "type"),
        "by_agent": _counts(df, "agent_id"),
        "by_author": _counts(df, "author_type"),
    }
    if df.empty:
        inventory["agent_status"] = pd.DataFrame()
    else:
        inventory["agent_status"] = pd.crosstab(
            df["agent_id"].fillna("(none)"), df["status"]
        ).rename_axis(index="agent_id", columns=None)
    live = df[df["status"].isin([NoteStatus.ACTIVE.value, NoteStatus.PROVISIONAL.value])]
    scores = pd.to_numeric(live["importance_score"], errors="coerce")
    scored = scores.dropna()
    buckets = pd.cut(scored, IMPORTANCE_BINS, include_lowest=True)
    distribution = (
        buckets.value_counts(sort=False).rename_axis("importance").reset_index(name="notes")
    )
    distribution["importance"] = distribution["importance"].astype(str)
    unscored = pd.DataFrame({"importance": ["(unscored)"], "notes": [int(scores.isna().sum())]})
    inventory["importance"] = pd.concat([distribution, unscored], ignore_index=True)
    inventory["importance_summary"] = pd.DataFrame(
        [
            {
                "scored": int(len(scored)),
                "unscored": int(scores.isna().sum()),
                "min": round(float(scored.min()), 2) if len(scored) else None,
                "median": round(float(scored.median()), 2) if len(scored) else None,
                "mean": round(float(scored.mean()), 2) if len(scored) else None,
                "max": round(float(scored.max()), 2) if len(scored) else None,
            }
        ]
    )
    return inventory


def vector_problems(mem: MemoryContext) -> pd.DataFrame:
    """Injectable notes whose stored vector is unusable (zero, non-finite, wrong size)."""
    frame, vectors = mem.store.notes.scan_with_vectors(
        injectable(), columns=["id", "agent_id", "note"]
    )
    if frame.empty:
        return frame.assign(problem=pd.Series(dtype=str))
    problems = []
    if vectors.shape[1] != mem.embedder.dim:
        problems = [f"dimension {vectors.shape[1]} != embedder {mem.embedder.dim}"] * len(frame)
    else:
        norms = np.linalg.norm(vectors, axis=1)
        finite = np.isfinite(vectors).all(axis=1)
        problems = [
            "non-finite values" if not ok else ("zero vector" if n <= 1e-9 else "")
            for n, ok in zip(norms, finite, strict=True)
        ]
    frame = frame.assign(problem=problems)
    return frame[frame["problem"] != ""].reset_index(drop=True)


def hardened_with_expiry(mem: MemoryContext) -> pd.DataFrame:
    """Active agent-authored (hardened) notes that still carry ``expires_at``."""
    return mem.store.notes.scan(
        and_(
            eq("status", NoteStatus.ACTIVE),
            eq("author_type", AuthorType.AGENT),
            not_null("expires_at"),
        ),
        columns=["id", "agent_id", "note", "expires_at"],
    )


def dangling_lineage(mem: MemoryContext) -> pd.DataFrame:
    """Lineage references (``consolidated_into_note_id``, ``derived_from_note_ids``)
    that name no existing note: one row per (note, missing id)."""
    df = mem.store.notes.scan(
        None, columns=["id", "consolidated_into_note_id", "derived_from_note_ids"]
    )
    known = set(df["id"])
    rows = []
    for rec in df.itertuples(index=False):
        into = rec.consolidated_into_note_id
        if isinstance(into, str) and into and into not in known:
            rows.append((rec.id, "consolidated_into_note_id", into))
        derived = rec.derived_from_note_ids
        refs = [] if derived is None or isinstance(derived, float) else list(derived)
        rows.extend((rec.id, "derived_from_note_ids", ref) for ref in refs if ref not in known)
    return pd.DataFrame(rows, columns=["id", "column", "missing_id"])


def events_without_notes(mem: MemoryContext) -> pd.DataFrame:
    """Note ids that some lifecycle event names but the note table does not hold: one row
    per id, sorted."""
    named = mem.sources.event_note_ids()
    if not named:
        return pd.DataFrame({"note_id": pd.Series(dtype=str)})
    known = set(mem.store.notes.scan(None, columns=["id"])["id"])
    return pd.DataFrame({"note_id": sorted(named - known)}, dtype=str)


@dataclass(frozen=True)
class SourceState:
    """A source's summary numbers and the data version that names its content."""

    data_version: str
    counts: Mapping[str, Any] = field(default_factory=dict)


def _digest(values: Mapping[str, Any]) -> str:
    """A short, stable digest of summary values (datetimes as ISO strings)."""
    plain = {k: v.isoformat() if isinstance(v, datetime) else v for k, v in values.items()}
    text = json.dumps(plain, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


#: The conversation summary fields that make its data version: a new rated message (or a
#: rating given to an older message) changes one of them; unrated chatter does not.
RATED_VERSION_FIELDS = ("rated_messages", "rated_conversations", "newest_rated_message_at")


def conversation_source_state(mem: MemoryContext) -> SourceState:
    """The conversations and messages the cycle mines: counts, the newest rated message,
    and a data version that moves when a rated message arrives (reads only)."""
    counts = mem.sources.rated_conversation_summary()
    version = _digest({k: counts[k] for k in RATED_VERSION_FIELDS})
    return SourceState(version, counts)


def agent_run_source_state(mem: MemoryContext) -> SourceState:
    """The agent runs the cycle mines: counts, the newest run, and a data version that
    moves when a run arrives, fails or finishes (reads only)."""
    counts = mem.sources.agent_run_summary()
    return SourceState(_digest(counts), counts)


def note_table_state(mem: MemoryContext) -> dict[str, Any]:
    """The LanceDB note table in numbers: its version, rows, data fragments and notes by
    status (reads only)."""
    notes = mem.store.notes
    stats = notes.stats()
    by_status = _counts(notes.scan(None, columns=["status"]), "status")
    return {
        "table_version": notes.version,
        "rows": stats["rows"],
        "fragments": stats["fragments"],
        "by_status": {str(r.status): int(r.notes) for r in by_status.itertuples(index=False)},
    }
