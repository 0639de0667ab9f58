"""Compaction asset: the note and example tables merged into few files, indexes current."""

import dagster as dg

from memory_pipelines.assets.common import (
    MAINTENANCE_GROUP,
    phase_asset,
    phase_result,
)
from memory_pipelines.assets.decay import decayed_notes
from memory_pipelines.resources.memory_api import MemoryApiResource


@phase_asset("compaction", MAINTENANCE_GROUP, [decayed_notes])
def compacted_note_tables(
    context: dg.AssetExecutionContext, memory: MemoryApiResource
) -> dg.MaterializeResult:
    """The note and example tables after compaction.

    Reads the note and example tables after the five maintenance phases. Every write to
    LanceDB is a new table version with small files; this merges them, folds new rows into the full-text and scalar
    indexes (creating the Bitmap indexes on agent, status, user and company when
    missing, and the BTree index on id from 1,000 rows) and removes table versions older
    than an hour. No note changes. Between two runs the store compacts small fragments on
    its own (every 32 commits of a process), so reads do not wait for this asset.
    """
    svc = memory.get_service()
    return phase_result(svc, svc.compact(run_id=context.run_id))
