"""What every Memory Manager phase asset shares: the pool that serialises writers of the
note table, the group names, and the MaterializeResult builder."""

from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg
import pandas as pd

from memory_pipelines.service import MemoryService

#: Every asset that writes the note table runs in this pool (limit 1 in the instance
#: config), so no two jobs write the note table at once.
NOTE_TABLE_POOL = "memory_note_table"

CYCLE_GROUP = "memory_manager"
MAINTENANCE_GROUP = "memory_maintenance"
ANALYST_GROUP = "memory_analytics"
CYCLE_BY_AGENT_GROUP = "memory_manager_by_agent"
MAINTENANCE_BY_AGENT_GROUP = "memory_maintenance_by_agent"

#: The per-agent partitions of the note pool: one key per agent (plus ``_shared`` for
#: notes without an agent), kept in sync with the agents table by the
#: ``memory_agent_partitions`` sensor. The partitioned twins of the phase assets use it.
AGENT_PARTITIONS = dg.DynamicPartitionsDefinition(name="memory_agents")

#: Key prefix of the partitioned twins (``by_agent/note_importance`` ...).
BY_AGENT_PREFIX = "by_agent"

KINDS = {"lancedb", "python"}
OWNERS = ["team:memory"]

PREVIEW_COLUMNS = ["id", "agent_id", "user_id", "company_id", "type", "status", "protection_tier", "note"]


def preview_markdown(rows: Sequence[Mapping[str, Any]] | pd.DataFrame, limit: int = 20) -> str:
    """A small markdown table of changed notes an analyst can review in the UI."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if df.empty:
        return "_no notes changed_"
    cols = [c for c in PREVIEW_COLUMNS if c in df.columns] + [
        c for c in df.columns if c not in PREVIEW_COLUMNS
    ]
    shown = df[cols].head(limit).copy()
    if "note" in shown.columns:
        shown["note"] = shown["note"].astype(str).str.slice(0, 120)
    more = f"\n\n_… and {len(df) - limit} more_" if len(df) > limit else ""
    return shown.to_markdown(index=False) + more


def phase_result(
    svc: MemoryService,
    counts: Mapping[str, Any],
    changed: Sequence[Mapping[str, Any]] | pd.DataFrame = (),
    extra: Mapping[str, Any] | None = None,
) -> dg.MaterializeResult:
    """MaterializeResult with the phase counts, the note table version and a preview."""
    metadata: dict[str, Any] = {}
    for key, value in counts.items():
        if isinstance(value, bool) or value is None:
            metadata[key] = dg.MetadataValue.text(str(value))
        elif isinstance(value, (int, float)):
            metadata[key] = value
        elif isinstance(value, (dict, list)):
            metadata[key] = dg.MetadataValue.json(value)
        else:
            metadata[key] = dg.MetadataValue.text(str(value))
    metadata["note_table_version"] = svc.store.notes.version
    metadata["preview"] = dg.MetadataValue.md(preview_markdown(changed))
    for key, value in (extra or {}).items():
        metadata[key] = value
    return dg.MaterializeResult(metadata=metadata)
