"""Note table asset: the LanceDB table of notes every phase reads and writes."""

import dagster as dg

from memory_pipelines.assets.common import CYCLE_GROUP, OWNERS, counts_table
from memory_pipelines.assets.hardening import hardened_notes
from memory_pipelines.inventory import note_table_state
from memory_pipelines.resources.memory_api import MemoryApiResource


@dg.asset(
    group_name=CYCLE_GROUP,
    kinds={"lancedb", "table"},
    owners=OWNERS,
    tags={"phase": "note_table", "writes": "nothing"},
    deps=[hardened_notes],
)
def note_table(
    context: dg.AssetExecutionContext, memory: MemoryApiResource
) -> dg.MaterializeResult:
    """The LanceDB note table after the cycle: what injection reads and maintenance works on.

    Extraction and hardening write it, the maintenance phases rewrite it; this asset
    stands for the table itself, so the graph reads sources -> extraction -> hardening ->
    note table -> maintenance. Materializing it writes nothing: it records the table's
    version, its rows and data fragments, and the notes by status.
    """
    state = note_table_state(memory.get_service().context)
    context.log.info(
        "note table version %s: %s rows in %s fragments",
        state["table_version"],
        state["rows"],
        state["fragments"],
    )
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": dg.MetadataValue.int(state["rows"]),
            "note_table_version": dg.MetadataValue.int(state["table_version"]),
            "fragments": dg.MetadataValue.int(state["fragments"]),
            "notes_by_status": counts_table("status", state["by_status"]),
        }
    )
