"""Hardening asset: provisional agent-written notes promoted to Active or archived as duplicates."""

import dagster as dg

from memory_pipelines.assets.common import CYCLE_GROUP, phase_asset, phase_result
from memory_pipelines.assets.extraction import extracted_examples, extracted_notes
from memory_pipelines.resources.memory_api import MemoryApiResource
from memory_pipelines.service import MemoryService


@phase_asset("hardening", CYCLE_GROUP, [extracted_notes, extracted_examples])
def hardened_notes(
    context: dg.AssetExecutionContext, memory: MemoryApiResource
) -> dg.MaterializeResult:
    """Provisional agent-written notes, hardened: promoted to Active or archived as duplicates.

    Reads up to 200 oldest Provisional notes authored by agents and, for each, the
    Active notes of exactly its scope at cosine ≥ 0.85. A true duplicate (judge says
    so) becomes Archived with ``consolidated_into_note_id`` = the best match, which is
    reinforced; every other note becomes Active with no expiry. Each outcome is saved
    before the next check, so paraphrases within one batch consolidate. A judge failure
    leaves the note Provisional (counted as ``failed``), never archived. Records the
    cycle in ``manager_runs``.
    """
    return materialize(context, memory.get_service())


def materialize(
    context: dg.AssetExecutionContext, svc: MemoryService, partition: str | None = None
) -> dg.MaterializeResult:
    """What ``hardened_notes`` (or, with a ``partition``, its per-agent twin) computes."""
    report = svc.manager.harden(context.run_id, partition)
    svc.manager.finish_cycle(context.run_id, partition=partition)
    context.log.info(
        "hardened %s, deduped %s, failed %s of %s provisional notes",
        report["hardened"],
        report["deduped"],
        report["failed"],
        report["provisionalCount"],
    )
    return phase_result(svc, report, report.changed)
