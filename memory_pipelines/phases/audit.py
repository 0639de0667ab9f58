"""The audit trail of the Memory Manager phases: steps and remembered phase reports.

Every phase writes its ``run_steps`` rows and the report it leaves in ``manager_state``
through these functions: :func:`step` (one row now), :func:`step_row` plus
:func:`flush_steps` (rows buffered and inserted in one transaction), :func:`remember`
(a cycle phase's report, totalled by ``finish_cycle``) and :func:`close_phase` (a
maintenance phase's 'Decision' step and its report, read by ``finish_maintenance`` and
the inventory view).
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from typing import Any

from memory_pipelines.context import MemoryContext
from memory_pipelines.partitions import state_key
from memory_pipelines.phases.ebbinghaus import iso
from memory_pipelines.phases.reports import PhaseReport

#: manager_state key prefix of a cycle phase's remembered report
CYCLE_PHASE = "cycle.phase."
#: manager_state key prefix of a maintenance phase's remembered report
MAINTENANCE_PHASE = "maintenance.phase."


def partition_field(partition: str | None) -> dict[str, str]:
    """``{"partition": key}`` for a partitioned run's records, nothing for a whole-pool run."""
    return {} if partition is None else {"partition": partition}


def step(
    mem: MemoryContext,
    run_id: str,
    step_type: str,
    name: str,
    input: Any,
    output: Any,
    *,
    started_at: datetime,
    status: str = "Completed",
    error: str | None = None,
) -> None:
    """Write one audit step of ``run_id`` now (finished at the service clock)."""
    mem.sources.add_step(
        run_id,
        step_type,
        name,
        input=input,
        output=output,
        status=status,
        error_message=error,
        started_at=started_at,
        finished_at=mem.now(),
    )


def step_row(
    mem: MemoryContext,
    run_id: str,
    name: str,
    step_type: str,
    input: Any,
    output: Any,
    started_at: datetime,
    error: str | None = None,
) -> dict[str, Any]:
    """An audit step row to insert later in bulk (see :func:`flush_steps`)."""
    return {
        "run_id": run_id,
        "step_type": step_type,
        "step_name": name,
        "input_json": json.loads(json.dumps(input, default=str)),
        "output_json": json.loads(json.dumps(output, default=str)),
        "status": "Completed",
        "error_message": error,
        "started_at": started_at,
        "finished_at": mem.now(),
    }


def flush_steps(mem: MemoryContext, rows: list[dict[str, Any]]) -> None:
    """Insert buffered audit steps in one transaction (thousands of clusters per run)."""
    if rows:
        mem.sources.add_steps(rows)
        rows.clear()


def remember(
    mem: MemoryContext,
    phase: str,
    run_id: str,
    started_at: datetime,
    report: PhaseReport,
    partition: str | None = None,
) -> None:
    """Keep a cycle phase's last report so ``finish_cycle`` can total a cycle by run id."""
    mem.sources.set_state(
        state_key(CYCLE_PHASE + phase, partition),
        {
            "run_id": run_id,
            "started_at": started_at.isoformat(),
            "finished_at": mem.now().isoformat(),
            "counts": dict(report),
        },
    )


def record_phase(
    mem: MemoryContext,
    phase: str,
    run_id: str,
    report: PhaseReport,
    started_at: datetime,
    partition: str | None = None,
) -> None:
    """Remember what a maintenance phase did (counts and actions) for the inventory view
    and for ``finish_maintenance`` (per partition for a partitioned run)."""
    mem.sources.set_state(
        state_key(MAINTENANCE_PHASE + phase, partition),
        {
            "run_id": run_id,
            "started_at": iso(started_at),
            "at": iso(mem.now()),
            "counts": dict(report),
            "actions": dict(Counter(row["action"] for row in report.changed)),
        },
    )


def close_phase(
    mem: MemoryContext,
    phase: str,
    step_name: str,
    run_id: str,
    step_input: Any,
    report: PhaseReport,
    started_at: datetime,
    output: Any = None,
    partition: str | None = None,
) -> None:
    """End a maintenance phase: its 'Decision' audit step (output: the report's counts
    unless given) and the record the inventory view and ``finish_maintenance`` read."""
    step(
        mem,
        run_id,
        "Decision",
        step_name,
        step_input,
        dict(report) if output is None else output,
        started_at=started_at,
    )
    record_phase(mem, phase, run_id, report, started_at, partition)
