"""Evidence features of the fused ranking: rank fusion, session evidence, speaker/entity
and time cues (``injection/evidence.py``), alone, through ``fuse`` and through inject."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from memory_pipelines.injection.evidence import (
    Cues,
    cue_boosts,
    names_in,
    ranks,
    rrf_base,
    session_best,
    speaker_of,
)
from memory_pipelines.injection.fusion import fuse
from memory_pipelines.notes import Note
from memory_pipelines.store import Hit

NOW = datetime(2023, 7, 20, 12, tzinfo=UTC)


def note(text, conv=None, created=NOW):
    return Note(id=text, note=text, source_conversation_id=conv, created_at=created)


def hit(text, score, conv=None, created=NOW):
    return Hit(note(text, conv, created), score)


def fused(vector, text, **kw):
    return fuse(
        vector,
        text,
        text_of=lambda n: n.note,
        floor=0.2,
        vector_weight=kw.pop("vector_weight", 0.5),
        text_weight=kw.pop("text_weight", 0.5),
        conversation_of=lambda n: n.source_conversation_id,
        **kw,
    )


def boosts_of(query, items, **weights):
    w = {"speaker_weight": 0.0, "entity_weight": 0.0, "time_weight": 0.0, **weights}
    hook = cue_boosts(
        query, NOW, **w, text_of=lambda n: n.note, created_of=lambda n: n.created_at
    )
    assert hook is not None
    return hook({n.id: n for n in items})


# =========================================================================== rank fusion


def test_ranks_are_one_based_with_id_ties():
    assert ranks({"b": 1.0, "a": 1.0, "c": 3.0}) == {"c": 1, "a": 2, "b": 3}


def test_rrf_base_weights_reciprocal_ranks_and_skips_below_floor():
    out = rrf_base(
        {"a": 0.9, "b": 0.5, "c": 0.1},
        {"b": 3.0, "c": 1.0},
        floor=0.2,
        vector_weight=0.4,
        text_weight=0.6,
        k=10,
    )
    assert out["a"] == pytest.approx(0.4 * 1.0)
    assert out["b"] == pytest.approx(0.4 * 11 / 12 + 0.6 * 1.0)
    assert out["c"] == pytest.approx(0.6 * 11 / 12)  # its cosine is under the floor


def test_fuse_rrf_mode_ranks_by_reciprocal_ranks_not_score_gaps():
    vector = [hit("b", 0.95), hit("a", 0.94), hit("c", 0.30)]
    text = [hit("c", 10.0), hit("a", 9.9), hit("b", 0.5)]
    by_score = [c.item.id for c in fused(vector, text)]
    by_rank = [c.item.id for c in fused(vector, text, fusion="rrf", rrf_k=1.0)]
    assert by_score == ["a", "c", "b"]  # a is close to the best in both lists
    assert by_rank == ["b", "c", "a"]  # b, c: first in one list (0.75); a: second in both


# =========================================================================== session evidence


def test_session_best_includes_the_candidate_itself():
    base = {"a": 0.9, "b": 0.2, "x": 0.5}
    assert session_best(base, [["a", "b"], ["x"]]) == {"a": 0.9, "b": 0.9, "x": 0.5}


def test_fuse_session_weight_lifts_turns_of_the_best_session():
    vector = [hit("a", 0.9, "s1"), hit("x", 0.6, "s2"), hit("b", 0.55, "s1")]
    plain = [c.item.id for c in fused(vector, [], vector_weight=1.0, text_weight=0.0)]
    lifted = fused(vector, [], vector_weight=1.0, text_weight=0.0, session_weight=0.5)
    assert plain == ["a", "x", "b"]
    assert [c.item.id for c in lifted] == ["a", "b", "x"]
    assert lifted[0].score == pytest.approx(1.0 + 0.5)


# =========================================================================== question cues


def test_speaker_of_and_names_in():
    assert speaker_of("Caroline: I went to a support group") == "Caroline"
    assert speaker_of("Dr Ann Lee: hello") == "Dr Ann Lee"
    assert speaker_of("User prefers tea: always") is None  # not a capitalised-word prefix
    assert speaker_of("no speaker here") is None
    assert names_in("When did Caroline's sister visit Paris?") == {"Caroline", "Paris"}


def test_cues_read_months_years_relative_phrases_and_time_questions():
    cues = Cues.of("Did Melanie go camping in June 2023 or last year?", NOW)
    assert cues.months == {6} and cues.years == {2023}
    assert cues.spans == ((datetime(2022, 1, 1, tzinfo=UTC), datetime(2023, 1, 1, tzinfo=UTC)),)
    assert cues.names == {"Melanie"} and not cues.asks_time
    assert Cues.of("When did she paint it?", NOW).asks_time
    assert Cues.of("How long has he lived there?", NOW).asks_time
    assert Cues.of("May I ask what she paints?", NOW).months == set()  # the modal verb
    assert Cues.of("What happened on 7 May?", NOW).months == {5}


def test_time_match_by_month_year_span_and_time_phrase():
    june = Cues.of("What did Melanie do in June?", NOW)
    assert june.time_match(datetime(2023, 6, 27, tzinfo=UTC), "") == 1.0
    assert june.time_match(datetime(2023, 7, 3, tzinfo=UTC), "") == 1.0  # told a month later
    assert june.time_match(datetime(2023, 8, 3, tzinfo=UTC), "") == 0.0
    yesterday = Cues.of("What did she buy yesterday?", NOW)
    assert yesterday.time_match(datetime(2023, 7, 19, 9, tzinfo=UTC), "") == 1.0
    assert yesterday.time_match(datetime(2023, 7, 18, 9, tzinfo=UTC), "") == 0.0
    when = Cues.of("When did Caroline go to the support group?", NOW)
    assert when.time_match(NOW, "Caroline: I went to the group yesterday") == 1.0
    assert when.time_match(NOW, "Caroline: the group was great") == 0.0


def test_cue_boosts_is_none_when_every_weight_is_zero():
    hook = cue_boosts(
        "When did Caroline go?",
        NOW,
        speaker_weight=0.0,
        entity_weight=0.0,
        time_weight=0.0,
        text_of=lambda n: n.note,
        created_of=lambda n: n.created_at,
    )
    assert hook is None


def test_speaker_boost_goes_to_the_named_speakers_turns():
    items = [note("Caroline: I went hiking"), note("Melanie: Caroline, hiking sounds great")]
    got = boosts_of("Where did Caroline go hiking?", items, speaker_weight=0.5)
    assert got == {items[0].id: 0.5, items[1].id: 0.0}


def test_entity_boost_counts_names_that_are_not_speakers():
    items = [
        note("Caroline: I read a book by Dr. Seuss"),
        note("Melanie: Caroline, I love stories"),
        note("Melanie: Seuss books are fun, Caroline"),
    ]
    got = boosts_of("Does Caroline like Seuss books?", items, entity_weight=1.0)
    # "Caroline" is a speaker, so only "Seuss" counts, wherever it is capitalised
    assert got == {items[0].id: 1.0, items[1].id: 0.0, items[2].id: 1.0}


def test_time_boost_in_fuse_reorders_by_the_named_month():
    june = datetime(2023, 6, 10, tzinfo=UTC)
    march = datetime(2023, 3, 10, tzinfo=UTC)
    vector = [hit("Melanie: camping was fun", 0.8, created=march), hit("Melanie: we camped", 0.7, created=june)]
    hook = cue_boosts(
        "What did Melanie do in June?",
        NOW,
        speaker_weight=0.0,
        entity_weight=0.0,
        time_weight=1.0,
        text_of=lambda n: n.note,
        created_of=lambda n: n.created_at,
    )
    plain = fused(vector, [], vector_weight=1.0, text_weight=0.0)
    boosted = fused(vector, [], vector_weight=1.0, text_weight=0.0, boosts=hook)
    assert [c.item.note for c in plain] == ["Melanie: camping was fun", "Melanie: we camped"]
    assert [c.item.note for c in boosted] == ["Melanie: we camped", "Melanie: camping was fun"]


# =========================================================================== through inject

AGENT = "agent-ev"
CTX = {"agent_id": AGENT, "user_id": "u1"}


def test_inject_uses_the_cues_on_the_present_and_the_time_travel_path(svc, clock):
    svc.configure_agent(AGENT, note_injection_strategy="Relevant", max_notes_to_inject=2)
    svc.add_note("Melanie: Caroline, the hike with your dog sounds lovely", **CTX)
    svc.add_note("Caroline: I took my dog on a long hike", **CTX)
    clock.advance(hours=1)
    query = "Where did Caroline hike with her dog?"
    svc.inject_config = replace(svc.inject_config, speaker_weight=2.0)
    present = [n.note for n in svc.inject(CTX, query).notes]
    past = [n.note for n in svc.inject(CTX, query, as_of=clock()).notes]
    assert present[0] == "Caroline: I took my dog on a long hike"
    assert past == present
