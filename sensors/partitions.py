"""The per-agent partitioned jobs, the sensor that keeps the agent partitions in sync,
and the schedule and sensor that start partition runs.

* ``memory_agent_partitions`` (stopped by default, like every trigger here: turn it on
  with the partitioned jobs): adds a partition for every agent in
  the agents table (and for every agent that still has notes), plus ``_shared``; removes
  the partitions of agents that are gone and have no injectable note left.
* ``memory_manager_cycle_by_agent`` / ``memory_maintenance_by_agent``: the cycle and the
  maintenance phases of one agent partition; backfill them from the UI (asset groups
  ``memory_manager_by_agent`` / ``memory_maintenance_by_agent``) or let the schedule and
  sensor below start them. ``memory_note_compaction`` compacts the table for them.
* ``memory_manager_cycle_by_agent_every_15_minutes`` and
  ``memory_maintenance_by_agent_trigger`` are stopped by default: a deployment that
  switches to the partitioned jobs turns them on and leaves the unpartitioned schedule
  and sensor off (both families write the same note table).
"""

import dagster as dg

from memory_pipelines.assets.common import (
    AGENT_PARTITIONS,
    CYCLE_BY_AGENT_GROUP,
    MAINTENANCE_BY_AGENT_GROUP,
)
from memory_pipelines.assets.compaction import compacted_note_tables
from memory_pipelines.jobs.executors import executor_from_env
from memory_pipelines.partitions import is_valid_key, partition_keys
from memory_pipelines.phases.ebbinghaus import iso
from memory_pipelines.phases.triggers import last_maintenance_at, maintenance_trigger
from memory_pipelines.resources.memory_api import MemoryApiResource
from memory_pipelines.sensors.maintenance_trigger import IN_FLIGHT, TRIGGER_TAG
from memory_pipelines.service import MemoryService
from memory_pipelines.store import injectable

CYCLE_JOB = "memory_manager_cycle_by_agent"
MAINTENANCE_JOB = "memory_maintenance_by_agent"
COMPACTION_JOB = "memory_note_compaction"

memory_manager_cycle_by_agent = dg.define_asset_job(
    name=CYCLE_JOB,
    selection=dg.AssetSelection.groups(CYCLE_BY_AGENT_GROUP),
    partitions_def=AGENT_PARTITIONS,
    executor_def=executor_from_env(),
    description="Extraction then hardening of one agent partition.",
    tags={"memory/job": "cycle_by_agent"},
)

memory_maintenance_by_agent = dg.define_asset_job(
    name=MAINTENANCE_JOB,
    selection=dg.AssetSelection.groups(MAINTENANCE_BY_AGENT_GROUP),
    partitions_def=AGENT_PARTITIONS,
    executor_def=executor_from_env(),
    description=(
        "The five maintenance phases of one agent partition: importance -> consolidation "
        "-> contradictions -> stale pruning -> TTL/decay."
    ),
    tags={"memory/job": "maintenance_by_agent"},
)

memory_note_compaction = dg.define_asset_job(
    name=COMPACTION_JOB,
    selection=dg.AssetSelection.assets(compacted_note_tables),
    executor_def=executor_from_env(),
    description="Compaction of the note and example tables (for partitioned deployments).",
    tags={"memory/job": "compaction"},
)

memory_note_compaction_daily = dg.ScheduleDefinition(
    name="memory_note_compaction_daily",
    job=memory_note_compaction,
    cron_schedule="30 4 * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Daily compaction for a deployment that runs the partitioned jobs.",
)


def _agent_ids_with_notes(svc: MemoryService) -> set[str]:
    df = svc.store.notes.scan(injectable(), columns=["agent_id"])
    return set(df["agent_id"].dropna().astype(str)) if len(df) else set()


@dg.sensor(minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.STOPPED)
def memory_agent_partitions(
    context: dg.SensorEvaluationContext, memory: MemoryApiResource
) -> dg.SensorResult | dg.SkipReason:
    """Keeps the ``memory_agents`` partitions equal to the agents (configured, or still
    owning injectable notes) plus ``_shared``. Agent ids Dagster refuses as partition keys
    (containing '...' or control characters) are skipped and logged; their notes are
    maintained by the unpartitioned jobs."""
    svc = memory.get_service()
    configured = {a.agent_id for a in svc.sources.list_agents()}
    agents = configured | _agent_ids_with_notes(svc)
    refused = sorted(a for a in agents if not is_valid_key(a))
    if refused:
        context.log.warning("agent ids that cannot be partition keys: %s", refused)
    wanted = partition_keys(agents)
    current = set(context.instance.get_dynamic_partitions(AGENT_PARTITIONS.name))
    added = [k for k in wanted if k not in current]
    removed = sorted(current - set(wanted))
    if not added and not removed:
        return dg.SkipReason(f"{len(current)} agent partitions already in sync")
    requests = []
    if added:
        requests.append(AGENT_PARTITIONS.build_add_request(added))
    if removed:
        requests.append(AGENT_PARTITIONS.build_delete_request(removed))
    context.log.info("partitions added %s, removed %s", added, removed)
    return dg.SensorResult(dynamic_partitions_requests=requests)


@dg.schedule(
    job=memory_manager_cycle_by_agent,
    cron_schedule="*/15 * * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    name="memory_manager_cycle_by_agent_every_15_minutes",
)
def memory_manager_cycle_by_agent_schedule(
    context: dg.ScheduleEvaluationContext,
) -> list[dg.RunRequest] | dg.SkipReason:
    """A cycle run for every agent partition every 15 minutes (one run key per partition
    and tick, so a tick never starts a partition twice)."""
    keys = context.instance.get_dynamic_partitions(AGENT_PARTITIONS.name)
    if not keys:
        return dg.SkipReason("no agent partitions yet (see the memory_agent_partitions sensor)")
    tick = context.scheduled_execution_time.isoformat()
    return [dg.RunRequest(run_key=f"{key}:{tick}", partition_key=key) for key in keys]


@dg.sensor(
    job=memory_maintenance_by_agent,
    minimum_interval_seconds=300,
    default_status=dg.DefaultSensorStatus.STOPPED,
)
def memory_maintenance_by_agent_trigger(
    context: dg.SensorEvaluationContext, memory: MemoryApiResource
) -> list[dg.RunRequest] | dg.SkipReason:
    """Requests a maintenance run for each agent partition whose own trigger fires (time
    since its last maintenance, N of its cycles, or 100 new notes of the agent).

    Skips partitions with a maintenance run queued or running. The run key names the
    partition, its last maintenance, the trigger and the hour, so one state of a partition
    starts at most one run per hour.
    """
    svc = memory.get_service()
    busy = {
        run.tags.get("dagster/partition")
        for run in context.instance.get_runs(
            filters=dg.RunsFilter(job_name=MAINTENANCE_JOB, statuses=IN_FLIGHT)
        )
    }
    hour = svc.now().strftime("%Y-%m-%dT%H")
    requests = []
    skipped = []
    for key in context.instance.get_dynamic_partitions(AGENT_PARTITIONS.name):
        if key in busy:
            skipped.append(f"{key}: in progress")
            continue
        should, trigger = maintenance_trigger(svc.context, partition=key)
        if not should:
            skipped.append(f"{key}: {trigger}")
            continue
        last = last_maintenance_at(svc.context, key)
        requests.append(
            dg.RunRequest(
                run_key=f"maintenance:{key}:{iso(last) if last else 'never'}:{trigger}:{hour}",
                partition_key=key,
                tags={TRIGGER_TAG: trigger},
            )
        )
    if not requests:
        return dg.SkipReason("; ".join(skipped) or "no agent partitions yet")
    return requests


JOBS = [memory_manager_cycle_by_agent, memory_maintenance_by_agent, memory_note_compaction]
SCHEDULES = [memory_manager_cycle_by_agent_schedule, memory_note_compaction_daily]
SENSORS = [memory_agent_partitions, memory_maintenance_by_agent_trigger]
