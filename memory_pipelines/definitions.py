"""The one ``dagster.Definitions`` of the project (the code location of workspace.yaml).

``defs`` holds every asset and asset check under ``assets/`` (the cycle and
maintenance phases), the jobs, schedules and sensors of ``sensors/``, and the ``memory``
resource bound to ``MEMORY_HOME``. Asset keys, groups and kinds never depend on the
environment; only the resource configuration and the executor do. Runs execute in
process by default (each step would otherwise re-import LanceDB and litellm in a fresh
process); ``MEMORY_EXECUTOR`` selects ``multiprocess`` or ``dask`` instead (see
``jobs/executors.py``).

This is the only module of the domain that imports Dagster. The helpers that execute its
jobs (``execute_jobs``, ``execute_partition_run``, ``add_partitions``) are apps: they
live in :mod:`jobs.runs`.
"""

import dagster as dg

from memory_pipelines import assets
from memory_pipelines.jobs.executors import executor_from_env
from memory_pipelines.resources.memory_api import memory_api_from_env
from memory_pipelines.sensors import cycle, maintenance_trigger, partitions

defs = dg.Definitions(
    assets=dg.load_assets_from_package_module(assets),
    asset_checks=dg.load_asset_checks_from_package_module(assets),
    jobs=[*cycle.JOBS, *maintenance_trigger.JOBS, *partitions.JOBS],
    schedules=[*cycle.SCHEDULES, *maintenance_trigger.SCHEDULES, *partitions.SCHEDULES],
    sensors=[*cycle.SENSORS, *maintenance_trigger.SENSORS, *partitions.SENSORS],
    resources={"memory": memory_api_from_env()},
    executor=executor_from_env(),
)
