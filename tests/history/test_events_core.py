"""The event core: the ``note_events`` table, the notebook's journal and ``svc.history``
for the analyst's own paths (add_note, update_notes, set_note_status)."""

from __future__ import annotations

from memory_pipelines import NoteEvent
from memory_pipelines.note_events import fold_changes


def test_add_note_records_created_with_every_field(svc, clock):
    note = svc.add_note("likes green tea", agent_id="a1", user_id="u1", company_id="c1")
    (ev,) = svc.history(note.id)
    assert isinstance(ev, NoteEvent)
    assert (ev.event, ev.actor, ev.status_before, ev.status_after) == ("created", "analyst", None, "Active")
    assert ev.at == clock() == note.updated_at
    assert ev.text_after == "likes green tea"
    assert (ev.agent_id, ev.user_id, ev.company_id) == ("a1", "u1", "c1")
    assert ev.changes["note"] == "likes green tea" and ev.changes["type"] == "Preference"
    assert ev.run_id is None and ev.related_note_ids == []


def test_status_and_text_changes_are_events_in_order(svc, clock):
    note = svc.add_note("likes green tea", agent_id="a1")
    clock.advance(hours=1)
    svc.set_note_status(note.id, "Archived", comment="wrong")
    clock.advance(hours=1)
    svc.set_note_status(note.id, "Active")
    clock.advance(hours=1)
    (current,) = [svc.get_note(note.id)]
    svc.update_notes([(current, {"note": "likes black tea"})])
    events = svc.history(note.id)
    assert [e.event for e in events] == ["created", "archived", "status-changed", "updated"]
    assert [(e.status_before, e.status_after) for e in events[1:]] == [
        ("Active", "Archived"),
        ("Archived", "Active"),
        ("Active", "Active"),
    ]
    assert events[1].details["comment"] == "wrong"
    assert events[2].text_after is None and events[3].text_after == "likes black tea"
    assert events[3].changes == {"note": "likes black tea"}
    assert [e.at for e in events] == sorted(e.at for e in events)
    state = fold_changes(events[:2])
    assert state["status"] == "Archived" and state["note"] == "likes green tea"
    assert fold_changes(events)["note"] == "likes black tea"


def test_unknown_ids_have_no_history(svc):
    assert svc.history("no-such-note") == []
    assert svc.history("") == []
    assert svc.history("'; DROP TABLE note_events; --") == []


def test_events_persist_across_opens(open_service):
    with open_service() as s:
        note_id = s.add_note("prefers trains", agent_id="a1").id
    with open_service() as s:
        assert [e.event for e in s.history(note_id)] == ["created"]


def test_access_count_folds_are_not_events(svc):
    note = svc.add_note("likes green tea", agent_id="a1")
    svc.notebook.update_notes([(note, {"access_count": 3})], event=None)
    assert [e.event for e in svc.history(note.id)] == ["created"]


def test_purge_erases_the_users_events(svc):
    mine = svc.add_note("u1 is allergic to peanuts", agent_id="a1", user_id="u1")
    svc.set_note_status(mine.id, "Archived")
    other = svc.add_note("u2 likes trains", agent_id="a1", user_id="u2")
    counts = svc.purge_user("u1")
    assert counts["note_events"] == 2
    assert svc.history(mine.id) == []
    assert [e.event for e in svc.history(other.id)] == ["created"]


def test_created_event_carries_the_saved_created_at(svc, clock):
    note = svc.add_note("prefers aisle seats", agent_id="a1")
    (ev,) = svc.history(note.id)
    assert ev.changes["created_at"].startswith(clock().strftime("%Y-%m-%dT%H:%M:%S"))
