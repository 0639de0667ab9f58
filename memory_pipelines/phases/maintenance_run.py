"""The maintenance run (reference §4.6-§4.12): the five phases in order, recorded as one
``manager_runs`` row, plus the record of a run whose phases ran one by one (the Dagster
job) and the inventory frames of the last maintenance.

1. :mod:`~memory_pipelines.phases.importance`: every Active note gets a 0-10 importance.
2. :mod:`~memory_pipelines.phases.consolidation`: clusters of similar notes of one scope
   are synthesised into one note.
3. :mod:`~memory_pipelines.phases.contradictions`: similar pairs are judged; the loser is
   revoked, or both are flagged.
4. :mod:`~memory_pipelines.phases.pruning`: auto notes with a vanished reference are
   archived.
5. :mod:`~memory_pipelines.phases.decay`: TTL expiry, then Ebbinghaus decay.

:func:`~memory_pipelines.phases.triggers.maintenance_trigger` is the gate. Every constant
is a default of :class:`MaintenanceConfig` (``mem.maintenance_config``).

What differs from the reference, on purpose (reference §6.2 and scale):

- uniqueness and contradiction partners never match the note itself (§6.2 item 2);
  uniqueness is measured, as in the reference, against the other injectable notes of
  the same agent (any user or company); clustering and contradiction pairing compare a
  note only with notes of its exact scope (agent, user, company, primary and secondary
  scope; §6.2 items 5 and 7). All neighbour searches are exact, in blocked matrix
  products per group over vectors read once (cost: the sum of squared group sizes, so
  linear in the pool for bounded agents and scopes);
- consolidation re-checks membership (Active, auto-generated, Standard/Ephemeral only),
  keeps the cluster's scope, gives the new note a deterministic id, saves it before
  revoking anything and completes an interrupted run;
- comments are always appended (contradiction revocation and stale pruning included);
- relevance comes from injection events (unavailable for never-injected notes, so those
  score exactly as the reference);
- judged contradiction pairs are remembered by content, so the 50-pair budget is not
  spent re-asking (and re-flagging) the same pair every run;
- stale pruning checks every candidate's references with a light column scan, then
  archives the oldest 200 stale notes (the reference loaded only the oldest 400 notes and
  could starve behind live ones);
- decay takes the longest-untouched candidates first; importance 0 decays (it is not
  read as "missing"); example retention is capped at 1.5 like notes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import MemoryPipelineError
from memory_pipelines.inventory import note_inventory
from memory_pipelines.partitions import state_key
from memory_pipelines.phases import (
    audit,
    compaction,
    consolidation,
    contradictions,
    decay,
    importance,
    pruning,
)
from memory_pipelines.phases.common import maintenance_run_id
from memory_pipelines.phases.ebbinghaus import iso
from memory_pipelines.phases.lease import exclusive_phase
from memory_pipelines.phases.reports import PhaseReport
from memory_pipelines.phases.triggers import STATE_LAST

log = logging.getLogger(__name__)

PHASES: tuple[str, ...] = ("importance", "consolidation", "contradictions", "pruning", "decay")
PHASE_STEPS: dict[str, str] = {
    "importance": importance.STEP,
    "consolidation": consolidation.STEP,
    "contradictions": contradictions.STEP,
    "pruning": pruning.STEP,
    "decay": decay.STEP,
}


class MaintenanceError(MemoryPipelineError):
    """One or more maintenance phases failed; ``report`` holds what the run did."""

    def __init__(self, message: str, report: PhaseReport):
        super().__init__(message)
        self.report = report


def record_maintenance(
    mem: MemoryContext,
    run_id: str,
    trigger_type: str,
    started_at: datetime,
    counts: Mapping[str, Any],
    status: str = "Completed",
    partition: str | None = None,
) -> None:
    """Record a maintenance run: a ``manager_runs`` row of kind 'maintenance' (naming its
    partition, if any) and, when it completed, the last-maintenance time the trigger
    measures from."""
    finished = mem.now()
    mem.sources.add_manager_run(
        "maintenance",
        status,
        started_at,
        finished,
        {"run_id": run_id, "triggerType": trigger_type, **_jsonable(counts)}
        | ({} if partition is None else {"partition": partition}),
    )
    if status == "Completed":
        mem.sources.set_state(
            state_key(STATE_LAST, partition),
            {"at": iso(finished), "run_id": run_id, "trigger": trigger_type},
        )


def finish_maintenance(
    mem: MemoryContext, run_id: str, trigger_type: str, partition: str | None = None
) -> dict[str, Any]:
    """Record a maintenance whose phases ran one by one (the Dagster job) under ``run_id``.

    Totals what each phase remembered for this run. The run is 'Completed' (and moves the
    last-maintenance time) only when all five phases ran under ``run_id``; a partial
    materialization is recorded as 'Partial'. Returns the recorded summary counts.
    """
    phases: dict[str, Mapping[str, Any]] = {}
    starts: list[datetime] = []
    for phase in PHASES:
        state = mem.sources.get_state(state_key(audit.MAINTENANCE_PHASE + phase, partition))
        if isinstance(state, dict) and state.get("run_id") == run_id:
            phases[phase] = state.get("counts") or {}
            if state.get("started_at"):
                starts.append(
                    datetime.fromisoformat(str(state["started_at"]).replace("Z", "+00:00"))
                )
    summary = summary_counts(phases)
    status = "Completed" if len(phases) == len(PHASES) else "Partial"
    record_maintenance(
        mem,
        run_id,
        trigger_type,
        min(starts) if starts else mem.now(),
        {**summary, "phasesRun": list(phases)},
        status,
        partition,
    )
    return {**summary, "status": status}


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    return value


def summary_counts(phases: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """The flat maintenance summary (reference §4.2 final message) from phase reports."""
    get = lambda phase, key: int((phases.get(phase) or {}).get(key) or 0)  # noqa: E731
    return {
        "notesScored": get("importance", "notesScored"),
        "tierPromotions": get("importance", "tierPromotions"),
        "consolidatedClusters": get("consolidation", "consolidatedClusterCount"),
        "sourceNotesRevoked": get("consolidation", "sourceNotesArchived"),
        "contradictionsResolved": get("contradictions", "contradictionsResolved"),
        "contradictionsFlagged": get("contradictions", "contradictionsFlagged"),
        "staleNotesPruned": get("pruning", "notesArchived"),
        "notesExpired": get("decay", "notesExpired"),
        "examplesExpired": get("decay", "examplesExpired"),
        "decayArchivedNotes": get("decay", "notesArchived"),
        "decayArchivedExamples": get("decay", "examplesArchived"),
    }


def summary_message(counts: Mapping[str, int]) -> str:
    """The reference's maintenance sentence appended to the cycle message."""
    return (
        f" Maintenance: consolidated {counts['consolidatedClusters']} clusters, resolved "
        f"{counts['contradictionsResolved']} contradictions, flagged {counts['contradictionsFlagged']}"
        f" high-importance contradictions, pruned {counts['staleNotesPruned']} stale notes,"
        f" decay-archived {counts['decayArchivedNotes']} notes + {counts['decayArchivedExamples']} examples."
    )


@exclusive_phase
def run_maintenance(
    mem: MemoryContext,
    trigger_type: str,
    run_id: str | None = None,
    partition: str | None = None,
) -> PhaseReport:
    """Run the five phases in order and record the run.

    Each phase has its own error handling: a failing phase gets a 'Failed' audit step and
    the later phases still run; the run is then recorded and ``MaintenanceError`` (chained
    to the first failure, carrying the report) is raised. The run is recorded in
    ``manager_runs`` (kind 'maintenance', 'Completed' or 'Failed'); only a completed run
    moves the last-maintenance time the trigger measures from. Returns the flat summary counts plus
    ``phases`` (each phase's counts), ``errors``, ``triggerType`` and ``runId``; ``changed``
    holds every phase's changed rows. With a ``partition``, every phase works on that
    partition only and the table is not compacted (the whole-pool compaction does it).
    """
    run_id = maintenance_run_id(run_id)
    started = mem.now()
    reports, errors, first_error = _run_phases(mem, trigger_type, run_id, partition)
    summary = summary_counts(reports)
    status = "Failed" if errors else "Completed"
    report = _combined_report(reports, summary, errors, trigger_type, run_id, status)
    record_maintenance(
        mem, run_id, trigger_type, started, {**summary, "errors": errors}, status, partition
    )
    if partition is None:
        report.extra["compaction"] = _compact(mem, run_id)
    if errors:
        raise MaintenanceError(
            f"maintenance {run_id} failed in {', '.join(errors)}: {next(iter(errors.values()))}",
            report,
        ) from first_error
    return report


def _run_phases(
    mem: MemoryContext, trigger_type: str, run_id: str, partition: str | None
) -> tuple[dict[str, PhaseReport], dict[str, str], Exception | None]:
    """Run each phase in order; a failing phase gets a 'Failed' audit step and the later
    ones still run. Returns the reports, the errors by phase and the first failure."""
    part = {"partition": partition}
    phase_fns: dict[str, Callable[[], PhaseReport]] = {
        "importance": lambda: importance.run(mem, run_id, **part),
        "consolidation": lambda: consolidation.run(mem, run_id, trigger_type=trigger_type, **part),
        "contradictions": lambda: contradictions.run(mem, run_id, **part),
        "pruning": lambda: pruning.run(mem, run_id, **part),
        "decay": lambda: decay.run(mem, run_id, **part),
    }
    reports: dict[str, PhaseReport] = {}
    errors: dict[str, str] = {}
    first_error: Exception | None = None
    for name in PHASES:
        phase_started = mem.now()
        try:
            reports[name] = phase_fns[name]()
        except Exception as e:  # each phase has its own error handling (reference §4.2)
            if not isinstance(e, MemoryPipelineError):
                log.exception("maintenance phase %s failed", name)
            errors[name] = f"{type(e).__name__}: {e}"[:2000]
            first_error = first_error or e
            audit.step(
                mem,
                run_id,
                "Decision",
                PHASE_STEPS[name],
                None,
                None,
                started_at=phase_started,
                status="Failed",
                error=errors[name],
            )
    return reports, errors, first_error


def _combined_report(
    reports: dict[str, PhaseReport],
    summary: dict[str, int],
    errors: dict[str, str],
    trigger_type: str,
    run_id: str,
    status: str,
) -> PhaseReport:
    """The run's report: the summary counts, each phase's counts, changed rows (tagged
    with their phase) and extra details, and the reference's summary sentence."""
    report = PhaseReport(
        {
            **summary,
            "triggerType": trigger_type,
            "runId": run_id,
            "status": status,
            "phases": {k: dict(v) for k, v in reports.items()},
            "errors": errors,
        }
    )
    for name in PHASES:
        if name in reports:
            report.changed.extend(dict(row, phase=name) for row in reports[name].changed)
            report.extra[name] = reports[name].extra
    report.extra["summary"] = summary_message(summary)
    return report


def _compact(mem: MemoryContext, run_id: str) -> dict:
    """Compact the note table; housekeeping that never fails the run (the error is
    reported instead)."""
    try:
        return dict(compaction.run(mem, run_id))
    except MemoryPipelineError as e:  # compaction is housekeeping: never fails the run
        log.warning("note table compaction failed: %s", e)
        return {"error": str(e)}


def last_maintenance_frame(mem: MemoryContext) -> pd.DataFrame:
    """Per phase of the most recent maintenance: its run, when it ran, its counts and the
    actions it took on notes (from ``manager_state``; empty before the first run)."""
    rows = []
    for phase in PHASES:
        state = mem.sources.get_state(audit.MAINTENANCE_PHASE + phase)
        if not isinstance(state, dict):
            continue
        counts = {
            k: v for k, v in (state.get("counts") or {}).items() if isinstance(v, (int, float))
        }
        rows.append(
            {
                "phase": phase,
                "run_id": state.get("run_id"),
                "at": state.get("at"),
                "counts": ", ".join(f"{k}={v}" for k, v in counts.items()),
                "actions": ", ".join(f"{k}={v}" for k, v in (state.get("actions") or {}).items())
                or "-",
            }
        )
    return pd.DataFrame(rows, columns=["phase", "run_id", "at", "counts", "actions"])


def last_maintenance_events(mem: MemoryContext, last: pd.DataFrame | None = None) -> pd.DataFrame:
    """The lifecycle events the last maintenance recorded (the runs named by
    ``last_maintenance``), one row per phase and event kind with its count."""
    last = last_maintenance_frame(mem) if last is None else last
    rows = mem.sources.run_event_counts(last["run_id"].dropna().astype(str).tolist())
    return pd.DataFrame(rows, columns=["phase", "event", "events"])


def maintenance_inventory(mem: MemoryContext) -> dict[str, pd.DataFrame]:
    """The note inventory (:func:`memory_pipelines.inventory.note_inventory`: counts by
    status, tier, type and agent, importance distribution) plus ``last_maintenance`` and
    ``last_maintenance_events`` (its events by phase and kind)."""
    frames = dict(note_inventory(mem))
    frames["last_maintenance"] = last_maintenance_frame(mem)
    frames["last_maintenance_events"] = last_maintenance_events(mem, frames["last_maintenance"])
    return frames
