"""Registration follows use and stale pruning archives only what was registered and
later deleted (CONTRACT §2.9)."""

from __future__ import annotations

from datetime import timedelta

from memory_pipelines import RunContext, phases
from memory_pipelines.notes import Note


def _auto(svc, text, **fields):
    fields.setdefault("agent_id", "analyst")
    return svc.save_notes([Note(note=text, is_auto_generated=True, **fields)])[0]


def test_the_readme_example_keeps_its_note_through_a_cycle(svc, clock):
    svc.configure_agent("analyst", max_notes_to_inject=5)
    ctx = RunContext(agent_id="analyst", run_id="run-1", user_id="u1", company_id="acme")
    results = svc.write(ctx, [{"note": "User prefers bar charts over pie charts.", "type": "Preference"}])
    assert results[0].disposition == "written"
    assert svc.sources.get_user("u1")["company_id"] == "acme"
    assert svc.sources.existing_ids("company", ["acme"]) == {"acme"}
    clock.advance(days=2)
    svc.manager.run_cycle(force_maintenance=True)
    note = svc.get_note(results[0].note_id)
    assert note.status in ("Active", "Provisional") and "stale" not in (note.comments or "")
    injected = svc.inject(ctx, current_input="make me a chart")
    assert [n.id for n in injected.notes] == [note.id]


def test_inject_and_add_note_register_too(svc):
    svc.configure_agent("analyst")
    svc.inject({"agent_id": "analyst", "user_id": "u2", "company_id": "globex"}, "hi")
    assert svc.sources.get_user("u2")["company_id"] == "globex"
    svc.add_note("a fact", agent_id="analyst", user_id="u3")
    assert svc.sources.get_user("u3")["company_id"] is None
    svc.add_note("a company fact", company_id="initech")
    assert svc.sources.existing_ids("company", ["initech"]) == {"initech"}


def test_registration_keeps_an_existing_users_company(svc):
    svc.configure_agent("analyst")
    svc.add_user("u1", "acme", "Ann")
    svc.inject({"agent_id": "analyst", "user_id": "u1", "company_id": "other"}, "hi")
    assert svc.sources.get_user("u1")["company_id"] == "acme"
    assert svc.sources.get_user("u1")["name"] == "Ann"


def test_only_registered_then_deleted_references_are_stale(svc, clock):
    svc.configure_agent("analyst")
    svc.add_agent_run("run-9", "analyst")
    svc.add_conversation("conv-9", "analyst")
    never = _auto(svc, "never registered", user_id="nobody", company_id="nowhere",
                  source_conversation_id="conv-0", source_run_id="run-0")
    user = _auto(svc, "user deleted", user_id="u1")
    company = _auto(svc, "company deleted", company_id="acme")
    conversation = _auto(svc, "conversation deleted", source_conversation_id="conv-9")
    run = _auto(svc, "run deleted", source_run_id="run-9")
    svc.add_user("u1")
    svc.add_company("acme")
    for delete, entity in (
        (svc.delete_user, "u1"),
        (svc.delete_company, "acme"),
        (svc.delete_conversation, "conv-9"),
        (svc.delete_agent_run, "run-9"),
        (svc.delete_user, "nobody-else"),  # never registered: no record
    ):
        delete(entity)
    kinds = {(r["kind"], r["id"]) for r in svc.sources.deletions()}
    assert kinds == {("user", "u1"), ("company", "acme"), ("conversation", "conv-9"), ("run", "run-9")}
    report = phases.pruning.run(svc.context)
    assert report["notesArchived"] == 4
    assert report.extra["orphanedRuns"] == 1
    assert svc.get_note(never.id).status == "Active"
    for note in (user, company, conversation, run):
        assert svc.get_note(note.id).status == "Archived"
    assert "source run no longer exists" in svc.get_note(run.id).comments


def test_a_user_used_again_after_deletion_keeps_new_notes(svc, clock):
    svc.configure_agent("analyst")
    ctx = {"agent_id": "analyst", "user_id": "u1", "company_id": "acme", "run_id": "r1"}
    svc.write(ctx, [{"note": "User likes green tea.", "type": "Preference"}])
    old = _auto(svc, "old note of u1", user_id="u1")
    svc.delete_user("u1")
    phases.pruning.run(svc.context)
    assert svc.get_note(old.id).status == "Archived"
    clock.advance(hours=1)
    ctx2 = {**ctx, "run_id": "r2"}
    new = svc.write(ctx2, [{"note": "User now likes black coffee.", "type": "Preference"}])[0]
    assert svc.sources.get_user("u1") is not None  # registered again by use
    new_auto = _auto(svc, "new note of u1", user_id="u1")
    clock.advance(days=1)
    phases.pruning.run(svc.context)
    assert svc.get_note(old.id).status == "Archived"  # nothing archived comes back
    assert svc.get_note(new_auto.id).status == "Active"
    assert svc.get_note(new.note_id).status != "Archived"


def test_a_note_written_after_the_deletion_is_not_stale(svc, clock):
    """Another process that still believes the user registered writes after the deletion:
    its note is newer than the deletion record, so it is kept."""
    svc.configure_agent("analyst")
    svc.add_user("u1")
    svc.delete_user("u1")
    clock.advance(minutes=5)
    later = _auto(svc, "written later", user_id="u1", created_at=clock() + timedelta(seconds=1))
    assert phases.pruning.run(svc.context)["notesArchived"] == 0
    assert svc.get_note(later.id).status == "Active"
