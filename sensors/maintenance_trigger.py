"""The maintenance job and its one trigger, the ``memory_maintenance_trigger`` sensor
(stopped by default).

The job runs the five maintenance phases in order (importance -> consolidation ->
contradictions -> stale pruning -> TTL/decay), then the note inventory and the notes the
run changed (``note_changes``), with the executor ``MEMORY_EXECUTOR`` picks (in process
by default).
The sensor asks ``maintenance_trigger`` every five minutes (the configured frequency
since the last maintenance, daily by default; N cycles; or 100 new notes for one agent)
and requests a run when it fires, so it also covers the reference's daily maintenance:
no separate schedule competes with it. The trigger type travels as the run tag
``memory/maintenance_trigger`` and is recorded with the run.
"""

import dagster as dg

from memory_pipelines.assets.common import MAINTENANCE_GROUP
from memory_pipelines.jobs.executors import executor_from_env
from memory_pipelines.phases.ebbinghaus import iso
from memory_pipelines.phases.triggers import last_maintenance_at, maintenance_trigger
from memory_pipelines.resources.memory_api import MemoryApiResource

JOB_NAME = "memory_maintenance"
TRIGGER_TAG = "memory/maintenance_trigger"

memory_maintenance = dg.define_asset_job(
    name=JOB_NAME,
    selection=dg.AssetSelection.groups(MAINTENANCE_GROUP)
    | dg.AssetSelection.assets("note_inventory", "note_changes"),
    executor_def=executor_from_env(),
    description=(
        "The gated maintenance phases: importance -> consolidation -> contradictions -> "
        "stale pruning -> TTL/decay, then the note inventory and the notes the run changed."
    ),
    tags={"memory/job": "maintenance"},
)

#: Run statuses that count as queued or running.
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


@dg.sensor(
    job=memory_maintenance,
    minimum_interval_seconds=300,
    default_status=dg.DefaultSensorStatus.STOPPED,
)
def memory_maintenance_trigger(
    context: dg.SensorEvaluationContext, memory: MemoryApiResource
) -> dg.RunRequest | dg.SkipReason:
    """Requests a maintenance run when the trigger fires (time since the last
    maintenance, N cycles, or 100 new auto-generated notes for one agent).

    Skips while a maintenance run is queued or running. The run key names the last
    maintenance, the trigger and the hour, so one state of the pool starts at most one
    run per hour (a failed run is retried the next hour); the cursor holds the last run
    key requested.
    """
    in_flight = context.instance.get_runs(
        filters=dg.RunsFilter(job_name=JOB_NAME, statuses=IN_FLIGHT), limit=1
    )
    if in_flight:
        return dg.SkipReason(f"maintenance run {in_flight[0].run_id} is still in progress")
    svc = memory.get_service()
    should, trigger = maintenance_trigger(svc.context)
    if not should:
        return dg.SkipReason(f"maintenance not triggered ({trigger})")
    last = last_maintenance_at(svc.context)
    # one request per (last maintenance, trigger, hour): a failed run is retried next hour
    hour = svc.now().strftime("%Y-%m-%dT%H")
    run_key = f"maintenance:{iso(last) if last else 'never'}:{trigger}:{hour}"
    if run_key == context.cursor:
        return dg.SkipReason(f"maintenance already requested for {run_key}")
    context.update_cursor(run_key)
    return dg.RunRequest(run_key=run_key, tags={TRIGGER_TAG: trigger})


JOBS = [memory_maintenance]
SCHEDULES: list[dg.ScheduleDefinition] = []
SENSORS = [memory_maintenance_trigger]
