"""Coverage of a question's parts: the split of a question into parts and the first k
filled so every part gets a note before any gets a second."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from memory_pipelines.config import InjectConfig
from memory_pipelines.injection.parts import READ_WHILE_WRITING, cover_parts, query_parts


@pytest.mark.parametrize(
    ("question", "parts"),
    [
        ("Did Ann go to Paris or London?", [{"ann", "go", "pari"}, {"london"}]),
        ("What did Ann paint after the camping trip?", [{"ann", "paint"}, {"camp", "trip"}]),
        ("When did Ann meet Bob?", [{"ann"}, {"bob"}]),
        ("Which books and movies did I recommend?", [{"book"}, {"movi", "recommend"}]),
    ],
)
def test_questions_with_several_aspects_split_into_parts(question, parts):
    got = [set(p) for p in query_parts(question)]
    assert got[: len(parts)] == parts


@pytest.mark.parametrize(
    "question",
    [
        "What is my favourite colour?",
        "Where does Ann live?",  # one name: one part
        "Ann and",  # a piece without terms of its own is no part
        "",
        "or and , ; before",
    ],
)
def test_a_question_with_one_aspect_has_no_parts(question):
    assert query_parts(question) == []


def test_names_at_the_start_of_a_sentence_are_not_parts_and_parts_are_capped():
    assert query_parts("Paris is nice. London too?") == []
    many = "Did Ann, Bob, Cid, Dan or Eve call?"
    assert len(query_parts(many)) == 4
    assert len(query_parts(many, max_parts=2)) == 2
    assert READ_WHILE_WRITING == frozenset()  # the rules were written without the data


@dataclass(frozen=True)
class N:
    id: str
    text: str


RANKED = [
    N("p1", "Ann flew to Paris in May"),
    N("p2", "Ann loved Paris and its museums"),
    N("p3", "Paris was rainy, Ann said"),
    N("x", "Ann adopted a cat"),
    N("l1", "Ann spent a week in London"),
    N("l2", "London trip photos from Ann"),
]


def _ids(items):
    return [c.id for c in items]


def test_each_part_gets_its_best_note_before_any_gets_a_second():
    parts = query_parts("Did Ann go to Paris or London?")
    out = cover_parts(RANKED, 3, parts, text_of=lambda c: c.text)
    assert _ids(out)[:2] == ["p1", "l1"]  # the ranking's first, then London's best
    assert sorted(_ids(out)) == sorted(_ids(RANKED))  # nothing lost, only reordered
    assert _ids(out)[2:] == ["p2", "p3", "x", "l2"]  # the rest keep their order


def test_without_parts_or_room_the_ranking_is_unchanged():
    assert _ids(cover_parts(RANKED, 3, [], text_of=lambda c: c.text)) == _ids(RANKED)
    parts = query_parts("Did Ann go to Paris or London?")
    assert _ids(cover_parts(RANKED, 1, parts, text_of=lambda c: c.text)) == _ids(RANKED)
    assert cover_parts([], 5, parts, text_of=lambda c: c.text) == []


def test_a_part_no_candidate_matches_is_skipped_and_the_pool_bounds_the_search():
    parts = [frozenset({"pari"}), frozenset({"tokyo"}), frozenset({"london"})]
    out = cover_parts(RANKED, 3, parts, text_of=lambda c: c.text)
    assert _ids(out)[:2] == ["p1", "l1"]
    small = cover_parts(RANKED, 3, parts, text_of=lambda c: c.text, pool=3)
    assert _ids(small) == _ids(RANKED)  # London's notes are beyond the pool


def _inject(tmp_path, cfg, question):
    from memory_pipelines.embeddings import HashEmbedder
    from memory_pipelines.notes import AuthorType, Note, NoteStatus, NoteType, RunContext
    from memory_pipelines.service import MemoryService

    svc = MemoryService.open(tmp_path / "home", embedder=HashEmbedder(64), inject_config=cfg)
    svc.configure_agent("a", max_notes_to_inject=2, note_injection_strategy="Relevant")
    svc.save_notes(
        [
            Note(
                id=n.id,
                agent_id="a",
                user_id="u",
                note=n.text,
                type=NoteType.CONTEXT,
                status=NoteStatus.ACTIVE,
                author_type=AuthorType.USER,
            )
            for n in RANKED
        ]
    )
    try:
        got = svc.inject(RunContext(agent_id="a", user_id="u"), question)
        return [n.id for n in got.notes]
    finally:
        svc.close()


def test_cover_parts_reaches_inject_through_the_config(tmp_path):
    question = "Was Ann in Paris or London?"
    plain = _inject(tmp_path / "plain", InjectConfig(mmr_lambda=1.0), question)
    covered = _inject(tmp_path / "cover", InjectConfig(mmr_lambda=1.0, cover_parts=True), question)
    assert InjectConfig().cover_parts is False  # off by default
    assert {i[0] for i in plain} == {"l"}  # one part's notes fill the first 2 by default
    assert {i[0] for i in covered} == {"l", "p"}  # each part gets one
    assert covered[0] == plain[0]  # the ranking's first stays first


def test_a_term_most_candidates_share_does_not_mark_a_part_as_covered():
    # every note names Ann: a note about Paris must not count as London's part's note
    parts = [frozenset({"ann", "london"}), frozenset({"pari"})]
    out = cover_parts(RANKED, 3, parts, text_of=lambda c: c.text)
    assert _ids(out)[:2] == ["p1", "l1"]
    only_ann = [frozenset({"ann"}), frozenset({"pari"})]  # one part left: no change
    assert _ids(cover_parts(RANKED, 3, only_ann, text_of=lambda c: c.text)) == _ids(RANKED)
