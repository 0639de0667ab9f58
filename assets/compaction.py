"""Compaction asset: the note and example tables merged into few files, indexes current."""

import dagster as dg

from assets.common import KINDS, MAINTENANCE_GROUP, NOTE_TABLE_POOL, OWNERS, phase_result
from assets.decay import decayed_notes
from memory_pipelines.phases import compaction
from resources.memory_api import MemoryApiResource


@dg.asset(
    group_name=MAINTENANCE_GROUP,
    kinds=KINDS,
    owners=OWNERS,
    tags={"phase": "compaction", "writes": "notes"},
    pool=NOTE_TABLE_POOL,
    deps=[decayed_notes],
)
def compacted_note_tables(
    context: dg.AssetExecutionContext, memory: MemoryApiResource
) -> dg.MaterializeResult:
    """The note and example tables after compaction.

    Reads the note and example tables after the five maintenance phases. Every write to
    LanceDB is a new table version with small files; this merges them, folds new rows into the full-text and scalar
    indexes (creating the Bitmap indexes on agent, status, user and company when
    missing) and removes table versions older than an hour. No note changes.
    """
    svc = memory.get_service()
    report = compaction.run(svc.context, context.run_id)
    return phase_result(svc, report)
