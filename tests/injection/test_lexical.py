"""In-process BM25: the stemmers of its terms and pseudo-relevance feedback (pure)."""

from __future__ import annotations

import numpy as np
import pytest

from memory_pipelines.config import InjectConfig
from memory_pipelines.errors import ConfigError
from memory_pipelines.injection.lexical import LexicalIndex, bm25_scores, prf_scores
from memory_pipelines.text import terms


def test_the_light_stemmer_is_the_default_and_keeps_numbers():
    assert terms("She went camping in 2023 with 3 classes") == [
        "went",
        "camp",
        "2023",
        "3",
        "class",
    ]
    assert terms("running studies", "light") == ["runn", "studi"]


def test_no_stemming_keeps_the_words():
    assert terms("running studies camped", "none") == ["running", "studies", "camped"]


@pytest.mark.parametrize(
    ("words", "stem"),
    [
        (("moving", "moved", "move", "moves"), "mov"),
        (("running", "runs"), "run"),
        (("studies", "studied", "study"), "study"),
        (("happiness", "happy"), "happy"),
        (("paintings", "painting", "painted", "painter"), "paint"),
    ],
)
def test_the_strong_stemmer_conflates_inflections(words, stem):
    assert {terms(w, "strong")[0] for w in words} == {stem}


def test_the_strong_stemmer_leaves_short_words_numbers_and_double_s():
    assert terms("bus 1999 class glass", "strong") == ["bus", "1999", "class", "glass"]


def test_an_unknown_stemmer_is_a_config_error():
    with pytest.raises(ConfigError, match="lexical_stemmer"):
        InjectConfig(lexical_stemmer="porter2")


def test_the_index_and_the_query_share_the_stemmer():
    texts = ["she painted a lake", "he paints sunsets", "nothing here"]
    plain = LexicalIndex(texts, "none")
    strong = LexicalIndex(texts, "strong")
    (by_plain,) = bm25_scores("painting", [(plain, None)])
    (by_strong,) = bm25_scores("painting", [(strong, None)])
    assert by_plain.tolist() == [0.0, 0.0, 0.0]  # painting / painted / paints stay apart
    assert (by_strong[:2] > 0).all() and by_strong[2] == 0


def test_weighted_terms_scale_their_contribution():
    ix = LexicalIndex(["tea house", "coffee house", "tea"])
    (plain,) = bm25_scores("tea", [(ix, None)])
    (half,) = bm25_scores({"tea": 0.5}, [(ix, None)])
    assert np.allclose(half, plain / 2)


CORPUS = [
    "user adopted a dog named rex",
    "rex the dog loves the beach",
    "the beach trip was in july",
    "user paints landscapes",
    "user bought paint brushes",
]


def test_feedback_off_is_plain_bm25():
    ix = LexicalIndex(CORPUS)
    (plain,) = bm25_scores("dog", [(ix, None)])
    (same,) = prf_scores("dog", [(ix, None)], n_docs=2, n_terms=3, weight=0.0)
    assert same.tolist() == plain.tolist()


def test_feedback_finds_documents_sharing_the_top_documents_terms():
    ix = LexicalIndex(CORPUS)
    (plain,) = bm25_scores("dog", [(ix, None)])
    (fed,) = prf_scores("dog", [(ix, None)], n_docs=2, n_terms=3, weight=0.5)
    assert plain[2] == 0 and fed[2] > 0  # "beach" came from the dog documents
    assert fed[3] == 0 and fed[4] == 0  # nothing about painting
    assert fed.argmax() in (0, 1)  # the original matches stay first


def test_feedback_respects_the_mask():
    ix = LexicalIndex(CORPUS)
    mask = np.array([True, False, True, True, True])
    (fed,) = prf_scores("dog", [(ix, mask)], n_docs=2, n_terms=3, weight=0.5)
    assert fed[1] == 0
    # only document 0 fed back: "beach" is not among its terms
    assert fed[2] == 0


def test_feedback_spans_several_parts():
    a, b = LexicalIndex(CORPUS[:2]), LexicalIndex(CORPUS[2:])
    joined = LexicalIndex(CORPUS)
    split = prf_scores("dog", [(a, None), (b, None)], n_docs=2, n_terms=3, weight=0.5)
    (whole,) = prf_scores("dog", [(joined, None)], n_docs=2, n_terms=3, weight=0.5)
    assert np.allclose(np.concatenate(split), whole)


# ---------------------------------------------------------------- passages of long notes

_FILLER = " ".join(f"filler{i}" for i in range(200))
LONG = f"{_FILLER[:600]} she finally started violin lessons at the school {_FILLER[600:]}"
SHORT_DOCS = ["violin shop downtown", "lessons of history", "garden party in june"]


def test_passages_off_is_plain_bm25():
    ix = LexicalIndex([LONG, *SHORT_DOCS])
    (plain,) = bm25_scores("violin lessons", [(ix, None)])
    (off,) = bm25_scores("violin lessons", [(ix, None)], passage_words=0)
    assert off.tolist() == plain.tolist()


def test_a_long_note_holding_the_answer_in_one_sentence_scores_by_that_passage():
    ix = LexicalIndex([LONG, *SHORT_DOCS])
    (plain,) = bm25_scores("violin lessons", [(ix, None)])
    (by_passage,) = bm25_scores("violin lessons", [(ix, None)], passage_words=20)
    assert plain[0] < plain[1]  # length normalisation buries the long note as one bag
    assert by_passage[0] > by_passage[1] > 0  # its best window holds both terms
    assert by_passage[1:].tolist() == plain[1:].tolist()  # short notes are scored as before
    assert by_passage[3] == 0.0  # and a note without a query term stays at 0


def test_only_notes_longer_than_the_threshold_use_passages():
    ix = LexicalIndex([LONG, *SHORT_DOCS])
    (plain,) = bm25_scores("violin lessons", [(ix, None)])
    (skipped,) = bm25_scores(
        "violin lessons", [(ix, None)], passage_words=20, passage_min_words=500
    )
    assert skipped.tolist() == plain.tolist()  # the long note has about 200 terms


def test_the_best_passage_never_lowers_a_score_and_respects_the_mask():
    spread = "violin " + _FILLER + " lessons"  # the terms far apart: no window holds both
    ix = LexicalIndex([spread, *SHORT_DOCS])
    (plain,) = bm25_scores("violin lessons", [(ix, None)])
    (by_passage,) = bm25_scores("violin lessons", [(ix, None)], passage_words=20)
    assert (by_passage >= plain).all()
    mask = np.array([False, True, True, True])
    (masked,) = bm25_scores("violin lessons", [(ix, mask)], passage_words=20)
    assert masked[0] == 0.0


def _brute_force_passages(texts, query, window):
    """Every long note's best window scored one by one, the way the docstring says."""
    ix = LexicalIndex(texts)
    (plain,) = bm25_scores(query, [(ix, None)])
    n, avg = len(texts), float(ix.lengths.mean())
    idf = {}
    for t in set(terms(query)):
        if t in ix.postings:
            df = len(ix.postings[t][0])
            idf[t] = float(np.log(1.0 + (n - df + 0.5) / (df + 0.5)))
    out = plain.copy()
    stride = max(1, window // 2)
    for pos, text in enumerate(texts):
        seq = terms(text)
        if len(seq) <= window or plain[pos] == 0:
            continue
        starts = list(range(0, len(seq) - window + 1, stride))
        if starts[-1] + window < len(seq):
            starts.append(starts[-1] + stride)
        for s in starts:
            w = seq[s : s + window]
            norm = 1.2 * (1 - 0.75 + 0.75 * len(w) / avg)
            score = sum(idf[t] * w.count(t) * 2.2 / (w.count(t) + norm) for t in idf if t in w)
            out[pos] = max(out[pos], score)
    return out


@pytest.mark.parametrize("window", [3, 4, 7, 20])
def test_passage_scores_match_a_window_by_window_count(window):
    import random

    rng = random.Random(window)
    words = ["violin", "lessons", "paris", "dog", *[f"w{i}" for i in range(30)]]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 60))) for _ in range(40)]
    ix = LexicalIndex(texts)
    (got,) = bm25_scores("violin lessons paris", [(ix, None)], passage_words=window)
    assert np.allclose(got, _brute_force_passages(texts, "violin lessons paris", window))


def test_long_notes_positions_are_built_once_per_threshold():
    ix = LexicalIndex([LONG, *SHORT_DOCS])
    first = ix.positions(20)
    assert ix.positions(20) is first
    assert set(first["violin"][0].tolist()) == {0}  # only the long note is indexed
    assert ix.positions(1000) == {}


def test_passages_apply_through_feedback_and_to_every_part():
    a = LexicalIndex([LONG, "violin shop downtown"])
    b = LexicalIndex(["lessons of history", LONG])
    parts = [(a, None), (b, None)]
    got = prf_scores("violin lessons", parts, n_docs=2, n_terms=3, weight=0.0, passage_words=20)
    assert got[0][0] > got[0][1] and got[1][1] > got[1][0]


def test_bad_passage_settings_are_config_errors():
    with pytest.raises(ConfigError, match="passage_words"):
        InjectConfig(passage_words=-1)
    with pytest.raises(ConfigError, match="passage_min_words"):
        InjectConfig(passage_min_words=-5)
    assert InjectConfig().passage_words == 16  # chosen by nested CV on both formats


def test_passages_reach_inject_through_the_config(tmp_path):
    from memory_pipelines.embeddings import HashEmbedder
    from memory_pipelines.notes import AuthorType, Note, NoteStatus, NoteType, RunContext
    from memory_pipelines.service import MemoryService

    texts = {"long": LONG, "shop": "violin shop downtown", "history": "lessons of history"}

    def first(cfg, name):
        svc = MemoryService.open(tmp_path / name, embedder=HashEmbedder(64), inject_config=cfg)
        svc.configure_agent("a", max_notes_to_inject=3, note_injection_strategy="Relevant")
        svc.save_notes(
            [
                Note(
                    id=i,
                    agent_id="a",
                    user_id="u",
                    note=t,
                    type=NoteType.CONTEXT,
                    status=NoteStatus.ACTIVE,
                    author_type=AuthorType.USER,
                )
                for i, t in texts.items()
            ]
        )
        try:
            return svc.inject(RunContext(agent_id="a", user_id="u"), "violin lessons").notes[0].id
        finally:
            svc.close()

    text_only = {"vector_weight": 0.0, "text_weight": 1.0, "mmr_lambda": 1.0}
    assert first(InjectConfig(passage_words=0, **text_only), "off") != "long"
    assert first(InjectConfig(**text_only), "on") == "long"  # the default scores passages
