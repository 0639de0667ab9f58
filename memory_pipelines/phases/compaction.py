"""Compaction of the note and example tables, after the maintenance phases: merge
LanceDB's small version files, refresh and create the scalar indexes, drop old versions."""

from __future__ import annotations

from memory_pipelines.context import MemoryContext
from memory_pipelines.phases import audit
from memory_pipelines.phases.common import maintenance_run_id
from memory_pipelines.phases.reports import PhaseReport

#: the audit step name
STEP = "Compact Note Tables"


def run(mem: MemoryContext, run_id: str | None = None) -> PhaseReport:
    """Compact the note and example tables and keep their scalar indexes current.

    Every LanceDB write is a new table version with small files; this merges them
    (``optimize``), folds new rows into the indexes, removes versions older than
    ``cleanup_older_than`` and creates the Bitmap indexes of ``indexed_columns`` when
    missing. Runs after the maintenance phases; it changes no note.
    """
    run_id = maintenance_run_id(run_id)
    started = mem.now()
    cfg = mem.maintenance_config
    mem.store.notes.ensure_scalar_indexes(cfg.indexed_columns)
    mem.store.examples.ensure_scalar_indexes(("agent_id", "status"))
    result = mem.store.optimize(cleanup_older_than=cfg.cleanup_older_than)
    counts = {
        "notesVersionBefore": result["notes"]["version_before"],
        "notesVersionAfter": result["notes"]["version_after"],
        "notesVersionsKept": len(mem.store.notes.list_versions()),
        "examplesVersionsKept": len(mem.store.examples.list_versions()),
    }
    audit.step(mem, run_id, "Decision", STEP, None, counts, started_at=started)
    return PhaseReport(counts)
