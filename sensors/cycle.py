"""The Memory Manager cycle job and its one trigger, a 15-minute schedule (stopped by
default).

The job observes the SQL sources, extracts, hardens, records the note table and lists
the notes it changed (``note_changes``). One schedule, not a schedule and a sensor: the
cycle mines rated messages, agent runs and the provisional backlog, and every tick of
the schedule looks at all of them.
"""

import dagster as dg

from memory_pipelines.assets.common import CYCLE_GROUP
from memory_pipelines.jobs.executors import executor_from_env

memory_manager_cycle = dg.define_asset_job(
    name="memory_manager_cycle",
    selection=dg.AssetSelection.groups(CYCLE_GROUP) | dg.AssetSelection.assets("note_changes"),
    executor_def=executor_from_env(),
    description=(
        "Extraction then hardening, then the note table's numbers and the notes the run "
        "changed: the every-cycle part of the Memory Manager."
    ),
    tags={"memory/job": "cycle"},
)

memory_manager_cycle_schedule = dg.ScheduleDefinition(
    name="memory_manager_cycle_every_15_minutes",
    job=memory_manager_cycle,
    cron_schedule="*/15 * * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description=(
        "The cycle's one trigger: a memory_manager_cycle run every 15 minutes (UTC). "
        "Stopped until an operator turns it on, so opening the UI starts nothing."
    ),
)


JOBS = [memory_manager_cycle]
SCHEDULES = [memory_manager_cycle_schedule]
SENSORS: list[dg.SensorDefinition] = []
