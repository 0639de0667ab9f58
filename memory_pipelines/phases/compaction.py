"""Compaction of the note and example tables, after the maintenance phases: merge
LanceDB's small version files, refresh and create the scalar indexes, drop old versions."""

from __future__ import annotations

from memory_pipelines.context import MemoryContext
from memory_pipelines.phases import audit
from memory_pipelines.phases.common import maintenance_run_id
from memory_pipelines.phases.lease import exclusive_phase
from memory_pipelines.phases.reports import PhaseReport

#: the audit step name
STEP = "Compact Note Tables"


@exclusive_phase
def run(mem: MemoryContext, run_id: str | None = None) -> PhaseReport:
    """Compact the note and example tables and keep their scalar indexes current.

    Every LanceDB write is a new table version with small files; this merges them
    (``optimize``), folds new rows into the indexes, removes versions older than
    ``cleanup_older_than`` and creates the Bitmap indexes of ``indexed_columns`` (and,
    from ``ID_INDEX_MIN_ROWS`` rows, the BTree index on ``id``) when missing. Runs after
    the maintenance phases (``MemoryService.compact`` runs it on demand); it changes no
    note. The counts are what the audit row records; ``extra`` adds the fragments before
    and after and the seconds per table.
    """
    run_id = maintenance_run_id(run_id)
    started = mem.now()
    cfg = mem.maintenance_config
    result = mem.store.compact(cfg.cleanup_older_than, cfg.indexed_columns)
    counts = {
        "notesVersionBefore": result["notes"]["version_before"],
        "notesVersionAfter": result["notes"]["version_after"],
        "notesVersionsKept": len(mem.store.notes.list_versions()),
        "examplesVersionsKept": len(mem.store.examples.list_versions()),
    }
    audit.step(mem, run_id, "Decision", STEP, None, counts, started_at=started)
    extra = {
        f"{table}{key}": result[table][field]
        for table in ("notes", "examples")
        for key, field in (
            ("FragmentsBefore", "fragments_before"),
            ("FragmentsAfter", "fragments_after"),
            ("Rows", "rows"),
            ("Seconds", "seconds"),
        )
    }
    extra["examplesVersionBefore"] = result["examples"]["version_before"]
    extra["examplesVersionAfter"] = result["examples"]["version_after"]
    return PhaseReport(counts, extra=extra)
