"""The Memory Manager cycle job, its 15-minute schedule and its new-activity sensor."""

import json

import dagster as dg

from memory_pipelines.assets.common import CYCLE_GROUP
from memory_pipelines.resources.memory_api import MemoryApiResource
from memory_pipelines.sensors.executors import executor_from_env

memory_manager_cycle = dg.define_asset_job(
    name="memory_manager_cycle",
    selection=dg.AssetSelection.groups(CYCLE_GROUP),
    executor_def=executor_from_env(),
    description="Extraction then hardening: the every-cycle part of the Memory Manager.",
    tags={"memory/job": "cycle"},
)

memory_manager_cycle_schedule = dg.ScheduleDefinition(
    name="memory_manager_cycle_every_15_minutes",
    job=memory_manager_cycle,
    cron_schedule="*/15 * * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="The reference schedule: a Memory Manager cycle every 15 minutes.",
)


@dg.sensor(
    job=memory_manager_cycle,
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
)
def memory_manager_cycle_sensor(
    context: dg.SensorEvaluationContext, memory: MemoryApiResource
) -> dg.RunRequest | dg.SkipReason:
    """Starts a cycle as soon as new rated messages or a provisional backlog appear.

    The cursor holds the newest rated-message time and the newest provisional-note time
    already acted on; the run key is derived from the new cursor, so one state of the
    sources starts at most one run.
    """
    cursor = json.loads(context.cursor) if context.cursor else {}
    signal = memory.get_service().manager.cycle_signal(cursor)
    context.update_cursor(json.dumps(signal.cursor, sort_keys=True))
    if not signal.should_run:
        return dg.SkipReason(signal.reason)
    return dg.RunRequest(
        run_key=signal.run_key,
        tags={"memory/trigger": "sensor"},
    )


JOBS = [memory_manager_cycle]
SCHEDULES = [memory_manager_cycle_schedule]
SENSORS = [memory_manager_cycle_sensor]
