"""TTL and decay asset: expired and faded notes and examples archived."""

import dagster as dg

from memory_pipelines.assets.common import (
    MAINTENANCE_GROUP,
    phase_asset,
    phase_result,
)
from memory_pipelines.assets.pruning import pruned_notes
from memory_pipelines.phases import decay
from memory_pipelines.phases.maintenance_run import finish_maintenance
from memory_pipelines.resources.memory_api import MemoryApiResource
from memory_pipelines.service import MemoryService


@phase_asset("decay", MAINTENANCE_GROUP, [pruned_notes])
def decayed_notes(
    context: dg.AssetExecutionContext, memory: MemoryApiResource
) -> dg.MaterializeResult:
    """Notes and examples archived by their TTL or by Ebbinghaus decay.

    Reads injectable notes and Active examples with an ``expires_at``, and the Active
    auto-generated scored notes (and examples below success score 50) of agents with
    ``auto_archive_enabled``. TTL: anything past ``expires_at`` (at most 200 notes and
    200 examples; never Immutable) becomes Archived with an "expired on" comment. Decay:
    a note of importance I untouched for t days keeps
    ``min(1, exp(-0.16 (1 - 0.8 I/10) t) * min(1.5, 1 + 0.2 access_count))`` of its score
    (twice the rate when Ephemeral); below 0.5 it is Archived with a comment, otherwise
    the decayed score is saved. Protected notes are exempt for 365 days since last
    access, Immutable notes always. Being the last phase, it records the maintenance run
    (``manager_runs``, last-maintenance time) when all five phases ran in this run.
    """
    return materialize(context, memory.get_service())


def materialize(
    context: dg.AssetExecutionContext, svc: MemoryService, partition: str | None = None
) -> dg.MaterializeResult:
    """What ``decayed_notes`` (or, with a ``partition``, its per-agent twin) computes."""
    report = decay.run(svc.context, context.run_id, partition)
    trigger = context.run.tags.get("memory/maintenance_trigger", "manual")
    recorded = finish_maintenance(svc.context, context.run_id, trigger, partition)
    context.log.info(
        "expired %s notes + %s examples; decay archived %s notes + %s examples; run %s",
        report["notesExpired"],
        report["examplesExpired"],
        report["notesArchived"],
        report["examplesArchived"],
        recorded["status"],
    )
    return phase_result(
        svc, report, report.changed, {**report.extra, "maintenance_status": recorded["status"]}
    )
