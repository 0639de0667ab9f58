"""The role cue and the relative time windows of ``injection/evidence.py``: written from
a description of user-assistant chats, alone, through ``fuse`` and through inject."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from memory_pipelines.injection.evidence import (
    WRITTEN_UNREAD,
    Cues,
    addressed_role,
    cue_boosts,
    role_of,
    time_windows,
)
from memory_pipelines.notes import Note

NOW = datetime(2023, 7, 20, 15, tzinfo=UTC)  # a Thursday
DAY = timedelta(days=1)


def day(y: int, m: int, d: int, h: int = 12) -> datetime:
    return datetime(y, m, d, h, tzinfo=UTC)


def boosts(query, notes, now=NOW, **weights):
    w = {"speaker_weight": 0.0, "entity_weight": 0.0, "time_weight": 0.0, **weights}
    hook = cue_boosts(query, now, **w, text_of=lambda n: n.note, created_of=lambda n: n.created_at)
    return None if hook is None else hook({n.id: n for n in notes})


def note(text, created=NOW):
    return Note(id=text, note=text, created_at=created)


def test_role_of_reads_a_chat_role_prefix_in_any_case():
    assert role_of("user: I adopted a cat") == "user"
    assert role_of("Assistant: Try the trail at dawn.") == "assistant"
    assert role_of("Caroline: I went hiking") is None
    assert role_of("the user: prefers tea") is None


def test_addressed_role_second_person_first_person_and_requests():
    assert addressed_role("What did you recommend for my trip?") == "assistant"
    assert addressed_role("You told me about a hotel, which one?") == "assistant"
    assert addressed_role("What was your suggestion for dinner?") == "assistant"
    assert addressed_role("What is the name of my cat?") == "user"
    assert addressed_role("When did I go to the gym?") == "user"
    # a request opening is not a question about the assistant
    assert addressed_role("Can you remind me what my dog's name is?") == "user"
    assert addressed_role("Could you tell me what you said about Rome?") == "assistant"
    assert addressed_role("Where did Caroline go hiking?") is None
    assert addressed_role("mine the logs for errors") == "user"


def test_role_boost_goes_to_the_addressed_roles_turns():
    notes = [note("user: I went to Rome"), note("assistant: Rome has the Borghese")]
    assert boosts("What did you suggest in Rome?", notes, role_weight=0.5) == {
        notes[0].id: 0.0,
        notes[1].id: 0.5,
    }
    assert boosts("Where did I go in May?", notes, role_weight=0.5) == {
        notes[0].id: 0.5,
        notes[1].id: 0.0,
    }
    # no role in the question and no other weight: no hook at all
    assert boosts("Where is Rome?", notes, role_weight=0.5) is None


def test_ago_windows_give_or_take_with_a_day_after():
    (three_days,) = time_windows("What did I cook 3 days ago?", NOW)
    assert three_days == (day(2023, 7, 16, 0), day(2023, 7, 20, 0))
    (weeks,) = time_windows("Which film did I see two weeks ago?", NOW)
    assert weeks == (day(2023, 7, 3, 0), day(2023, 7, 11, 0))
    (month,) = time_windows("What did you recommend a month ago?", NOW)
    assert month[0] == day(2023, 6, 5, 0) and month[1] == day(2023, 7, 7, 0)
    assert time_windows("How many days ago did I buy the bike?", NOW) == ()
    assert time_windows("What did I cook 3 days ago?", None) == ()


def test_weekday_weekend_past_span_iso_and_day_before_yesterday():
    (saturday,) = time_windows("What did I do last Saturday?", NOW)
    assert saturday == (day(2023, 7, 15, 0), day(2023, 7, 17, 0))
    (thursday,) = time_windows("What did I eat on Thursday?", NOW)  # today
    assert thursday[0] == day(2023, 7, 20, 0)
    (last_thursday,) = time_windows("What did I eat last Thursday?", NOW)
    assert last_thursday[0] == day(2023, 7, 13, 0)
    assert time_windows("What should I do next Monday?", NOW) == ()
    (weekend,) = time_windows("Where did I go last weekend?", NOW)
    assert weekend == (day(2023, 7, 15, 0), day(2023, 7, 18, 0))
    (past,) = time_windows("What did I read in the past 2 weeks?", NOW)
    assert past == (day(2023, 7, 6, 0), day(2023, 7, 22, 0))
    (iso,) = time_windows("What happened on 2023-05-08?", NOW)
    assert iso == (day(2023, 5, 8, 0), day(2023, 5, 10, 0))
    assert time_windows("What happened on 2023-02-30?", NOW) == ()
    (before,) = time_windows("What did I buy the day before yesterday?", NOW)
    assert before == (day(2023, 7, 18, 0), day(2023, 7, 20, 0))


def test_window_boost_covers_the_new_windows_and_yesterday():
    notes = [note("user: made soup", day(2023, 7, 17)), note("user: made bread", day(2023, 7, 1))]
    got = boosts("What did I make 3 days ago?", notes, time_window_weight=1.0)
    assert got == {notes[0].id: 1.0, notes[1].id: 0.0}
    cues = Cues.of("What did I buy the day before yesterday?", NOW)
    assert cues.window_match(day(2023, 7, 18)) == 1.0 and cues.window_match(day(2023, 7, 17)) == 0.0
    assert cues.window_match(None) == 0.0
    # yesterday/last week/... stay LoCoMo's date cue (time_weight), not counted twice
    yesterday = Cues.of("What did I buy yesterday?", NOW)
    assert yesterday.window_match(day(2023, 7, 19)) == 0.0
    assert yesterday.time_match(day(2023, 7, 19), "") == 1.0
    # LoCoMo's month cue is unchanged and stays under time_weight
    june = Cues.of("What did Melanie do in June?", NOW)
    assert (
        june.time_match(day(2023, 6, 27), "") == 1.0 and june.window_match(day(2023, 6, 27)) == 0.0
    )


def test_the_chat_cues_were_written_without_reading_any_conversation():
    assert WRITTEN_UNREAD == {"role": frozenset(), "time windows": frozenset()}


AGENT = "agent-chat"
CTX = {"agent_id": AGENT, "user_id": "u1"}


def test_inject_uses_role_and_window_cues_at_the_clocks_now(svc, clock):
    svc.configure_agent(AGENT, note_injection_strategy="Relevant", max_notes_to_inject=1)
    svc.add_note("user: I think the Lisbon hotel near the river is the best choice", **CTX)
    svc.add_note("assistant: For Lisbon the hotel near the river is the best choice", **CTX)
    clock.advance(hours=1)
    query = "Which Lisbon hotel did you say was the best choice?"
    svc.inject_config = replace(svc.inject_config, role_weight=2.0)
    assert svc.inject(CTX, query).notes[0].note.startswith("assistant:")
    assert (
        svc.inject(CTX, query.replace("did you say", "did I think"))
        .notes[0]
        .note.startswith("user:")
    )
    clock.advance(days=10)
    svc.add_note("user: I walked along the river in Lisbon", **CTX)
    clock.advance(days=3)
    svc.inject_config = replace(svc.inject_config, role_weight=0.0, time_window_weight=3.0)
    got = svc.inject(CTX, "What did I do in Lisbon 3 days ago?").notes
    assert got[0].note == "user: I walked along the river in Lisbon"


def test_durations_and_order_ask_for_a_time():
    assert Cues.of("How many days ago did I buy the bike?", NOW).asks_time
    assert Cues.of("How many weeks passed between my two trips?", NOW).asks_time
    assert Cues.of("Which did I visit first, Rome or Paris?", NOW).asks_time
    assert Cues.of("In what order did I read the three books?", NOW).asks_time
    assert not Cues.of("Which book did I like?", NOW).asks_time
    assert not Cues.of("How many books did I read?", NOW).asks_time
