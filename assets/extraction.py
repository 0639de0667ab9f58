"""Extraction assets: the notes and examples the Memory Manager mines from new activity."""

import dagster as dg

from memory_pipelines.assets.common import (
    CYCLE_GROUP,
    phase_asset,
    phase_result,
    preview_markdown,
)
from memory_pipelines.assets.sources import (
    AGENT_RUNS,
    DATA_VERSION_TAG,
    RATED_CONVERSATIONS,
    source_observations,
)
from memory_pipelines.resources.memory_api import MemoryApiResource
from memory_pipelines.service import MemoryService


@phase_asset("extraction", CYCLE_GROUP, [RATED_CONVERSATIONS, AGENT_RUNS])
def extracted_notes(
    context: dg.AssetExecutionContext, memory: MemoryApiResource
) -> dg.MaterializeResult:
    """Notes mined from new conversation messages, high-value runs and failed runs.

    First records an observation of ``rated_conversations`` and ``agent_runs`` (the data
    version this cycle read), then folds the injection events recorded since the fold cursor into access counts.
    Then reads the conversations of memory-using agents with messages past their cursor,
    high-value agent runs and failed agent runs; asks the judge for durable notes;
    keeps confidence ≥ 80 and length ≥ 10; dedupes (exact restatement, then vector
    near-duplicates judged by the LLM); writes new Active MemoryManager notes with
    deterministic ids and revokes merge targets with lineage (Immutable and Protected
    targets are kept). A message or failed run is mined once; a judge failure leaves
    that conversation for the next cycle.
    """
    return materialize_notes(context, memory.get_service())


@phase_asset("extraction", CYCLE_GROUP, [RATED_CONVERSATIONS], writes="examples")
def extracted_examples(
    context: dg.AssetExecutionContext, memory: MemoryApiResource
) -> dg.MaterializeResult:
    """Input/output examples mined from new conversation messages.

    Reads the conversations of memory-using agents with messages past their examples
    cursor and the agent's Active examples; asks the judge for examples; keeps success
    ≥ 70 and confidence ≥ 70; rejects an exact input already stored or a near-duplicate
    (cosine ≥ 0.7) the judge calls redundant; writes Active auto-generated examples with
    deterministic ids.
    """
    return materialize_examples(context, memory.get_service())


def materialize_notes(
    context: dg.AssetExecutionContext, svc: MemoryService, partition: str | None = None
) -> dg.MaterializeResult:
    """What ``extracted_notes`` (or, with a ``partition``, its per-agent twin) computes."""
    for observed in source_observations(svc).values():
        context.log_event(
            dg.AssetObservation(
                asset_key=observed.asset_key,
                metadata=observed.metadata,
                tags={DATA_VERSION_TAG: observed.data_version.value},
            )
        )
    fold = svc.manager.fold_injection_events(context.run_id, partition)
    report = svc.manager.extract_notes(context.run_id, partition)
    context.log.info(
        "created %s notes from %s conversations and %s agent runs (%s rejected, %s judge failures)",
        report["notesCreated"],
        report["conversationsProcessed"],
        report["agentRunsProcessed"],
        report["notesRejected"],
        report["noteJudgeFailures"],
    )
    rejected = report.extra.get("rejectedNotes", [])
    return phase_result(
        svc,
        {**report, **{f"fold_{k}": v for k, v in fold.items()}},
        report.changed,
        {"rejected": dg.MetadataValue.md(preview_markdown(rejected) if rejected else "_none_")},
    )


def materialize_examples(
    context: dg.AssetExecutionContext, svc: MemoryService, partition: str | None = None
) -> dg.MaterializeResult:
    """What ``extracted_examples`` (or, with a ``partition``, its per-agent twin) computes."""
    report = svc.manager.extract_examples(context.run_id, partition)
    context.log.info(
        "created %s examples from %s conversations",
        report["examplesCreated"],
        report["conversationsProcessed"],
    )
    return phase_result(svc, report, report.changed)
