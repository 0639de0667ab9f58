"""Compaction: versions merged, scalar indexes created, no note changed."""

from datetime import timedelta

from memory_pipelines.config import MaintenanceConfig
from memory_pipelines.phases import compaction


def test_compaction_keeps_notes_and_creates_indexes(svc):
    for i in range(12):
        svc.add_note(f"note number {i} about charts", agent_id="a", user_id=f"u{i % 3}")
    before = svc.notes().sort_values("id").reset_index(drop=True)
    svc.maintenance_config = MaintenanceConfig(cleanup_older_than=timedelta(0))
    report = compaction.run(svc.context, "run-compact")
    after = svc.notes().sort_values("id").reset_index(drop=True)
    assert before.drop(columns=["updated_at"]).equals(after.drop(columns=["updated_at"]))
    indexed = {c for i in svc.store.notes.lance.list_indices() for c in i.columns}
    assert {"agent_id", "status", "user_id", "company_id"} <= indexed
    assert report["notesVersionsKept"] < report["notesVersionBefore"]
    steps = svc.sources.steps("run-compact", "Compact Note Tables")
    assert len(steps) == 1 and steps[0]["status"] == "Completed"
    # filtered searches still answer after compaction
    assert svc.store.notes.count() == 12
