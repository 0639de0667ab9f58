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
