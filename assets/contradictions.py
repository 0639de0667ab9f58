"""Contradictions asset: contradicting notes of one scope resolved or flagged."""

import dagster as dg

from memory_pipelines.assets.common import (
    MAINTENANCE_GROUP,
    phase_asset,
    phase_result,
)
from memory_pipelines.assets.consolidation import consolidated_notes
from memory_pipelines.phases import contradictions
from memory_pipelines.resources.memory_api import MemoryApiResource
from memory_pipelines.service import MemoryService


@phase_asset("contradictions", MAINTENANCE_GROUP, [consolidated_notes])
def resolved_contradictions(
    context: dg.AssetExecutionContext, memory: MemoryApiResource
) -> dg.MaterializeResult:
    """Contradictions between notes of one scope, resolved by the authority order or flagged.

    Reads Active auto-generated non-Immutable seeds (newest first) and, per seed, the
    other injectable non-Immutable notes of exactly its scope at cosine >= 0.70 (top 5).
    At most 50 pairs per run; pairs both created by this run's consolidation, and pairs
    already judged with the same texts, are skipped. A contradiction between two notes
    scored >= 7.0, or involving a Protected note, is flagged on both (comment appended);
    otherwise the loser becomes Revoked with ``consolidated_into_note_id`` = the keeper
    and an appended comment. A judge failure leaves the pair alone.
    """
    return materialize(context, memory.get_service())


def materialize(
    context: dg.AssetExecutionContext, svc: MemoryService, partition: str | None = None
) -> dg.MaterializeResult:
    """What ``resolved_contradictions`` (or, with a ``partition``, its per-agent twin) computes."""
    report = contradictions.run(svc.context, context.run_id, partition)
    context.log.info(
        "analysed %s pairs: %s resolved, %s flagged",
        report["pairsAnalyzed"],
        report["contradictionsResolved"],
        report["contradictionsFlagged"],
    )
    return phase_result(svc, report, report.changed, report.extra)
