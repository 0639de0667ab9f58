"""``memory-pipelines cycle`` with ``DAGSTER_HOME`` set: the cycle run through that Dagster
instance, so its runs, materializations and checks appear in the UI's catalog.

The cycle job (``memory_manager_cycle``: source observations, extraction, hardening, the
note table) runs in this process on the instance at ``DAGSTER_HOME``; then, as in
``svc.manager.run_cycle``, the maintenance gate is asked (or forced) and, when it fires,
the ``memory_maintenance`` job runs too, tagged with the trigger. Without Dagster
installed the command says so and runs the cycle in process, unrecorded. The Dagster
calls live in :mod:`memory_pipelines.jobs.runs`; this module only prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tabulate import tabulate

from memory_pipelines.apps.terminal import printable
from memory_pipelines.jobs.runs import JobExecution, execute_jobs, instance_folder
from memory_pipelines.phases.triggers import maintenance_trigger
from memory_pipelines.sensors.maintenance_trigger import TRIGGER_TAG
from memory_pipelines.service import MemoryService
from memory_pipelines.service.core import default_home

CYCLE_JOB = "memory_manager_cycle"
MAINTENANCE_JOB = "memory_maintenance"
#: Run tag naming what started a run (the demo tags its runs the same way).
STARTED_BY_TAG = "memory/trigger"
#: The console shows the runs' warnings and errors; every event stays in the instance's
#: event log (the UI's run page).
LOG_LEVEL = "WARNING"


def _counts(run: JobExecution) -> list[tuple[str, str, object]]:
    """(asset, count, value) for every numeric metadata value of the run's assets."""
    rows = []
    for asset, metadata in run.materializations.items():
        for key, value in metadata.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                rows.append((asset, key, value))
    return rows


def _outcome(run: JobExecution) -> str:
    failed = sorted(n for n, passed in run.checks.items() if not passed and n not in run.warnings)
    text = "succeeded" if run.success else "failed"
    if failed:
        text += f" (failed checks: {', '.join(failed)})"
    if run.warnings:
        text += f" (checks to look at: {', '.join(sorted(run.warnings))})"
    return text


def run_recorded_cycle(home: str | None, dagster_home: str, force_maintenance: bool) -> int:
    """One Memory Manager cycle through the Dagster instance at ``dagster_home``, plus
    maintenance when its gate fires (or ``force_maintenance``). Prints each run and its
    counts; returns 0 when every run succeeded, 1 otherwise. A bad DAGSTER_HOME raises
    :class:`~memory_pipelines.errors.ConfigError` before anything runs."""
    instance = instance_folder(dagster_home)
    folder = (Path(home) if home else default_home()).resolve()
    started_by = {STARTED_BY_TAG: "cli"}
    runs: list[JobExecution] = execute_jobs(
        str(folder), [CYCLE_JOB], str(instance), started_by, log_level=LOG_LEVEL
    )
    gate = "not asked: the cycle failed"
    if runs and runs[0].success:
        with MemoryService.from_env(folder) as svc:
            should, trigger = maintenance_trigger(svc.context, force_maintenance)
        gate = f"{'triggered' if should else 'not triggered'} ({trigger})"
        if should:
            runs += execute_jobs(
                str(folder),
                [MAINTENANCE_JOB],
                str(instance),
                {**started_by, TRIGGER_TAG: trigger},
                log_level=LOG_LEVEL,
            )
    print(printable(_report(runs, gate, instance), keep="\n"))
    return 0 if runs and all(r.success for r in runs) else 1


def _report(runs: Sequence[JobExecution], gate: str, instance: Path) -> str:
    lines = [f"{r.job}: run {r.run_id} {_outcome(r)} in {r.seconds} s" for r in runs]
    lines.append(f"maintenance: {gate}")
    rows = [row for r in runs for row in _counts(r)]
    if rows:
        lines += ["", tabulate(rows, headers=["asset", "count", "value"], tablefmt="github")]
    lines += ["", f"Recorded in the Dagster instance at {instance} (DAGSTER_HOME)."]
    return "\n".join(lines)
