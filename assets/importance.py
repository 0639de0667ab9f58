"""Importance asset: every Active note scored 0-10; outstanding Standard notes protected."""

import dagster as dg

from memory_pipelines.assets.common import (
    MAINTENANCE_GROUP,
    phase_asset,
    phase_result,
)
from memory_pipelines.assets.note_table import note_table
from memory_pipelines.phases import importance
from memory_pipelines.resources.memory_api import MemoryApiResource
from memory_pipelines.service import MemoryService


@phase_asset("importance", MAINTENANCE_GROUP, [note_table])
def note_importance(
    context: dg.AssetExecutionContext, memory: MemoryApiResource
) -> dg.MaterializeResult:
    """Every Active note's importance (0-10), recomputed from seven weighted signals.

    Reads the injectable notes with their vectors and the injection events. Signals:
    recency (0.995 per hour), a comment-based LLM importance, relevance from how often
    and how recently the note was injected, uniqueness (1 - similarity to the closest
    *other* note of its scope), correction boost, goal alignment (unavailable) and the
    human mark; unavailable weight is spread over the available signals. Writes
    ``importance_score``; a Standard note scoring >= 8.0, or with uniqueness at/above
    the 95th percentile of a cohort of at least 20, becomes Protected with an appended
    comment. Never demotes, never makes a note Immutable.
    """
    return materialize(context, memory.get_service())


def materialize(
    context: dg.AssetExecutionContext, svc: MemoryService, partition: str | None = None
) -> dg.MaterializeResult:
    """What ``note_importance`` (or, with a ``partition``, its per-agent twin) computes."""
    report = importance.run(svc.context, context.run_id, partition)
    context.log.info(
        "scored %s notes, %s promoted", report["notesScored"], report["tierPromotions"]
    )
    return phase_result(svc, report, report.changed, report.extra)
