"""The analyst's view of lifecycle events in Dagster: ``note_inventory`` shows the last
maintenance's events by phase and kind, and the ``events_name_existing_notes`` check fails
when an event names a note the table does not hold (a healthy home, purge included,
passes)."""

import dagster as dg
import numpy as np
from factories import RecordingJudge, direction, near

from memory_pipelines import NoteEvent
from memory_pipelines.assets import checks
from memory_pipelines.assets.inventory import note_inventory
from memory_pipelines.notes import Note
from memory_pipelines.phases.maintenance_run import run_maintenance
from memory_pipelines.resources.memory_api import MemoryApiResource

ASSETS = [note_inventory, checks.events_name_existing_notes]


def _materialize(home):
    return dg.materialize(
        ASSETS,
        resources={"memory": MemoryApiResource(home=str(home), embedding_model="hash")},
        raise_on_error=False,
    )


def test_inventory_shows_the_events_and_the_check_catches_an_orphan_event(home, open_service):
    with open_service(clock=None) as svc:
        svc.configure_agent("agent")
        svc.add_user("u1")
        svc.judge = RecordingJudge(contradiction=False)
        base = direction(7)
        notes = [
            Note(note=f"tea {i}", agent_id="agent", user_id="u1", is_auto_generated=True)
            for i in range(3)
        ]
        svc.save_notes(notes, vectors=np.asarray([near(base, i) for i in range(3)]))
        svc.add_note("u2 likes trains", agent_id="agent", user_id="u2")
        run_maintenance(svc.context, "forced", "maint-1")
        svc.purge_user("u2")  # erases the user's notes and events together

    result = _materialize(home)
    assert result.success
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.passed and evaluation.metadata["missing_notes"].value == 0
    (mat,) = result.get_asset_materialization_events()
    meta = mat.step_materialization_data.materialization.metadata
    table = meta["last_maintenance_events"].value
    assert "consolidation" in table and "merged" in table and "created" in table
    assert meta["last_maintenance_event_count"].value == 4  # 3 merged + 1 created

    with open_service(clock=None) as svc:
        svc.sources.add_note_events([NoteEvent(note_id="ghost-note", event="updated")])
    result = _materialize(home)
    (evaluation,) = result.get_asset_check_evaluations()
    assert not evaluation.passed and evaluation.metadata["missing_notes"].value == 1
    assert "ghost-note" in evaluation.metadata["examples"].value
