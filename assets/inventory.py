"""Inventory asset: a pandas view of the note pool and of what the last maintenance did."""

import dagster as dg

from assets.common import ANALYST_GROUP, OWNERS
from assets.decay import decayed_notes
from memory_pipelines.maintenance import maintenance_inventory
from resources.memory_api import MemoryApiResource


@dg.asset(
    group_name=ANALYST_GROUP,
    kinds={"lancedb", "pandas"},
    owners=OWNERS,
    tags={"phase": "inventory", "writes": "nothing"},
    deps=[decayed_notes],
)
def note_inventory(
    context: dg.AssetExecutionContext, memory: MemoryApiResource
) -> dg.MaterializeResult:
    """The note pool at a glance, for analysts: read-only.

    Counts of notes by status, protection tier, type, author and agent (and the agent x
    status matrix), the importance distribution of injectable notes, and per
    maintenance phase the run, time, counts and actions of the last maintenance, each as
    a markdown table in the materialization metadata.
    """
    svc = memory.get_service()
    frames = maintenance_inventory(svc)
    metadata: dict[str, dg.MetadataValue] = {}
    for name, frame in frames.items():
        text = frame.to_markdown(index=name == "agent_status") if not frame.empty else "_none_"
        metadata[name] = dg.MetadataValue.md(text)
    by_status = frames["by_status"]
    total = int(by_status["notes"].sum()) if not by_status.empty else 0
    metadata["total_notes"] = dg.MetadataValue.int(total)
    metadata["note_table_version"] = dg.MetadataValue.int(svc.store.notes.version)
    context.log.info("inventory of %s notes", total)
    return dg.MaterializeResult(metadata=metadata)
