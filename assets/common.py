"""What every Memory Manager phase asset shares: the pool that serialises writers of the
note table, the group names, the asset decorator (:func:`phase_asset`) and the
MaterializeResult builder (snake_case metadata keys,
blank cells for missing values)."""

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import dagster as dg
import pandas as pd

from memory_pipelines.service import MemoryService

#: Every asset that writes the note table runs in this pool (limit 1 in the instance
#: config), so no two jobs write the note table at once.
NOTE_TABLE_POOL = "memory_note_table"

SOURCES_GROUP = "memory_sources"
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



def phase_asset(
    phase: str, group: str, deps: Sequence[Any], *, writes: str = "notes"
) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
    """The decorator of a Memory Manager phase asset: its group, the kinds and owners every
    phase asset carries, the ``phase`` and ``writes`` tags, the note-table pool (one writer
    of the note table at a time) and the assets it runs after."""
    return dg.asset(
        group_name=group,
        kinds=KINDS,
        owners=OWNERS,
        tags={"phase": phase, "writes": writes},
        pool=NOTE_TABLE_POOL,
        deps=list(deps),
    )

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def snake_case(key: str) -> str:
    """A metadata key in snake_case (``notesFragmentsAfter`` -> ``notes_fragments_after``)."""
    return _CAMEL_BOUNDARY.sub("_", key).replace("-", "_").replace(" ", "_").lower()


def blank_missing(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every missing value (None, NaN, NaT) shown as an empty cell, so no
    ``nan`` or ``None`` placeholder reaches a table an analyst reads."""
    if df.empty:
        return df
    shown = df.astype(object)
    return shown.where(shown.notna(), "")


def frame_markdown(df: pd.DataFrame, index: bool = False) -> str:
    """A markdown table of ``df`` with missing values blank (``_none_`` when empty)."""
    if df.empty:
        return "_none_"
    return blank_missing(df).to_markdown(index=index)


def preview_markdown(rows: Sequence[Mapping[str, Any]] | pd.DataFrame, limit: int = 20) -> str:
    """A small markdown table of changed notes an analyst can review in the UI (a
    company-wide note shows blank agent and user cells, never ``nan``)."""
    df = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if df.empty:
        return "_no notes changed_"
    cols = [c for c in PREVIEW_COLUMNS if c in df.columns] + [
        c for c in df.columns if c not in PREVIEW_COLUMNS
    ]
    shown = blank_missing(df[cols].head(limit).copy())
    if "note" in shown.columns:
        shown["note"] = shown["note"].astype(str).str.slice(0, 120)
    more = f"\n\n_… and {len(df) - limit} more_" if len(df) > limit else ""
    return shown.to_markdown(index=False) + more


def metadata_value(value: Any) -> Any:
    """One metadata value as the UI shows it: numbers as numbers, times as timestamps,
    dicts and lists as JSON, anything else (a flag, a missing value) as text."""
    if isinstance(value, bool):
        return dg.MetadataValue.text("yes" if value else "no")
    if value is None:
        return dg.MetadataValue.text("")
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, datetime):
        return dg.MetadataValue.timestamp(value)
    if isinstance(value, (dict, list)):
        return dg.MetadataValue.json(value)
    return dg.MetadataValue.text(str(value))


def counts_table(label: str, counts: Mapping[str, int]) -> dg.TableMetadataValue:
    """A two-column table (``label``, ``notes``) the UI shows inline, largest count first."""
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return dg.MetadataValue.table(
        records=[dg.TableRecord({label: str(k), "notes": int(v)}) for k, v in rows],
        schema=dg.TableSchema(
            columns=[dg.TableColumn(label, "string"), dg.TableColumn("notes", "int")]
        ),
    )


def source_metadata(counts: Mapping[str, Any]) -> dict[str, Any]:
    """Observation metadata of a source asset (snake_case keys; a missing time is left out)."""
    return {snake_case(k): metadata_value(v) for k, v in counts.items() if v is not None}


def phase_result(
    svc: MemoryService,
    counts: Mapping[str, Any],
    changed: Sequence[Mapping[str, Any]] | pd.DataFrame = (),
    extra: Mapping[str, Any] | None = None,
) -> dg.MaterializeResult:
    """MaterializeResult with the phase counts, the note table version and a preview."""
    metadata: dict[str, Any] = {}
    for key, value in counts.items():
        metadata[snake_case(key)] = metadata_value(value)
    metadata["note_table_version"] = svc.store.notes.version
    metadata["preview"] = dg.MetadataValue.md(preview_markdown(changed))
    for key, value in (extra or {}).items():
        metadata[snake_case(key)] = (
            value if isinstance(value, dg.MetadataValue) else metadata_value(value)
        )
    return dg.MaterializeResult(metadata=metadata)
