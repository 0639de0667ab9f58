"""The administration service calls: list_notes paging and search, update_note,
archive_note, erase_note and the key binding (CONTRACT §2.9)."""

from __future__ import annotations

import pytest

from memory_pipelines.admin import decode_cursor, encode_cursor
from memory_pipelines.errors import NotFoundError, PermissionDeniedError, ValidationError


def _seed(svc, clock, n, **scope):
    out = []
    for i in range(n):
        out.append(svc.add_note(f"note {i}", agent_id="a1", **scope))
        clock.advance(seconds=1)
    return out


def _walk(svc, limit, between=None, **filters):
    seen, cursor, pages = [], None, 0
    while True:
        page = svc.list_notes(limit=limit, cursor=cursor, **filters)
        seen.extend(n.id for n in page.notes)
        pages += 1
        if between is not None:
            between(pages)
        if page.next_cursor is None:
            return seen
        cursor = page.next_cursor


def test_pages_are_newest_first_without_gaps_or_repeats_under_writes(svc, clock):
    notes = _seed(svc, clock, 11, user_id="u1", company_id="acme")
    # several notes at one instant: the id breaks the tie
    same = [svc.add_note(f"same {i}", agent_id="a1") for i in range(4)]
    written = []

    def write_more(_page):
        clock.advance(seconds=1)
        for _ in range(2):
            written.append(svc.add_note("written between pages", agent_id="a1"))

    seen = _walk(svc, 3, between=write_more)
    old = {n.id for n in notes + same}
    assert len(seen) == len(set(seen))  # no repeats
    assert old <= set(seen)  # no gaps
    assert not {n.id for n in written} & set(seen)  # newer notes sort before the cursor
    first = svc.list_notes(limit=500).notes
    keys = [(n.created_at, n.id) for n in first]
    assert keys == sorted(keys, reverse=True)


def test_filters_and_a_literal_case_insensitive_search(svc, clock):
    svc.add_note("Likes 100% GREEN tea", agent_id="a1", user_id="u1", company_id="acme")
    svc.add_note("likes green coffee", agent_id="a2", user_id="u2", company_id="globex")
    svc.add_note("O'Neil uses back\\slash and snake_case", agent_id="a1", status="Archived")
    assert [n.note for n in svc.list_notes(q="green TEA").notes] == ["Likes 100% GREEN tea"]
    assert len(svc.list_notes(q="green").notes) == 2
    assert svc.list_notes(q="100%").notes[0].agent_id == "a1"
    assert svc.list_notes(q="1_0%").notes == []  # _ and % are not wildcards
    assert len(svc.list_notes(q="o'neil back\\slash snake_case").notes) == 1
    assert svc.list_notes(q="' OR 1=1 --").notes == []
    assert svc.list_notes(agent_id="a1' OR 1=1 --").notes == []
    assert [n.user_id for n in svc.list_notes(user_id="u2").notes] == ["u2"]
    assert [n.company_id for n in svc.list_notes(company_id="acme").notes] == ["acme"]
    assert len(svc.list_notes(agent_id="a1").notes) == 2
    assert [n.status for n in svc.list_notes(status="Archived").notes] == ["Archived"]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limit": 0},
        {"limit": 501},
        {"limit": "5"},
        {"status": "Sleeping"},
        {"q": "\ud800"},
        {"q": "x" * 1001},
        {"cursor": "not a cursor"},
        {"cursor": encode_cursor(None, "x")[:-3] + "!!!"},
        {"user_id": "u\n1"},
    ],
)
def test_bad_listing_arguments_are_validation_errors(svc, kwargs):
    with pytest.raises(ValidationError):
        svc.list_notes(**kwargs)


def test_cursor_round_trip(clock):
    assert decode_cursor(encode_cursor(clock(), "id-1")) == (clock(), "id-1")
    assert decode_cursor(encode_cursor(None, "id-2")) == (None, "id-2")


def test_update_note_records_one_event_and_one_audit_step(svc, clock):
    note = svc.add_note("likes tea", agent_id="a1", user_id="u1")
    old_vector = svc.store.notes.vectors([note.id])[note.id]
    clock.advance(minutes=1)
    changed = svc.update_note(note.id, note="  likes coffee ", type="Context", protection_tier="Protected")
    assert (changed.note, changed.type, changed.protection_tier) == ("likes coffee", "Context", "Protected")
    assert (svc.store.notes.vectors([note.id])[note.id] != old_vector).any()  # re-embedded
    history = svc.history(note.id)
    assert [e.event for e in history] == ["created", "updated"]
    assert history[-1].text_after == "likes coffee"
    steps = [s for s in svc.sources.steps() if s["step_type"] == "Admin"]
    assert len(steps) == 1 and steps[0]["input_json"]["fields"] == ["note", "protection_tier", "type"]
    assert "coffee" not in str(steps[0])  # audit rows carry no text
    # status only: the status event
    svc.update_note(note.id, status="Archived")
    assert svc.history(note.id)[-1].event == "archived"
    restored = svc.update_note(note.id, status="Active")
    assert restored.status == "Active" and svc.history(note.id)[-1].status_after == "Active"
    # nothing changed: nothing recorded
    svc.update_note(note.id, status="Active")
    assert len(svc.history(note.id)) == 4


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"note": " "}, {"note": "\udc80x"}, {"note": "x" * 2001}, {"note": 5}, {"type": "Wish"},
     {"status": "Gone"}, {"protection_tier": "Max"}],
)
def test_bad_updates_are_validation_errors_and_change_nothing(svc, kwargs):
    note = svc.add_note("likes tea", agent_id="a1")
    with pytest.raises(ValidationError):
        svc.update_note(note.id, **kwargs)
    assert svc.get_note(note.id).note == "likes tea" and len(svc.history(note.id)) == 1


def test_unknown_notes_are_not_found(svc):
    for call in (svc.note, svc.archive_note, svc.erase_note):
        with pytest.raises(NotFoundError):
            call("missing")
    with pytest.raises(NotFoundError):
        svc.update_note("missing", status="Active")


def test_archive_note(svc):
    note = svc.add_note("likes tea", agent_id="a1")
    assert svc.archive_note(note.id).status == "Archived"
    assert svc.archive_note(note.id).status == "Archived"
    assert [e.event for e in svc.history(note.id)] == ["created", "archived"]


def test_erase_note_leaves_a_purged_event_without_text(svc, home):
    svc.configure_agent("a1")
    keep = svc.add_note("keep this one", agent_id="a1")
    gone = svc.add_note("secret-marker-7f3a likes tea", agent_id="a1", user_id="u1")
    svc.update_note(gone.id, note="secret-marker-7f3a likes coffee")
    svc.sources.record_injection(
        [
            {"run_id": "r1", "agent_id": "a1", "user_id": "u1", "item_kind": "note",
             "item_id": note_id, "rank": rank, "injected_at": svc.now()}
            for rank, note_id in enumerate([gone.id, keep.id])
        ]
    )
    counts = svc.erase_note(gone.id)
    assert counts["notes"] == 1 and counts["note_events"] == 2
    assert svc.get_note(gone.id) is None and svc.get_note(keep.id) is not None
    history = svc.history(gone.id)
    assert [e.event for e in history] == ["purged"] and history[0].text_after is None
    assert counts["injection_events"] == 1
    assert [r["item_id"] for r in svc.sources.injection_events_of("r1")] == [keep.id]
    for path in (home / "lance").rglob("*"):
        if path.is_file():
            assert b"secret-marker-7f3a" not in path.read_bytes(), path


def test_erase_note_leaves_its_text_nowhere_in_the_home(svc, home):
    """A written note's text is in its "Memory Write" audit step and its events too: erase
    removes them all, and the events check still passes (an erased note is not dangling)."""
    svc.configure_agent("a1")
    ctx = {"agent_id": "a1", "run_id": "r-erase", "user_id": "u1", "company_id": "acme"}
    (result,) = svc.write(ctx, [{"note": "erase-marker-91c2 owns a red bicycle", "type": "Context"}])
    svc.write(ctx, [{"note": "keeps a blue kayak in the garage", "type": "Context"}])
    counts = svc.erase_note(result.note_id)
    assert counts["run_steps"] >= 1
    assert svc.sources.event_note_ids() == {n for n in svc.notes()["id"]}
    for path in home.rglob("*"):
        if path.is_file():
            assert b"erase-marker-91c2" not in path.read_bytes(), path
    assert len(svc.notes()) == 1


def test_a_bound_key_sees_only_its_binding(svc):
    mine = svc.add_note("mine", agent_id="a1", user_id="u1", company_id="acme")
    other_agent = svc.add_note("other agent", agent_id="a2", user_id="u1", company_id="acme")
    theirs = svc.add_note("theirs", agent_id="a1", user_id="u9", company_id="globex")
    scoped = svc.add_note(
        "scoped", agent_id="a1", company_id="acme", primary_scope_entity_id="e", primary_scope_record_id="r"
    )
    no_company = svc.add_note("agent-wide", agent_id="a1")
    company_key = {"company_id": "acme", "admin": False}
    agent_key = {"company_id": "acme", "agent_id": "a1", "admin": False, "role": "analyst"}
    ids = {n.id for n in svc.list_notes(key=company_key).notes}
    assert ids == {mine.id, other_agent.id}
    assert {n.id for n in svc.list_notes(key=agent_key).notes} == {mine.id}
    assert {n.id for n in svc.list_notes(key={"admin": True}).notes} >= {theirs.id, scoped.id, no_company.id}
    with pytest.raises(PermissionDeniedError):
        svc.list_notes(company_id="globex", key=company_key)
    with pytest.raises(PermissionDeniedError):
        svc.list_notes(agent_id="a2", key=agent_key)
    for note in (theirs, scoped, no_company, other_agent):
        with pytest.raises(NotFoundError):
            svc.note(note.id, key=agent_key)
        with pytest.raises(NotFoundError):
            svc.update_note(note.id, status="Archived", key=agent_key)
    assert svc.note(mine.id, key=agent_key).id == mine.id
    with pytest.raises(PermissionDeniedError):
        svc.erase_note(mine.id, key=agent_key)
    assert svc.get_note(theirs.id).status == "Active"
