"""Undo (CONTRACT §2.7): ``svc.restore_note`` after each Memory Manager decision, sticking
across a full forced cycle, re-applied once the analyst changes the note again, errors."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from factories import RecordingJudge, direction, near

from memory_pipelines import phases
from memory_pipelines.errors import NotFoundError, ValidationError
from memory_pipelines.notes import Note


def put(svc, text: str, vec: np.ndarray, **fields) -> Note:
    fields.setdefault("agent_id", "agent")
    fields.setdefault("user_id", "u1")
    fields.setdefault("is_auto_generated", True)
    fields.setdefault("access_count", 1)
    return svc.save_notes([Note(note=text, **fields)], vectors=np.asarray([vec]))[0]


def status(svc, note_id: str) -> str:
    return svc.get_note(note_id).status


def full_cycle(svc, clock) -> None:
    clock.advance(days=1)
    svc.manager.run_cycle(force_maintenance=True)


@pytest.fixture
def world(svc):
    # no Ebbinghaus decay unless a test turns it on: the restored notes here are old and
    # rarely used, and decay is another rule than the one each test undoes
    svc.configure_agent("agent", auto_archive_enabled=False)
    for user in ("u1", "u2"):
        svc.add_user(user)
    svc.judge = RecordingJudge()
    return svc


def check_restored(svc, note_id, undoes, rule, back_to="Active"):
    note = svc.get_note(note_id)
    assert note.status == back_to and note.consolidated_into_note_id is None
    ev = svc.history(note_id)[-1]
    assert (ev.event, ev.actor, ev.phase) == ("restored", "analyst", "manual")
    assert ev.details["undoes"] == undoes and ev.details["rule"] == rule
    assert ev.status_after == back_to
    assert f"[Restored by analyst: undoes {undoes}]" in note.comments
    return ev


def contradiction(world, clock):
    # the embedder's own vectors: an analyst's change re-embeds the text, the pair stays
    texts = ["The user drinks tea every morning at home", "The user drinks coffee every morning at home"]
    tea, coffee = world.embed(texts)
    old = put(world, texts[0], tea, created_at=clock() - timedelta(days=10))
    new = put(world, texts[1], coffee)
    phases.contradictions.run(world.context)
    assert status(world, old.id) == "Revoked"
    return old, new


def test_restore_a_contradiction_loser_sticks(world, clock):
    old, new = contradiction(world, clock)
    restored = world.restore_note(old.id)
    assert restored.status == "Active"
    ev = check_restored(world, old.id, "revoked", "contradiction")
    assert ev.related_note_ids == [new.id]
    full_cycle(world, clock)
    assert status(world, old.id) == "Active" and status(world, new.id) == "Active"
    assert world.history(old.id)[-1].event == "restored"


def test_a_later_analyst_change_lets_the_rule_apply_again(world, clock):
    old, _ = contradiction(world, clock)
    world.restore_note(old.id)
    clock.advance(hours=1)
    world.update_notes([(world.get_note(old.id), {"type": "Context"})])
    full_cycle(world, clock)
    assert status(world, old.id) == "Revoked"
    assert world.history(old.id)[-1].event == "revoked"


def test_restore_after_ttl_sticks_until_the_analyst_changes_it(world, clock):
    n = put(world, "on holiday", direction(50), expires_at=clock() - timedelta(hours=1))
    phases.decay.run(world.context)
    assert status(world, n.id) == "Archived"
    world.restore_note(n.id)
    check_restored(world, n.id, "archived", "ttl")
    full_cycle(world, clock)
    assert status(world, n.id) == "Active"
    world.set_note_status(n.id, "Active", comment="still valid, checked")  # a change
    full_cycle(world, clock)
    assert status(world, n.id) == "Archived"


def test_restore_a_provisional_note_returns_it_to_provisional(world, clock):
    n = put(
        world, "travelling", direction(51), status="Provisional", author_type="Agent",
        expires_at=clock() - timedelta(hours=1),
    )  # fmt: skip
    phases.decay.run(world.context)
    assert world.restore_note(n.id).status == "Provisional"
    check_restored(world, n.id, "archived", "ttl", back_to="Provisional")


def test_restore_after_decay_sticks(world, clock):
    world.configure_agent("agent", auto_archive_enabled=True)
    n = put(
        world, "old note", direction(60), importance_score=2.0,
        created_at=clock() - timedelta(days=30),
    )  # fmt: skip
    phases.decay.run(world.context)
    assert status(world, n.id) == "Archived"
    world.restore_note(n.id)
    check_restored(world, n.id, "archived", "decay")
    full_cycle(world, clock)
    full_cycle(world, clock)
    assert status(world, n.id) == "Active"


def test_restore_after_stale_pruning_sticks(world, clock):
    n = put(world, "user gone", direction(31), user_id="u2")
    world.delete_user("u2")
    phases.pruning.run(world.context)
    assert status(world, n.id) == "Archived"
    world.restore_note(n.id)
    check_restored(world, n.id, "archived", "stale-reference")
    full_cycle(world, clock)
    assert status(world, n.id) == "Active"


def test_restore_a_merge_source_keeps_the_merged_note(world, clock):
    base = direction(7)
    sources = [
        put(world, f"tea {i}", near(base, i), created_at=clock() - timedelta(hours=5 - i))
        for i in range(3)
    ]
    [merged] = phases.consolidation.run(world.context)["newConsolidatedNoteIds"]
    first = sources[0].id
    world.restore_note(first)
    ev = check_restored(world, first, "merged", "consolidation")
    assert ev.related_note_ids == [merged]
    full_cycle(world, clock)
    full_cycle(world, clock)
    assert status(world, first) == "Active"  # not merged again, nor revoked by its merge
    assert status(world, merged) == "Active"  # the merged note stands
    assert first in world.get_note(merged).derived_from_note_ids
    assert [status(world, s.id) for s in sources[1:]] == ["Revoked", "Revoked"]


def test_restore_undoes_an_analysts_own_archive_without_a_rule(world):
    n = world.add_note("likes green tea", agent_id="agent")
    world.set_note_status(n.id, "Archived")
    world.restore_note(n.id)
    check_restored(world, n.id, "archived", None)
    assert world.sources.restored_rules([n.id]) == {}


def test_restore_errors(world):
    n = world.add_note("likes green tea", agent_id="agent")
    with pytest.raises(ValidationError, match="already injectable"):
        world.restore_note(n.id)
    for bad in ("no-such-note", "'; DROP TABLE note_events; --", "%_*"):
        with pytest.raises(NotFoundError):
            world.restore_note(bad)
    with pytest.raises(ValidationError):
        world.restore_note("")
    assert [e.event for e in world.history(n.id)] == ["created"]
