"""The judge's lexicon: reading note text into content words, polarity and entities.

Contractions, British spellings, number words, lemmas (words whose swap never changes
meaning) and a light plural stemmer turn a text into a bag of content words; the bag
gives duplicate checks and a lexical cosine. :func:`entities` lists what a consolidation
must keep. Pure functions of text, shared by both judges.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

from memory_pipelines.text import CONTENT_STOPWORDS, ENTITY_STOPWORDS, QUOTES, TOKEN, normalize_text

_CONTRACTIONS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.I), r)
    for p, r in (
        (r"\bcan't\b|\bcannot\b", "can not"),
        (r"\bwon't\b", "will not"),
        (r"\bshan't\b", "shall not"),
        (r"\b(\w+)n't\b", r"\1 not"),
        (r"\bi'm\b", "i am"),
        (r"\b(\w+)'re\b", r"\1 are"),
        (r"\b(i|you|we|they)'ve\b", r"\1 have"),
        (r"\b(i|you|we|they|he|she|it)'ll\b", r"\1 will"),
        (r"\b(i|you|we|they|he|she)'d\b", r"\1 would"),
        (r"\b(it|that|there|what|he|she)'s\b", r"\1 is"),
    )
)

_SPELLING = {
    "colour": "color",
    "favourite": "favorite",
    "favour": "favor",
    "favours": "favors",
    "organisation": "organization",
    "behaviour": "behavior",
    "analyse": "analyze",
    "standardise": "standardize",
    "summarise": "summarize",
    "utilise": "utilize",
    "centre": "center",
    "grey": "gray",
    "licence": "license",
}
_SPELLING_RE = re.compile(r"\b(" + "|".join(_SPELLING) + r")(s?)\b")

_NUMBER_WORDS = {
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
    "eleven": "11",
    "twelve": "12",
    "twenty": "20",
}

#: Negation markers (their count's parity gives a clause's polarity).
_NEGATIONS = frozenset(
    {"not", "never", "no", "nor", "neither", "none", "nothing", "nobody", "without", "nope"}
)
_ARTICLES = frozenset({"a", "an", "the", "our", "my", "their", "his", "her"})

#: Word -> (lemma, flips polarity). Lemmas group the words whose swap never changes meaning.
_LEMMAS: dict[str, tuple[str, bool]] = {}
for _words, _lemma, _flip in (
    (
        "prefer prefers preferred preferring favor favors favored favorite want wants wanted",
        "like",
        False,
    ),
    ("like likes liked love loves loved enjoy enjoys enjoyed adore adores fan fans", "like", False),
    ("dislike dislikes disliked hate hates hated detest detests loathe loathes", "like", True),
    ("use uses used using utilize utilizes utilized", "use", False),
    ("avoid avoids avoided", "use", True),
    ("work works worked working", "work", False),
    ("live lives lived living", "live", False),
    ("need needs needed require requires required", "need", False),
):
    for _w in _words.split():
        _LEMMAS[_w] = (_lemma, _flip)
#: Simple-past forms (and participles) that make "I always/never X" a story, not a habit.
_PAST_FORMS = frozenset(
    (
        "saw was were had did went got thought knew felt said made took came gave found told "
        "became left heard ran met brought began kept held wrote stood lost paid sent built fell "
        "understood spent won grew drew caught fought taught bought sought ate drank sang swam "
        "slept been gone done seen known"
    ).split()
)


def _expand(text: str) -> str:
    """Lowercase analysis form: quotes unified, contractions expanded, British spelling
    mapped to American, ``no longer`` read as ``not``."""
    t = (text or "").translate(QUOTES).lower()
    for pattern, repl in _CONTRACTIONS:
        t = pattern.sub(repl, t)
    t = _SPELLING_RE.sub(lambda m: _SPELLING[m.group(1)] + m.group(2), t)
    t = re.sub(r"\bno longer\b", "not", t)
    t = re.sub(r"\b(?:not )?any ?more\b", "", t)
    return re.sub(r"\s+", " ", t).strip()


def _stem(word: str) -> str:
    """A light plural stemmer (consistent, not linguistic).

    Kept by hand: Snowball's English (Porter 2) stemmer in its place (after the same
    ``'s`` and digit rules) left every figure of ``bench extraction`` unchanged (recall
    0.497, precision 0.733 on the dev conversations) while stemming far more than plurals
    (``marketing`` and ``market`` meet as ``market``), which the judge's content-word
    bags would then treat as one word; and it changed the offline judge's decisions: the
    golden demo's outcomes and a contradiction test ("The deadline is Friday." against
    "... Monday.") failed with it."""
    if not word or word[0].isdigit():
        return word
    if word.endswith("'s"):
        word = word[:-2]
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("sses", "shes", "ches", "xes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _canon(token: str) -> tuple[str, bool]:
    """(canonical content form, flips polarity) of one token."""
    token = _NUMBER_WORDS.get(token, token)
    if token in _LEMMAS:
        return _LEMMAS[token]
    return _stem(token), False


def _is_number(token: str) -> bool:
    return bool(token) and token[0].isdigit()


@dataclass(frozen=True)
class _Bag:
    """What a text says, for duplicate checks: ordered content words, their set, the
    numbers it mentions and its polarity."""

    sequence: tuple[str, ...]
    words: frozenset[str]
    numbers: frozenset[str]
    negated: bool


@lru_cache(maxsize=16384)
def _bag(text: str) -> _Bag:
    seq: list[str] = []
    neg = 0
    for tok in TOKEN.findall(_expand(text)):
        if tok in _NEGATIONS:
            neg += 1
            continue
        word, flip = _canon(tok)
        neg += flip
        if tok in CONTENT_STOPWORDS or word in CONTENT_STOPWORDS:
            continue
        seq.append(word)
    return _Bag(
        sequence=tuple(seq),
        words=frozenset(seq),
        numbers=frozenset(w for w in seq if _is_number(w)),
        negated=neg % 2 == 1,
    )


def _information_diff(candidate: str, match: str) -> str | None:
    """None when ``candidate`` says nothing that ``match`` does not (same polarity, no new
    number, no new content word); else what it adds or changes."""
    c, m = _bag(candidate), _bag(match)
    if c.negated != m.negated:
        return "the negation differs"
    new_numbers = c.numbers - m.numbers
    if new_numbers:
        return "it states a different number (" + ", ".join(sorted(new_numbers)) + ")"
    new_words = c.words - m.words
    if new_words:
        return "it adds or changes: " + ", ".join(sorted(new_words)[:5])
    return None


def _lexical_similarity(a: str, b: str) -> float:
    """Cosine of the content-word count vectors (the fallback when no embedder is given)."""
    ca, cb = Counter(_bag(a).sequence), Counter(_bag(b).sequence)
    if not ca or not cb:
        return 1.0 if normalize_text(a) == normalize_text(b) else 0.0
    dot = sum(ca[w] * cb[w] for w in ca)
    return dot / math.sqrt(sum(v * v for v in ca.values()) * sum(v * v for v in cb.values()))


# --------------------------------------------------------------------------- clauses


def _is_past(word: str) -> bool:
    w = word.lower().strip(",.;:!?")
    return w in _PAST_FORMS or (w.endswith("ed") and len(w) > 4 and not w.endswith("eed"))


# --------------------------------------------------------------------------- entities

_ENTITY_PATTERNS = (
    re.compile(r"\b\d{4}-\d{2}-\d{2}\b"),
    re.compile(r"\b\d{1,2}/\d{1,2}/\d{2,4}\b"),
    re.compile(r"\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]* \d{1,2}\b"),
    re.compile(r"\d+(?:\.\d+)?%?"),
    re.compile(r"\b[a-z]+[A-Z][A-Za-z0-9]*\b"),
    re.compile(r"\b[A-Z][A-Za-z0-9]+\b"),
)


def entities(text: str) -> list[str]:
    """Entities a consolidation must keep: numbers (with decimals or %), dates, camelCase
    and PascalCase terms and capitalised words (longer than 2 characters, minus the
    reference's exclusion list). A superset of the reference's verification entities."""
    found: dict[str, None] = {}
    for pattern in _ENTITY_PATTERNS:
        for m in pattern.findall(text or ""):
            word = m.strip()
            if word and not (
                word[0].isalpha() and (len(word) <= 2 or word.lower() in ENTITY_STOPWORDS)
            ):
                found.setdefault(word, None)
    return list(found)


def _missing_entities(ents: Iterable[str], text: str) -> list[str]:
    low = text.lower()
    return [e for e in ents if e.lower() not in low]
