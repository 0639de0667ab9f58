"""Job runners: execute the jobs of ``defs`` on a persistent Dagster instance.

``execute_jobs`` runs named jobs in process (``memory-pipelines demo`` and ``bench
partitions``); ``execute_partition_run`` runs one partition of a partitioned job through
its configured executor (e.g. Dask); ``add_partitions`` adds agent partitions as the
``memory_agent_partitions`` sensor would; ``free_finished_slots`` releases pool slots
that finished runs still claim; ``instance_folder`` checks a ``DAGSTER_HOME``. A run's
outcome is a :class:`JobExecution`.
``execute_jobs`` always executes in process, whatever ``MEMORY_EXECUTOR`` chooses.
"""

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from memory_pipelines.definitions import defs
from memory_pipelines.errors import ConfigError, first_line
from memory_pipelines.resources.memory_api import MemoryApiResource
from memory_pipelines.sensors import partitions

_FINISHED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)


@dataclass(frozen=True)
class JobExecution:
    """What one job execution did: its run, outcome, and per-asset / per-check results."""

    job: str
    run_id: str
    success: bool
    seconds: float
    materializations: Mapping[str, Mapping[str, Any]]
    checks: Mapping[str, bool]
    #: The checks that did not pass but only warn (severity WARN): worth a look, not a
    #: failure of the run.
    warnings: frozenset[str] = field(default_factory=frozenset)


def instance_folder(dagster_home: str) -> Path:
    """``DAGSTER_HOME`` as an absolute folder holding a usable Dagster instance.

    A missing folder is an error, not created (a typo would otherwise record runs where
    no UI looks); so is an instance Dagster cannot open (a broken ``dagster.yaml``).
    """
    folder = Path(dagster_home).expanduser().resolve()
    if not folder.is_dir():
        raise ConfigError(
            f"DAGSTER_HOME={dagster_home!r} is not a directory: create it, or unset "
            "DAGSTER_HOME to run the cycle unrecorded"
        )
    try:
        dg.DagsterInstance.from_config(str(folder)).dispose()
    except Exception as e:  # Dagster raises YAML, config-check and storage errors alike
        raise ConfigError(
            f"DAGSTER_HOME={str(folder)!r}: Dagster cannot open this instance: {first_line(e)}"
        ) from e
    return folder


def free_finished_slots(instance: dg.DagsterInstance) -> int:
    """Release pool slots still claimed by runs that have finished or vanished (a
    process killed mid-step leaves its slot claimed; ``dagster dev``'s daemon does the
    same). Returns how many runs had slots freed."""
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return 0
    freed = set()
    for pool in storage.get_concurrency_keys():
        for slot in storage.get_concurrency_info(pool).claimed_slots:
            run = instance.get_run_by_id(slot.run_id)
            if slot.run_id not in freed and (run is None or run.status in _FINISHED):
                storage.free_concurrency_slots_for_run(slot.run_id)
                freed.add(slot.run_id)
    return len(freed)


def _execution(job: str, result: Any, started: float) -> JobExecution:
    """What one finished run did, from its execution result."""
    return JobExecution(
        job=job,
        run_id=result.run_id,
        success=result.success,
        seconds=round(time.perf_counter() - started, 2),
        materializations={
            e.asset_key.to_user_string(): {
                k: v.value for k, v in e.materialization.metadata.items()
            }
            for e in result.get_asset_materialization_events()
        },
        checks={c.check_name: c.passed for c in result.get_asset_check_evaluations()},
        warnings=frozenset(
            c.check_name
            for c in result.get_asset_check_evaluations()
            if not c.passed and c.severity == dg.AssetCheckSeverity.WARN
        ),
    )


def _console_log(level: str | None) -> dict[str, Any] | None:
    """Run config setting the console logger's level (None: Dagster's default)."""
    if level is None:
        return None
    return {"loggers": {"console": {"config": {"log_level": level}}}}


def execute_jobs(
    home: str,
    job_names: Sequence[str],
    dagster_home: str,
    tags: Mapping[str, str] | None = None,
    partition_key: str | None = None,
    log_level: str | None = None,
) -> list[JobExecution]:
    """Execute the named jobs of ``defs`` in order on the persistent instance at
    ``dagster_home`` (its ``dagster.yaml`` applies), with ``memory`` bound to ``home``
    (for partitioned jobs: their ``partition_key`` partition). ``log_level`` (e.g.
    ``"WARNING"``) quiets the console log of the runs; the event log keeps everything.

    Runs are recorded in that instance, so ``dagster dev`` with the same
    ``DAGSTER_HOME`` shows them. Names not defined are skipped; a failed run is returned
    (``success`` False), not raised.
    """
    defined = {j.name for j in defs.resolve_all_job_defs()}
    out: list[JobExecution] = []
    with dg.DagsterInstance.from_config(dagster_home) as instance:
        free_finished_slots(instance)
        for name in job_names:
            if name not in defined:
                continue
            started = time.perf_counter()
            result = defs.resolve_job_def(name).execute_in_process(
                instance=instance,
                resources={"memory": MemoryApiResource(home=home)},
                raise_on_error=False,
                tags=dict(tags or {}),
                partition_key=partition_key,
                run_config=_console_log(log_level),
            )
            out.append(_execution(name, result, started))
    return out


def add_partitions(dagster_home: str, keys: Sequence[str]) -> None:
    """Add agent partitions (``memory_agents``) to the instance at ``dagster_home``, as
    the ``memory_agent_partitions`` sensor would."""
    with dg.DagsterInstance.from_config(dagster_home) as instance:
        instance.add_dynamic_partitions(partitions.AGENT_PARTITIONS.name, list(keys))


def memory_maintenance_by_agent_job() -> dg.JobDefinition:
    """The partitioned maintenance job, as a module-level function: the pointer Dagster
    hands to executors whose steps run elsewhere (Dask workers re-import it by name)."""
    return defs.resolve_job_def(partitions.MAINTENANCE_JOB)


def memory_manager_cycle_by_agent_job() -> dg.JobDefinition:
    """The partitioned cycle job (see :func:`memory_maintenance_by_agent_job`)."""
    return defs.resolve_job_def(partitions.CYCLE_JOB)


_RECONSTRUCTABLE = {
    partitions.MAINTENANCE_JOB: memory_maintenance_by_agent_job,
    partitions.CYCLE_JOB: memory_manager_cycle_by_agent_job,
}


def execute_partition_run(
    job_name: str, partition_key: str, tags: Mapping[str, str] | None = None
) -> JobExecution:
    """One run of a partitioned job for ``partition_key`` on the instance of
    ``DAGSTER_HOME``, executed by the job's configured executor (``MEMORY_EXECUTOR``:
    with ``dask`` its steps run on the Dask workers). A Dagster run needs a process of
    its own (its logging set-up is not thread-safe). A failed run is returned, not
    raised."""
    factory = _RECONSTRUCTABLE[job_name]
    run_tags = {**(tags or {}), "dagster/partition": partition_key}
    started = time.perf_counter()
    with dg.DagsterInstance.get() as instance:
        with dg.execute_job(
            dg.reconstructable(factory), instance=instance, tags=run_tags, raise_on_error=False
        ) as result:
            return _execution(job_name, result, started)
