"""``bench extraction`` on a synthetic two-session conversation: each session is one rated
conversation, the first speaker is the user, relative dates resolve from the session
date, and recall/precision count evidence-turn matches."""

from __future__ import annotations

import json

import numpy as np
import pytest

from memory_pipelines.bench import extraction
from memory_pipelines.bench.judge_calls import failure_kind
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.errors import JudgeError, ValidationError
from memory_pipelines.judge import ConversationMessage, LiteLLMJudge, OfflineJudge
from memory_pipelines.litellm_loader import import_litellm

SAMPLE = {
    "sample_id": "synth-1",
    "conversation": {
        "speaker_a": "Priya",
        "speaker_b": "Tom",
        "session_1_date_time": "10:00 am on 4 March, 2024",
        "session_1": [
            {"speaker": "Priya", "dia_id": "D1:1", "text": "Hi Tom! How are you?"},
            {"speaker": "Tom", "dia_id": "D1:2", "text": "Good! Anything new?"},
            {
                "speaker": "Priya",
                "dia_id": "D1:3",
                "text": "I adopted a rescue greyhound yesterday.",
            },
            {"speaker": "Tom", "dia_id": "D1:4", "text": "Amazing, congrats!"},
        ],
        "session_2_date_time": "6:30 pm on 20 March, 2024",
        "session_2": [
            {
                "speaker": "Priya",
                "dia_id": "D2:1",
                "text": "I'm training for a charity bike ride in June.",
            },
            {"speaker": "Tom", "dia_id": "D2:2", "text": "Wow, good luck!"},
            {"speaker": "Priya", "dia_id": "D2:3", "text": "Thanks so much!"},
            {"speaker": "Tom", "dia_id": "D2:4", "text": "Bye!"},
        ],
    },
    "observation": {
        "session_1_observation": {
            "Priya": [["Priya adopted a rescue greyhound.", "D1:3"]],
            "Tom": [["Tom is happy for Priya.", "D1:4"]],
        },
        "session_2_observation": {
            "Priya": [
                ["Priya is training for a charity bike ride.", "D2:1"],
                ["Priya's favourite colour is teal.", "D2:9"],
            ]
        },
    },
    "qa": [],
}


def test_extraction_protocol_on_two_sessions(tmp_path):
    data = tmp_path / "synth.json"
    data.write_text(json.dumps([SAMPLE]))
    [d] = extraction.load_dialogues(data)
    assert d.user == "Priya" and len(d.sessions) == 2
    assert [o.text for o in d.observations][0] == "User adopted a rescue greyhound."
    assert len(d.observations) == 3  # the first speaker's only

    [r] = extraction.run_extraction(data, embedder=HashEmbedder(64))
    texts = sorted(n.note for n in r.notes)
    assert texts == [
        "User adopted a rescue greyhound on 3 March 2024.",
        "User is training for a charity bike ride in June.",
    ]
    assert {n.source_conversation_id for n in r.notes} == {"synth-1/session_1", "synth-1/session_2"}
    covered, observations, matched, notes = r.figures()
    assert (covered, observations, matched, notes) == (2, 3, 2, 2)
    assert r.figures({"dated_event"}) == (1, 3, 1, 1)
    missed, unmatched = extraction.samples([r], 5)
    assert missed == ["synth-1 s2 D2:9: User's favourite colour is teal."]
    assert unmatched == []


def result(sample_id: str, rules: list[str], covers: list[list[bool]]):
    """A scored conversation: one note per rule family in ``rules``, ``covers`` its
    notes x observations table."""
    r = extraction.ConversationResult(
        sample_id, 1, [None] * len(covers[0]), [None] * len(rules), rules, 0.0
    )  # type: ignore[list-item]
    r.covers = np.array(covers, dtype=bool)
    return r


def test_folds_choose_rule_families_on_the_tune_conversations_only():
    none, bad = [False, False], ["bad"] * 3
    a = result("a", ["good", *bad], [[True, False], none, none, none])
    b = result("b", ["good", *bad], [[False, True], none, none, none])
    c = result("c", ["good", *bad], [[True, False], [False, True], none, none])
    folds = extraction.folds([a, b, c])
    assert [f.chosen for f in folds] == [("good",), ("good",), ("good",)]
    assert folds[2].validation == (0.5, 1.0)  # "bad" would have covered one more in c


def test_a_family_is_chosen_only_when_it_raises_the_tune_recall():
    """"echo" is precise but covers only what "good" covers (a tie: left out); "late"
    covers nothing new and would keep the precision above the target; "extra" covers a
    new observation."""
    x = result(
        "x",
        ["good", "good", "echo", "extra"],
        [[True, False, False], [False, True, False], [True, False, False], [False, False, True]],
    )
    y = result("y", ["good", "echo", "late"], [[True, False], [True, False], [False, False]])
    assert extraction.choose_rules([x, y]) == ("good", "extra")
    assert extraction.choose_rules([y]) == ("echo",)  # equal on y: the first by name, not both
    assert extraction.choose_rules([result("z", ["late"], [[False]])]) == ()


def test_a_family_made_redundant_by_a_later_one_is_dropped():
    """"solo" is chosen first (precision 1.0) and raises recall then, but "broad", chosen
    after it, covers its observation too: the final choice needs only "broad"."""
    w = result("w", ["solo", "broad", "broad", "broad"],
               [[True, False], [True, False], [False, True], [False, False]])
    assert extraction.choose_rules([w]) == ("broad",)
    assert extraction.choose_rules([w], target=0.7) == ("solo", "broad")  # 2/3 < 0.7 without solo


def test_nested_folds_choose_the_floor_without_the_held_out_conversation():
    none = [False, False]
    a = result("a", ["good", "loose", "loose"], [[True, False], [False, True], none])
    b = result("b", ["good", "loose", "loose"], [[True, False], [False, True], none])
    c = result("c", ["good", "loose", "loose"], [[True, False], none, none])
    nested = extraction.nested_folds([a, b, c], floors=(0.6, 0.8))
    by = {f.held_out: f for f in nested}
    # "loose" (precision 1/2) lifts recall on a and b; at floor 0.6 its pooled precision
    # with "good" (2/3 or 3/4 on two tune conversations) passes, at 0.8 it does not
    assert by["c"].floor == 0.6 and by["c"].chosen == ("good", "loose")
    assert by["c"].validation == (0.5, 1 / 3)  # c's own data never entered the choice
    changed = result("c", ["good", "loose", "loose"], [[False, False], none, none])
    again = {f.held_out: f for f in extraction.nested_folds([a, b, changed], floors=(0.6, 0.8))}
    assert (again["c"].floor, again["c"].chosen) == (by["c"].floor, by["c"].chosen)
    assert not any(f.read_while_writing for f in nested)
    flagged = extraction.nested_folds([a, b, c], floors=(0.6,), read={"b"})
    assert [f.read_while_writing for f in flagged] == [False, True, False]
    assert "b (read)" in extraction.nested_table(flagged)


def test_main_states_the_nested_protocol_and_the_read_conversations(tmp_path, capsys):
    data = tmp_path / "synth.json"
    data.write_text(json.dumps([{**SAMPLE, "sample_id": "conv-26"}, SAMPLE]))
    assert extraction.main(["--data", str(data), "--embedder", "hash"]) == 0
    out = capsys.readouterr().out
    assert "nested leave-one-conversation-out" in out
    assert "conv-26 (read)" in out and "not held-out ones" in out
    assert "nested outer: mean recall" in out


class _Timeout(Exception):
    """Stands for litellm's Timeout (the class name is what counts)."""


class _FailingJudge:
    """The offline judge, except that note extraction never succeeds: the first call
    times out, the later ones return a reply that is not JSON."""

    def __init__(self) -> None:
        self.inner = OfflineJudge(HashEmbedder(64))
        self.name = "failing"
        self.calls = 0

    def extract_notes(self, messages, existing, *, rating_context):
        self.calls += 1
        if self.calls == 1:
            raise JudgeError(
                "failing: extract notes call failed (Timeout): 30 s", kind="timed out"
            ) from _Timeout()
        raise JudgeError(
            "failing: extract notes: the model returned malformed JSON: x", kind="unparsable reply"
        )

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


def test_failure_kind_names_what_kept_the_judge_from_deciding():
    """The kinds come from where the litellm judge raises (a mocked completion each)."""
    litellm = import_litellm()

    def kind(reply, **kw):
        if isinstance(reply, dict) and "choices" not in reply:
            reply = json.dumps(reply)
        judge = LiteLLMJudge(
            "openai/scripted", num_retries=0, completion_kwargs={"mock_response": reply}, **kw
        )
        message = ConversationMessage("user", "I adopted a greyhound.", message_id="m1")
        with pytest.raises(JudgeError) as info:
            judge.extract_notes([message], [], rating_context="unrated")
        return failure_kind(info.value)

    timeout = litellm.Timeout(message="slow", model="scripted", llm_provider="openai")
    assert kind(timeout) == "timed out"
    bad = litellm.BadRequestError(message="ctx", model="scripted", llm_provider="openai")
    assert kind(bad) == "call failed (BadRequestError)"
    assert kind("") == "unparsable reply" and kind("I think so.") == "unparsable reply"
    message = {"role": "assistant", "content": '{"notes": [{"content": "User ado'}
    cut = {"choices": [{"index": 0, "message": message, "finish_reason": "length"}]}
    assert kind(cut, max_tokens=256) == "cut off at max_tokens"
    schema = {"notes": [{"content": "x y z", "type": "Backdoor", "confidence": 90}]}
    assert kind(schema) == "reply fails its schema"
    unknown = {"notes": [{"content": "User adopted a greyhound.", "type": "Context",
                          "confidence": 90, "sourceMessageId": "m9"}]}
    assert kind(unknown) == "refused by the judge's checks"


def test_a_judge_that_gives_no_decision_is_reported_by_kind(tmp_path, capsys):
    data = tmp_path / "synth.json"
    data.write_text(json.dumps([SAMPLE]))
    [r] = extraction.run_extraction(data, embedder=HashEmbedder(64), llm=_FailingJudge())
    assert r.notes == [] and r.figures() == (0, 3, 0, 0)
    calls = r.judge.outcomes["extract_notes"]
    # the first session's batch failed, so the second cycle asks for it again
    assert calls == {"timed out": 1, "unparsable reply": 2}
    assert r.judge.failed() == 3 and r.judge.proposed == 0
    line = r.judge.line()
    assert line.startswith("extract notes 3 (unparsable reply 2, timed out 1)")
    assert "notes proposed 0" in line
    assert "malformed JSON" in r.judge.examples["unparsable reply"]


def test_limit_sessions_scores_the_first_sessions_on_their_observations(tmp_path):
    data = tmp_path / "synth.json"
    data.write_text(json.dumps([SAMPLE]))
    [d] = extraction.load_dialogues(data)
    first = d.first_sessions(1)
    assert [s.number for s in first.sessions] == [1]
    assert [o.text for o in first.observations] == ["User adopted a rescue greyhound."]
    assert d.first_sessions(None) is d and d.first_sessions(5) is d
    [r] = extraction.run_extraction(data, embedder=HashEmbedder(64), limit_sessions=1)
    assert r.sessions == 1 and r.figures() == (1, 1, 1, 1)
    assert r.judge.outcomes["extract_notes"] == {"ok": 1} and r.judge.proposed == 1


def test_limit_sessions_below_one_is_refused(tmp_path):
    data = tmp_path / "synth.json"
    data.write_text(json.dumps([SAMPLE]))
    for bad in ("0", "-1"):
        with pytest.raises(ValidationError, match="--limit-sessions must be 1 or more"):
            extraction.main(["--data", str(data), "--embedder", "hash", "--limit-sessions", bad])
