"""Per-agent partitioned twins of the Memory Manager phase assets.

Each phase asset of the cycle (extraction, hardening) and of maintenance (importance,
consolidation, contradictions, stale pruning, TTL/decay) has a twin under
``by_agent/`` partitioned by :data:`~assets.common.AGENT_PARTITIONS`: materializing one
partition runs the same phase code restricted to that agent's notes, examples,
conversations and runs (``_shared``: the notes without an agent). Partitions are
independent, so several run at once (one run per partition; see the run queue limit in
the instance config) and any set of them can be backfilled from the UI. The
unpartitioned assets stay for small installs; a deployment schedules one family or the
other, not both (they write the same note table).

Compaction and the inventory are table-wide and stay unpartitioned (the
``memory_note_compaction`` job compacts the table in a partitioned deployment).
"""

from collections.abc import Callable, Sequence

import dagster as dg

from memory_pipelines.assets import (
    consolidation,
    contradictions,
    decay,
    extraction,
    hardening,
    importance,
    pruning,
)
from memory_pipelines.assets.common import (
    AGENT_PARTITIONS,
    BY_AGENT_PREFIX,
    CYCLE_BY_AGENT_GROUP,
    KINDS,
    MAINTENANCE_BY_AGENT_GROUP,
    OWNERS,
)
from memory_pipelines.assets.sources import AGENT_RUNS, RATED_CONVERSATIONS
from memory_pipelines.resources.memory_api import MemoryApiResource
from memory_pipelines.service import MemoryService

Compute = Callable[[dg.AssetExecutionContext, MemoryService, str | None], dg.MaterializeResult]

_PARTITION_NOTE = (
    "\n\nPartitioned by agent: a partition works on that agent's notes only (``_shared``: "
    "the notes without an agent); caps and the uniqueness percentile cohort are per "
    "partition."
)


def by_agent_key(asset: dg.AssetsDefinition) -> dg.AssetKey:
    """The key of ``asset``'s partitioned twin."""
    return dg.AssetKey([BY_AGENT_PREFIX, *asset.key.path])


def partitioned_twin(
    asset: dg.AssetsDefinition,
    compute: Compute,
    group: str,
    deps: Sequence[dg.AssetsDefinition] = (),
    sources: Sequence[dg.AssetKey] = (),
) -> dg.AssetsDefinition:
    """The per-agent twin of an unpartitioned phase asset: same description and tags,
    key under ``by_agent/``, partitioned by agent, ``compute`` given the partition key;
    upstream of it the twins of ``deps`` and the (unpartitioned) ``sources``."""

    @dg.asset(
        key=by_agent_key(asset),
        group_name=group,
        kinds=KINDS,
        owners=OWNERS,
        tags=dict(asset.specs_by_key[asset.key].tags),
        partitions_def=AGENT_PARTITIONS,
        deps=[*(by_agent_key(d) for d in deps), *sources],
        description=(asset.descriptions_by_key.get(asset.key) or "") + _PARTITION_NOTE,
    )
    def _twin(context: dg.AssetExecutionContext, memory: MemoryApiResource) -> dg.MaterializeResult:
        return compute(context, memory.get_service(), context.partition_key)

    return _twin


extracted_notes = partitioned_twin(
    extraction.extracted_notes,
    extraction.materialize_notes,
    CYCLE_BY_AGENT_GROUP,
    sources=[RATED_CONVERSATIONS, AGENT_RUNS],
)
extracted_examples = partitioned_twin(
    extraction.extracted_examples,
    extraction.materialize_examples,
    CYCLE_BY_AGENT_GROUP,
    sources=[RATED_CONVERSATIONS],
)
hardened_notes = partitioned_twin(
    hardening.hardened_notes,
    hardening.materialize,
    CYCLE_BY_AGENT_GROUP,
    deps=[extraction.extracted_notes, extraction.extracted_examples],
)
note_importance = partitioned_twin(
    importance.note_importance,
    importance.materialize,
    MAINTENANCE_BY_AGENT_GROUP,
    deps=[hardening.hardened_notes],
)
consolidated_notes = partitioned_twin(
    consolidation.consolidated_notes,
    consolidation.materialize,
    MAINTENANCE_BY_AGENT_GROUP,
    deps=[importance.note_importance],
)
resolved_contradictions = partitioned_twin(
    contradictions.resolved_contradictions,
    contradictions.materialize,
    MAINTENANCE_BY_AGENT_GROUP,
    deps=[consolidation.consolidated_notes],
)
pruned_notes = partitioned_twin(
    pruning.pruned_notes,
    pruning.materialize,
    MAINTENANCE_BY_AGENT_GROUP,
    deps=[contradictions.resolved_contradictions],
)
decayed_notes = partitioned_twin(
    decay.decayed_notes, decay.materialize, MAINTENANCE_BY_AGENT_GROUP, deps=[pruning.pruned_notes]
)
