"""Lifecycle events of the maintenance phases: one test per path (importance's protection
change, consolidation's merged/created, a merge target that already exists, the
completion of an interrupted merge, the contradiction loser, stale pruning, TTL, decay),
recorded in the same save as the change, by the Memory Manager, under the run id."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from factories import RecordingJudge, direction, near

from memory_pipelines import phases
from memory_pipelines.errors import StoreError
from memory_pipelines.notes import Note


def put(svc, text: str, vec: np.ndarray, **fields) -> Note:
    fields.setdefault("agent_id", "agent")
    fields.setdefault("user_id", "u1")
    fields.setdefault("is_auto_generated", True)
    fields.setdefault("access_count", 1)
    return svc.save_notes([Note(note=text, **fields)], vectors=np.asarray([vec]))[0]


def kinds(svc, note_id: str) -> list[str]:
    return [e.event for e in svc.history(note_id)]


def last(svc, note_id: str):
    return svc.history(note_id)[-1]


@pytest.fixture
def world(svc):
    svc.configure_agent("agent")
    for user in ("u1", "u2"):
        svc.add_user(user)
    return svc


def assert_manager_event(ev, kind, phase, rule, run_id="run-1"):
    assert (ev.event, ev.actor, ev.phase, ev.run_id) == (kind, "memory-manager", phase, run_id)
    assert ev.details["rule"] == rule and ev.details.get("reason")


def test_importance_records_one_event_per_protection_change(world, clock):
    for i in range(25):
        put(world, f"fact number {i}", direction(100 + i), created_at=clock() - timedelta(days=5))
    report = phases.importance.run(world.context, "run-1")
    promoted = [n for n in world.store.notes.all() if n.protection_tier == "Protected"]
    assert report["tierPromotions"] == len(promoted) >= 1
    for note in promoted:
        (ev,) = world.history(note.id)
        assert_manager_event(ev, "protection-changed", "importance", "importance")
        assert ev.changes["protection_tier"] == "Protected"
        assert ev.status_before == ev.status_after == "Active"
        assert ev.at == note.updated_at
    scored_only = [n for n in world.store.notes.all() if n.protection_tier == "Standard"]
    assert scored_only and all(n.importance_score is not None for n in scored_only)
    assert all(world.history(n.id) == [] for n in scored_only)  # a score alone is no event


def _cluster(world, clock, seed: int) -> list[Note]:
    base = direction(seed)
    return [
        put(world, f"tea {seed} {i}", near(base, i), created_at=clock() - timedelta(hours=5 - i))
        for i in range(3)
    ]


def test_consolidation_records_merged_sources_and_the_created_note(world, clock):
    world.judge = RecordingJudge()
    sources = _cluster(world, clock, 7)
    report = phases.consolidation.run(world.context, "run-1")
    [new_id] = report["newConsolidatedNoteIds"]
    (created,) = world.history(new_id)
    assert_manager_event(created, "created", "consolidation", "consolidation")
    assert set(created.related_note_ids) == {s.id for s in sources}
    assert set(created.changes["derived_from_note_ids"]) == {s.id for s in sources}
    assert created.status_before is None and created.status_after == "Active"
    assert created.text_after == world.get_note(new_id).note
    for src in sources:
        ev = last(world, src.id)
        assert_manager_event(ev, "merged", "consolidation", "consolidation")
        assert ev.related_note_ids == [new_id]
        assert (ev.status_before, ev.status_after) == ("Active", "Revoked")
        assert ev.changes["consolidated_into_note_id"] == new_id
        assert ev.details["reason"] == "same topic"
    assert world.sources.event_counts(run_id="run-1") == {"created": 1, "merged": 3}


def test_a_merge_target_that_exists_is_an_updated_event(world, clock):
    world.judge = RecordingJudge()
    sources = _cluster(world, clock, 8)
    [new_id] = phases.consolidation.run(world.context, "run-1")["newConsolidatedNoteIds"]
    world.set_note_status(new_id, "Archived")
    for s in sources:  # the analyst brings the sources back by hand
        world.set_note_status(s.id, "Active")
    clock.advance(hours=1)
    report = phases.consolidation.run(world.context, "run-2")
    assert report["newConsolidatedNoteIds"] == [new_id]  # the same deterministic id
    ev = last(world, new_id)
    assert_manager_event(ev, "updated", "consolidation", "consolidation", "run-2")
    assert ev.details["merge_target_existed"] is True
    assert (ev.status_before, ev.status_after) == ("Archived", "Active")
    assert kinds(world, new_id) == ["created", "archived", "updated"]


def test_completing_an_interrupted_merge_records_merged(world, clock, monkeypatch):
    world.judge = RecordingJudge()
    sources = _cluster(world, clock, 9)
    real = phases.consolidation.revoke_sources

    def crash(mem, notes, vectors, revocations, report, *args, **kwargs):
        if revocations:
            raise StoreError("process killed")
        return real(mem, notes, vectors, revocations, report, *args, **kwargs)

    monkeypatch.setattr(phases.consolidation, "revoke_sources", crash)
    with pytest.raises(StoreError):
        phases.consolidation.run(world.context, "run-1")
    new_id = phases.consolidation.consolidation_note_id([s.id for s in sources])
    assert kinds(world, new_id) == ["created"]
    assert all(kinds(world, s.id) == [] for s in sources)  # nothing revoked, no event
    monkeypatch.setattr(phases.consolidation, "revoke_sources", real)
    phases.consolidation.run(world.context, "run-2")
    for s in sources:
        ev = last(world, s.id)
        assert_manager_event(ev, "merged", "consolidation", "consolidation", "run-2")
        assert ev.related_note_ids == [new_id] and ev.details["completed_interrupted"] is True


def test_contradiction_loser_is_revoked_naming_the_winner(world, clock):
    world.judge = RecordingJudge()
    base = direction(20)
    old = put(world, "User drinks tea", near(base, 1, 0.5), created_at=clock() - timedelta(days=10))
    new = put(world, "User drinks coffee now", near(base, 2, 0.5))
    phases.contradictions.run(world.context, "run-1")
    ev = last(world, old.id)
    assert_manager_event(ev, "revoked", "contradictions", "contradiction")
    assert ev.related_note_ids == [new.id]
    assert ev.details["reason"] == "the newer note wins"
    assert ev.details["contradiction_type"] == "temporal_supersession"
    assert (ev.status_before, ev.status_after) == ("Active", "Revoked")
    assert kinds(world, new.id) == []  # the winner is unchanged


def test_stale_pruning_archives_naming_the_missing_reference(world, clock):
    gone = put(world, "user gone", direction(31), user_id="u2")
    keep = put(world, "still valid", direction(30))
    world.delete_user("u2")
    phases.pruning.run(world.context, "run-1")
    ev = last(world, gone.id)
    assert_manager_event(ev, "archived", "pruning", "stale-reference")
    assert ev.details["missing_references"] == {"user": "u2"}
    assert "referenced user no longer exists (u2)" in ev.details["reason"]
    assert (ev.status_before, ev.status_after) == ("Active", "Archived")
    assert kinds(world, keep.id) == []


def test_ttl_archives_with_an_event(world, clock):
    n = put(
        world, "travelling", direction(50), status="Provisional", author_type="Agent",
        expires_at=clock() - timedelta(hours=1),
    )  # fmt: skip
    phases.decay.run(world.context, "run-1")
    ev = last(world, n.id)
    assert_manager_event(ev, "archived", "decay", "ttl")
    assert (ev.status_before, ev.status_after) == ("Provisional", "Archived")
    assert "expired on" in ev.details["reason"]


def test_decay_archives_with_an_event_and_a_decayed_score_alone_is_none(world, clock):
    old = put(
        world, "old note", direction(60), importance_score=2.0,
        created_at=clock() - timedelta(days=30),
    )  # fmt: skip
    fading = put(
        world, "fading", direction(61), importance_score=6.0, access_count=0,
        created_at=clock() - timedelta(days=2),
    )  # fmt: skip
    phases.decay.run(world.context, "run-1")
    ev = last(world, old.id)
    assert_manager_event(ev, "archived", "decay", "decay")
    assert "below floor" in ev.details["reason"] and 0 < ev.details["factor"] < 1
    assert world.get_note(fading.id).importance_score < 6.0
    assert kinds(world, fading.id) == []


def test_a_full_maintenance_run_records_its_events_under_its_run_id(world, clock):
    world.judge = RecordingJudge()
    _cluster(world, clock, 11)
    put(world, "user gone", direction(31), user_id="u2")
    world.delete_user("u2")
    report = phases.maintenance_run.run_maintenance(world.context, "forced", "maint-1")
    counts = world.sources.event_counts(run_id="maint-1")
    assert counts["merged"] == report["sourceNotesRevoked"] == 3
    assert counts["archived"] == report["staleNotesPruned"] == 1
    assert counts["created"] == report["consolidatedClusters"] == 1
    frames = phases.maintenance_run.maintenance_inventory(world.context)
    table = frames["last_maintenance_events"]
    assert set(zip(table["phase"], table["event"], table["events"], strict=True)) >= {
        ("consolidation", "merged", 3),
        ("consolidation", "created", 1),
        ("pruning", "archived", 1),
    }
