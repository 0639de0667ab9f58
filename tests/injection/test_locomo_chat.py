"""``bench locomo --format chat``: the chat view of a LoCoMo-format file (user/assistant
roles, the assistant's turns joined, questions in the first and second person), and the
benchmark over it (joined turns count for every turn they stand for)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from test_injection import locomo_sample

from memory_pipelines.bench import locomo
from memory_pipelines.bench.locomo_data import chat_sample, load_conversations, second_person
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.errors import MemoryPipelineError


def test_second_person_turns_the_two_names_into_pronouns():
    def sp(q: str) -> str:
        return second_person(q, "Ann", "Bo")

    assert sp("When did Ann go to the support group?") == "When did I go to the support group?"
    assert sp("What did Bo paint recently?") == "What did you paint recently?"
    assert sp("What is Ann's identity?") == "What is my identity?"
    assert sp("What did Bo give to Ann?") == "What did you give to me?"
    assert sp("Is Ann a painter?") == "Am I a painter?"
    assert sp("Has Bo been to Paris?") == "Have you been to Paris?"
    assert sp("How does Bo feel about Ann’s sister?") == "How do you feel about my sister?"
    assert sp("Bo is kind. Ann is too.") == "You are kind. I am too."
    # other names, and words that only start with a speaker's name, stay
    assert sp("Did Annabel meet Bob?") == "Did Annabel meet Bob?"


def test_possessive_apostrophe_of_a_name_ending_in_s():
    assert second_person("Where is James' house?", "James", "Lee") == "Where is my house?"


def sample_with_a_long_assistant_side() -> dict:
    s = locomo_sample("conv-x", "Pixel", "Zion")
    s["conversation"]["session_1"] += [
        {"speaker": "Ann", "dia_id": "D1:4", "text": "Where was that?"},
        {"speaker": "Bo", "dia_id": "D1:5", "text": "In Utah."},
        {"speaker": "Bo", "dia_id": "D1:6", "text": "Then Nevada."},
    ]
    return s


def test_chat_view_roles_joined_assistant_turns_and_questions():
    view = chat_sample(sample_with_a_long_assistant_side(), join=2)
    conv = view["conversation"]
    assert (conv["speaker_a"], conv["speaker_b"]) == ("user", "assistant")
    s1 = conv["session_1"]
    assert [(t["speaker"], t["dia_id"], t.get("dia_ids")) for t in s1] == [
        ("user", "D1:1", None),
        ("assistant", "D1:2", ["D1:2", "D1:3"]),
        ("user", "D1:4", None),
        ("assistant", "D1:5", ["D1:5", "D1:6"]),
    ]
    assert s1[1]["text"] == (
        "Lovely, congratulations! I went hiking in Zion last week. "
        "[shares photo: a photo of a red canyon]"
    )
    assert conv["session_1_date_time"] == "1:56 pm on 8 May, 2023"
    assert [q["question"] for q in view["qa"]][:2] == [
        "What is the name of my cat Pixel?",
        "Where did you go hiking, Zion?",
    ]
    assert view["qa"][1]["evidence"] == ["D:1:3"]  # evidence ids untouched
    # a whole session's assistant turns in one
    whole = chat_sample(sample_with_a_long_assistant_side(), join=0)["conversation"]["session_1"]
    assert [t.get("dia_ids") for t in whole] == [None, ["D1:2", "D1:3", "D1:5", "D1:6"], None]
    with pytest.raises(MemoryPipelineError):
        chat_sample(sample_with_a_long_assistant_side(), join=-1)


def test_chat_view_loads_as_role_notes_that_stand_for_their_turns(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps([sample_with_a_long_assistant_side()]))
    (conv,) = load_conversations(path, format="chat", chat_join=2)
    assert [t.text.split(":")[0] for t in conv.turns] == ["user", "assistant"] * 2 + [
        "user",
        "assistant",
    ]
    assert conv.turns[1].evidence_ids == ("D1:2", "D1:3") and conv.turns[0].evidence_ids == (
        "D1:1",
    )
    assert conv.turns[4].created_at == datetime(2023, 6, 27, 10, 37, tzinfo=UTC)
    notes = locomo.turn_notes(conv)
    assert (
        notes[1].note.startswith("assistant: Lovely")
        and notes[1].source_conversation_detail_id == "D1:2"
    )
    with pytest.raises(MemoryPipelineError):
        load_conversations(path, format="transcript")


def test_a_joined_turn_counts_for_every_turn_it_stands_for():
    m = locomo.MethodResult("m")
    m.add(1, [("D1:2", "D1:3"), "D1:1"], ["D1:3"], (1, 2), "s")
    m.add(1, ["D1:1", ("D1:2", "D1:3")], ["D1:1", "D1:3"], (1, 2), "s")
    assert m.recall(1) == 1.0 and m.recall(1, kind="all") == 0.5
    assert m.recall(2, kind="all") == 1.0


def test_bench_runs_the_chat_format_end_to_end(tmp_path, capsys):
    path = tmp_path / "tiny.json"
    path.write_text(
        json.dumps(
            [sample_with_a_long_assistant_side(), locomo_sample("conv-y", "Mochi", "Yosemite")]
        )
    )
    result = locomo.run_locomo(
        path, ks=(1, 5), embedder=HashEmbedder(64), format="chat", chat_join=2
    )
    # conv-x: 8 turns -> 6 notes (two assistant pairs); conv-y: 5 turns -> 4 notes (one)
    assert result.notes == 10 and result.counts == {4: 2, 1: 2, 2: 2}
    assert result.method("inject (hybrid)").recall(5, kind="all") == 1.0
    args = ["--data", str(path), "--k", "1", "5", "--embedder", "hash", "--format", "chat"]
    assert locomo.main([*args, "--cv", "--chat-join", "2"]) == 0
    out = capsys.readouterr().out
    assert "format: chat" in out and "bm25 (numpy)" in out and "dense (cosine)" in out
    assert "outer any@5" in out


def test_nested_estimate_per_category_pools_the_outer_folds():
    from memory_pipelines.bench.locomo_cv import nested_by_category, nested_cross_validate

    m = locomo.MethodResult("inject (hybrid)")
    # conv a: one temporal hit, one single-hop miss; conv b: two temporal misses
    for sid, cat, ok in [("a", 2, True), ("a", 4, False), ("b", 2, False), ("b", 2, False)]:
        m.add(cat, ["D1:1"] if ok else ["D9:9"], ["D1:1"], (5,), sid)
    result = locomo.LocomoResult((5,), [m], {2: 3, 4: 1}, [], 0, 0, 0.0)
    folds = nested_cross_validate(result, ["inject (hybrid)"])
    table = nested_by_category(result, folds, {2: "temporal", 4: "single-hop"})
    rows = {line.split("|")[1].strip(): line.split("|")[2:4] for line in table.splitlines()[2:]}
    assert [v.strip() for v in rows["overall"]] == ["4", "0.250"]
    assert [v.strip() for v in rows["2 temporal"]] == ["3", "0.333"]
    assert [v.strip() for v in rows["4 single-hop"]] == ["1", "0.000"]


def test_time_probe_adds_how_long_ago_to_one_session_when_questions():
    from memory_pipelines.bench.locomo_data import time_probe_sample

    s = locomo_sample("conv-x", "Pixel", "Zion")  # sessions on 8 May and 27 June 2023
    s["qa"] += [
        {"question": "When did Ann adopt Pixel?", "evidence": ["D1:1"], "category": 2},
        {"question": "When did the sister move?", "evidence": ["D2:1"], "category": 2},
        {"question": "When did both happen?", "evidence": ["D1:1", "D2:1"], "category": 2},
        {"question": "When did Ann adopt Pixel?", "evidence": ["D1:1"], "category": 4},
    ]
    got = [q["question"] for q in time_probe_sample(s)["qa"][-4:]]
    assert got == [
        "When did Ann adopt Pixel, about 7 weeks ago?",  # 50 days before the last session
        "When did the sister move?",  # the last session itself: no phrase
        "When did both happen?",  # two sessions
        "When did Ann adopt Pixel?",  # not temporal
    ]
