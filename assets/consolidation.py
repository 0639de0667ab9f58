"""Consolidation asset: clusters of similar auto-generated notes merged into one note each."""

import dagster as dg

from memory_pipelines.assets.common import (
    MAINTENANCE_GROUP,
    phase_asset,
    phase_result,
)
from memory_pipelines.assets.importance import note_importance
from memory_pipelines.phases import consolidation
from memory_pipelines.resources.memory_api import MemoryApiResource
from memory_pipelines.service import MemoryService


@phase_asset("consolidation", MAINTENANCE_GROUP, [note_importance])
def consolidated_notes(
    context: dg.AssetExecutionContext, memory: MemoryApiResource
) -> dg.MaterializeResult:
    """Consolidated notes: each cluster of similar auto-generated notes of one scope,
    synthesised by the judge into one note.

    Reads Active auto-generated Standard/Ephemeral notes and their vectors, grouped by
    exact scope (never across users or companies). Greedy single pass at cosine >= 0.60
    (top 10 per seed); clusters of 3 to 7 notes (2 when the seed is Ephemeral; larger
    clusters cut into chunks of 7). Clusters of generation >= 3 are re-synthesised from
    their generation-0 originals. Writes the new note first (deterministic id, the
    cluster's scope, lineage in ``derived_from_note_ids``, a verification marker when
    source entities are missing), then revokes the sources into it; a run interrupted
    in between is completed by the next one. A judge failure leaves the cluster alone.
    """
    return materialize(context, memory.get_service())


def materialize(
    context: dg.AssetExecutionContext, svc: MemoryService, partition: str | None = None
) -> dg.MaterializeResult:
    """What ``consolidated_notes`` (or, with a ``partition``, its per-agent twin) computes."""
    trigger = context.run.tags.get("memory/maintenance_trigger", "manual")
    report = consolidation.run(svc.context, context.run_id, partition, trigger_type=trigger)
    context.log.info(
        "consolidated %s clusters, revoked %s sources",
        report["consolidatedClusterCount"],
        report["sourceNotesArchived"],
    )
    return phase_result(svc, report, report.changed, report.extra)
