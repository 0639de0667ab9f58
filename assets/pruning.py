"""Stale-reference pruning asset: notes whose agent, user, company or conversation is gone."""

import dagster as dg

from memory_pipelines.assets.common import (
    MAINTENANCE_GROUP,
    phase_asset,
    phase_result,
)
from memory_pipelines.assets.contradictions import resolved_contradictions
from memory_pipelines.phases import pruning
from memory_pipelines.resources.memory_api import MemoryApiResource
from memory_pipelines.service import MemoryService


@phase_asset("pruning", MAINTENANCE_GROUP, [resolved_contradictions])
def pruned_notes(
    context: dg.AssetExecutionContext, memory: MemoryApiResource
) -> dg.MaterializeResult:
    """Auto-generated notes archived because what they refer to no longer exists.

    Reads the references of every Active auto-generated non-Immutable note and checks
    them against the sources: an agent that is inactive or deleted, a deleted user,
    company or source conversation. The oldest stale notes (at most 200 per run) become
    Archived with "[Archived by Memory Manager: stale reference pruning - <reasons> on
    <time>]" appended to their comments.
    """
    return materialize(context, memory.get_service())


def materialize(
    context: dg.AssetExecutionContext, svc: MemoryService, partition: str | None = None
) -> dg.MaterializeResult:
    """What ``pruned_notes`` (or, with a ``partition``, its per-agent twin) computes."""
    report = pruning.run(svc.context, context.run_id, partition)
    context.log.info("archived %s stale notes", report["notesArchived"])
    return phase_result(svc, report, report.changed, report.extra)
