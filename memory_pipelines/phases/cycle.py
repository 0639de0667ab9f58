"""The Memory Manager cycle (reference §4.2): fold -> extract notes -> extract examples ->
harden -> gated maintenance, recorded as one ``manager_runs`` row; and the sensor's
signal that a cycle is due.

Every sub-step writes one audit row (``run_steps``) under the cycle's run id. Cursors
live in ``manager_state``: a conversation's messages, a failed run and an injection
event are each mined or folded once; note and example ids are deterministic, so a
crashed or repeated phase upserts instead of duplicating.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memory_pipelines.context import MemoryContext
from memory_pipelines.errors import MemoryPipelineError
from memory_pipelines.notes import AuthorType, NoteStatus, new_id, stable_id, utc
from memory_pipelines.partitions import state_key
from memory_pipelines.phases import audit, examples, extraction, fold, hardening
from memory_pipelines.phases.lease import exclusive_phase
from memory_pipelines.phases.maintenance_run import run_maintenance
from memory_pipelines.phases.reports import PhaseReport
from memory_pipelines.phases.triggers import maintenance_trigger
from memory_pipelines.store import and_, eq

LAST_CYCLE_AT = "last_cycle_at"

CYCLE_PHASES = ("fold", "extract_notes", "extract_examples", "harden")


class CycleError(MemoryPipelineError):
    """One or more phases of a Memory Manager cycle failed (the cycle is recorded Failed)."""


@dataclass(frozen=True)
class CycleSignal:
    """The sensor's decision: whether new data warrants a cycle, and the next cursor."""

    should_run: bool
    reason: str
    cursor: dict[str, Any]
    run_key: str | None = None
    new_rated_messages: int = 0
    provisional_backlog: int = 0


def extract(mem: MemoryContext, run_id: str | None = None, partition: str | None = None) -> PhaseReport:
    """Notes, then examples (both extraction assets in one call); counts merged."""
    run_id = run_id or new_id()
    notes = extraction.run(mem, run_id, partition)
    example_counts = examples.run(mem, run_id, partition)
    report = PhaseReport(dict(notes), changed=notes.changed, extra=notes.extra)
    for key, value in example_counts.items():
        if key == "conversationsProcessed":
            report["exampleConversationsProcessed"] = value
        else:
            report[key] = report.get(key, 0) + value if isinstance(value, int) else value
    return report


def finish_cycle(
    mem: MemoryContext,
    run_id: str,
    status: str = "Completed",
    extra_counts: Mapping[str, Any] | None = None,
    partition: str | None = None,
) -> dict[str, Any]:
    """Record the cycle ``run_id`` in ``manager_runs`` (kind 'cycle') and ``last_cycle_at``.

    Totals the counts the cycle phases remembered under this run id (so the Dagster
    job, whose assets run the phases one by one, records the same row as
    ``run_cycle``). A partition's cycle names its partition in the counts and keeps
    its own ``last_cycle_at``. Returns the recorded counts.
    """
    keys = {p: state_key(audit.CYCLE_PHASE + p, partition) for p in CYCLE_PHASES}
    states = mem.sources.get_states(list(keys.values()))
    counts: dict[str, Any] = {}
    starts: list[datetime] = []
    for phase in CYCLE_PHASES:
        value = states.get(keys[phase])
        if not value or value.get("run_id") != run_id:
            continue
        starts.append(utc(value["started_at"]))
        counts[phase] = value.get("counts", {})
    counts.update(extra_counts or {})
    now = mem.now()
    mem.sources.add_manager_run(
        "cycle",
        status,
        min(starts) if starts else now,
        now,
        {"run_id": run_id, **counts} | audit.partition_field(partition),
    )
    mem.sources.set_state(state_key(LAST_CYCLE_AT, partition), now.isoformat())
    return counts


@exclusive_phase
def run_cycle(
    mem: MemoryContext,
    force_maintenance: bool = False,
    run_id: str | None = None,
    partition: str | None = None,
) -> PhaseReport:
    """One Memory Manager cycle: fold → extract → harden → gated maintenance (of one
    ``partition``, or of the whole pool).

    Every phase runs even if an earlier one failed (each has its own error
    handling, as in the reference); the cycle is then recorded Failed and a
    ``CycleError`` chained to the first failure is raised. Returns the counts of every
    phase in one flat report (maintenance counts prefixed ``maintenance_``).
    """
    run_id = run_id or new_id()
    started = mem.now()
    report = PhaseReport()
    errors: list[tuple[str, Exception]] = []
    _run_cycle_phases(mem, run_id, partition, report, errors)
    try:
        _gated_maintenance(mem, force_maintenance, run_id, partition, report)
    except Exception as e:
        errors.append(("maintenance", e))
    report["cycleSeconds"] = round((mem.now() - started).total_seconds(), 3)
    _record_cycle(mem, run_id, started, force_maintenance, partition, report, errors)
    if errors:
        name, first = errors[0]
        raise CycleError(
            f"Memory Manager cycle {run_id} failed in {', '.join(n for n, _ in errors)}: {first}"
        ) from first
    return report


def _run_cycle_phases(
    mem: MemoryContext,
    run_id: str,
    partition: str | None,
    report: PhaseReport,
    errors: list[tuple[str, Exception]],
) -> None:
    """Fold, extract notes and examples, harden; each phase's counts go into ``report``
    (a failing phase into ``errors``, and the next still runs)."""
    phases = (
        ("fold", fold.run),
        ("extract_notes", extraction.run),
        ("extract_examples", examples.run),
        ("harden", hardening.run),
    )
    for name, phase in phases:
        try:
            part = phase(mem, run_id, partition)
        except Exception as e:  # each phase has its own error handling (reference §4.2)
            errors.append((name, e))
            continue
        for key, value in part.items():
            if name == "extract_examples" and key == "conversationsProcessed":
                key = "exampleConversationsProcessed"
            report[key] = value
        report.changed.extend(part.changed)


def _gated_maintenance(
    mem: MemoryContext,
    force_maintenance: bool,
    run_id: str,
    partition: str | None,
    report: PhaseReport,
) -> None:
    """Run maintenance when its trigger (or ``force_maintenance``) says so; its counts go
    into ``report`` prefixed ``maintenance_``."""
    should, trigger = maintenance_trigger(mem, force_maintenance, partition)
    report["maintenanceTrigger"] = trigger
    report["maintenanceRan"] = bool(should)
    if should:
        part = run_maintenance(mem, trigger, run_id, partition)
        for key, value in part.items():
            report[f"maintenance_{key}"] = value
        report.changed.extend(part.changed)
        report.extra["maintenance"] = dict(part)


def _record_cycle(
    mem: MemoryContext,
    run_id: str,
    started: datetime,
    force_maintenance: bool,
    partition: str | None,
    report: PhaseReport,
    errors: list[tuple[str, Exception]],
) -> None:
    """Record the cycle's run and its audit step (Failed when a phase failed)."""
    status = "Failed" if errors else "Completed"
    finish_cycle(
        mem,
        run_id,
        status,
        {
            "maintenanceTrigger": report.get("maintenanceTrigger"),
            "maintenanceRan": report.get("maintenanceRan", False),
            "errors": [f"{n}: {e}" for n, e in errors],
        },
        partition,
    )
    audit.step(
        mem,
        run_id,
        "Decision",
        "Memory Manager Cycle",
        {"forceMaintenance": force_maintenance} | audit.partition_field(partition),
        {"status": status, "message": cycle_message(report)},
        started_at=started,
        status="Completed" if not errors else "Failed",
        error="; ".join(f"{n}: {e}" for n, e in errors) or None,
    )


# -- sensor support -----------------------------------------------------------------------


def cycle_signal(mem: MemoryContext, cursor: Mapping[str, Any] | None = None) -> CycleSignal:
    """Whether a cycle should start now: rated messages newer than the cursor, or a
    backlog of provisional notes newer than the cursor (reads only)."""
    cursor = dict(cursor or {})
    rated_after = utc(cursor["rated_after"]) if cursor.get("rated_after") else None
    new_rated, newest_rated = mem.sources.rated_messages_since(rated_after)
    prov = mem.store.notes.scan(
        and_(eq("status", NoteStatus.PROVISIONAL), eq("author_type", AuthorType.AGENT)),
        columns=["id", "created_at"],
    )
    prov_after = utc(cursor["provisional_after"]) if cursor.get("provisional_after") else None
    if prov_after is not None and len(prov):
        prov = prov[prov["created_at"] > prov_after]
    backlog = len(prov)
    newest_prov = prov["created_at"].max().to_pydatetime() if backlog else None
    reasons = []
    if new_rated:
        reasons.append(f"{new_rated} new rated message(s)")
    if backlog >= mem.manager_config.provisional_backlog:
        reasons.append(f"{backlog} new provisional note(s)")
    new_cursor = dict(cursor)
    if new_rated and newest_rated is not None:
        new_cursor["rated_after"] = utc(newest_rated).isoformat()
    if reasons and newest_prov is not None:
        new_cursor["provisional_after"] = utc(newest_prov).isoformat()
    if not reasons:
        return CycleSignal(
            False,
            f"no new rated messages; {backlog} new provisional note(s) "
            f"(backlog threshold {mem.manager_config.provisional_backlog})",
            new_cursor,
            provisional_backlog=backlog,
        )
    run_key = "cycle:" + stable_id(
        new_cursor.get("rated_after"), new_cursor.get("provisional_after")
    )
    return CycleSignal(True, "; ".join(reasons), new_cursor, run_key, int(new_rated), backlog)


def cycle_message(report: Mapping[str, Any]) -> str:
    """The reference's final message (§4.2 step 9) for a cycle report."""
    msg = (
        f"Processed {report.get('conversationsProcessed', 0)} conversations "
        f"({report.get('messagesProcessed', 0)} messages) and {report.get('agentRunsProcessed', 0)} "
        f"agent runs. Created {report.get('notesCreated', 0)} notes and "
        f"{report.get('examplesCreated', 0)} examples."
    )
    if report.get("hardened") or report.get("deduped"):
        msg += (
            f" Hardened {report.get('hardened', 0)} provisional notes "
            f"({report.get('deduped', 0)} deduped, {report.get('failed', 0)} failed)."
        )
    if report.get("maintenanceRan"):
        parts = [
            f"{k.removeprefix('maintenance_')} {v}"
            for k, v in report.items()
            if k.startswith("maintenance_")
            and isinstance(v, int | float)
            and not isinstance(v, bool)
        ]
        msg += " Maintenance: " + ", ".join(parts) + "."
    return msg
