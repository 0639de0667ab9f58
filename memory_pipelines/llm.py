"""The judge: every LLM decision the Memory Manager needs, behind one protocol.

Two implementations: ``OfflineJudge`` (default; deterministic rules plus embeddings, no
model) and ``LiteLLMJudge`` (any litellm model string; JSON output, temperature 0,
timeout, retries; prompts in ``memory_pipelines.prompts``).

A judge that cannot decide (timeout, exception, malformed or hostile output) raises
``JudgeError``. Callers treat that as "no decision": keep things as they are, and never
archive, revoke or delete on it.

``make_judge(llm, embedder=...)`` picks the implementation. Besides the judges, this module
exports the text helpers both judges share: :func:`normalize_text` (the "normalised" form
used for equality), :func:`entities` (what a consolidation must keep) and
:func:`parse_json_object` (tolerant JSON reading of a model reply).
"""

from __future__ import annotations

import json
import math
import os
import re
import threading
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import lru_cache
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, field_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic.alias_generators import to_camel

from memory_pipelines.embeddings import Embedder
from memory_pipelines.errors import ConfigError, JudgeError, ValidationError
from memory_pipelines.notes import Example, Note, NoteType
from memory_pipelines.prompts import (
    CONSOLIDATE_SYSTEM,
    CONTRADICTION_SYSTEM,
    DEDUPE_SYSTEM,
    EXTRACT_EXAMPLES_SYSTEM,
    EXTRACT_NOTES_SYSTEM,
    render,
)


@dataclass(frozen=True)
class ConversationMessage:
    """One message of a conversation (or a synthetic failure thread) shown to the judge."""

    role: str
    text: str
    rating: int | None = None
    rating_comment: str | None = None
    message_id: str | None = None


@dataclass(frozen=True)
class CandidateNote:
    """A note the judge proposes to extract."""

    content: str
    type: str
    scope_level: str = "user"  # "global" | "company" | "user"
    confidence: float = 0.0
    merge_with_existing_ids: tuple[str, ...] = ()
    protection_tier_hint: str | None = None
    source_message_id: str | None = None


@dataclass(frozen=True)
class CandidateExample:
    """An input/output demonstration the judge proposes to extract."""

    example_input: str
    example_output: str
    success_score: float
    confidence: float
    source_message_id: str | None = None


@dataclass(frozen=True)
class DedupeDecision:
    """``should_add`` False means the candidate is a true duplicate of a match."""

    should_add: bool
    reason: str


@dataclass(frozen=True)
class ConsolidationDecision:
    """One note to replace a cluster; ``should_consolidate`` False only for an invalid
    cluster (or, with a model, when it judges the notes unrelated)."""

    should_consolidate: bool
    content: str = ""
    type: str | None = None
    scope_level: str = "user"
    confidence: float = 0.0
    source_note_ids: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class ContradictionDecision:
    """Whether two notes contradict and, if so, which one the authority order keeps."""

    is_contradiction: bool
    contradiction_type: str | None = None  # competing_relation | negation | temporal_supersession
    keep_note_id: str | None = None
    revoke_note_id: str | None = None
    reason: str = ""
    confidence: float = 0.0
    entity_triples: tuple[tuple[str, str, str], ...] = field(default_factory=tuple)


@runtime_checkable
class Judge(Protocol):
    """The decisions the Memory Manager delegates to a model (or to rules)."""

    name: str

    def extract_notes(
        self,
        messages: Sequence[ConversationMessage],
        existing: Sequence[Note],
        *,
        rating_context: str,
    ) -> list[CandidateNote]:
        """Durable notes stated in a conversation. ``rating_context`` is "positive",
        "negative", "unrated" or "failure"."""
        ...

    def extract_examples(
        self, messages: Sequence[ConversationMessage], existing: Sequence[Example]
    ) -> list[CandidateExample]: ...

    def is_duplicate(self, candidate: str, matches: Sequence[Note]) -> DedupeDecision: ...

    def synthesize_cluster(
        self, notes: Sequence[Note], *, anchored: bool
    ) -> ConsolidationDecision: ...

    def detect_contradiction(self, a: Note, b: Note) -> ContradictionDecision: ...


def make_judge(llm: Any = None, *, embedder: Any = None) -> Judge:
    """The judge for ``llm``: None (or "offline") -> :class:`OfflineJudge` using ``embedder``;
    a litellm model string -> :class:`LiteLLMJudge`; an object satisfying :class:`Judge` ->
    itself. Anything else raises ``ConfigError``."""
    if llm is None:
        return OfflineJudge(embedder)
    if isinstance(llm, str):
        model = llm.strip()
        if not model:
            raise ConfigError("llm must be a litellm model string, a Judge, or None")
        if model.lower() == "offline":
            return OfflineJudge(embedder)
        return LiteLLMJudge(model, **judge_options_from_env())
    if isinstance(llm, Judge):
        return llm
    raise ConfigError(
        f"llm must be a litellm model string, a Judge, or None; got {type(llm).__name__}"
    )


# =========================================================================== constants

NOTE_TYPES: tuple[str, ...] = tuple(t.value for t in NoteType)
SCOPE_LEVELS: tuple[str, ...] = ("global", "company", "user")
CONTRADICTION_TYPES: tuple[str, ...] = ("competing_relation", "negation", "temporal_supersession")
RATING_CONTEXTS: tuple[str, ...] = ("positive", "negative", "unrated", "failure")
#: A note newer than its rival by more than this wins a contradiction outright.
SUPERSEDE_AFTER = timedelta(days=7)
#: Embedding cosine at or above which two notes may be duplicates (when no word differs).
DUPLICATE_SIMILARITY = 0.92
#: Embedding cosine at or above which a clause is "already covered" during synthesis.
COVERED_SIMILARITY = 0.90
MAX_NOTE_CHARS = 200
MAX_CONSOLIDATED_CHARS = 300
#: Examples need at least this success score and confidence (reference §4.4).
MIN_EXAMPLE_SCORE = 70.0


# =========================================================================== text analysis
# Shared by both judges (pre-checks) and by the offline rules. Pure functions of text.

_QUOTES = str.maketrans(
    {"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"', "\u2014": "-", "\u2013": "-"}
)


def normalize_text(text: str) -> str:
    """The comparison form of a text: lowercase, unified quotes, single spaces, no
    surrounding punctuation. Two notes are "normalised-equal" when these are equal."""
    t = re.sub(r"\s+", " ", (text or "").translate(_QUOTES).lower()).strip()
    return t.strip(" .!?;:,\"'")


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

_TOKEN = re.compile(r"\d+(?:[.,:/-]\d+)*%?|[a-z]+(?:'[a-z]+)*")

#: Negation markers (their count's parity gives a clause's polarity).
_NEGATIONS = frozenset(
    {"not", "never", "no", "nor", "neither", "none", "nothing", "nobody", "without", "nope"}
)
#: Adverbs, modals and auxiliaries that never change what a note says.
_FILLERS = frozenset(
    (
        "always usually generally typically normally really strongly definitely "
        "absolutely also still just very much now currently nowadays please actually do "
        "does did will would should shall must can could may might ever anymore recently "
        "lately finally "
    ).split()
)
#: Words with no content of their own (function words, subjects of every note).
_STOPWORDS = (
    frozenset(
        (
            "a an the of to in on at by for with from into onto about as and or but than "
            "over is are was were be been being am has have had it its this that these those "
            "there their theirs them they he she his her i me my we our us you your user "
            "users assistant which who whom what so some any instead rather more "
        ).split()
    )
    | _FILLERS
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


def _expand(text: str) -> str:
    """Lowercase analysis form: quotes unified, contractions expanded, British spelling
    mapped to American, ``no longer`` read as ``not``."""
    t = (text or "").translate(_QUOTES).lower()
    for pattern, repl in _CONTRACTIONS:
        t = pattern.sub(repl, t)
    t = _SPELLING_RE.sub(lambda m: _SPELLING[m.group(1)] + m.group(2), t)
    t = re.sub(r"\bno longer\b", "not", t)
    t = re.sub(r"\b(?:not )?any ?more\b", "", t)
    return re.sub(r"\s+", " ", t).strip()


def _stem(word: str) -> str:
    """A light plural stemmer (consistent, not linguistic)."""
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
    for tok in _TOKEN.findall(_expand(text)):
        if tok in _NEGATIONS:
            neg += 1
            continue
        word, flip = _canon(tok)
        neg += flip
        if tok in _STOPWORDS or word in _STOPWORDS:
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


_CLAUSE_SPLIT = re.compile(r"(?<=[.!?])\s+|\s*;\s*(?:also:\s*)?|\n+")
_TIME_CUE = re.compile(
    r"\b(now|currently|nowadays|these days|as of|since|switched|moved to|migrated|changed to|"
    r"upgraded|no longer|any ?more|from now on|going forward|recently|lately|starting)\b"
)
_CHANGE_TO = re.compile(
    r"\b(?:has |have )?(?:switched|moved|migrated|changed|upgraded|transitioned)"
    r"(?: over)?(?: from [\w.\- ]+?)? to\b"
)
_AS_OF = re.compile(
    r"\bas of (?:today|now|this \w+|last \w+|(?:[a-z]+ )?\d[\w/.\-]*(?:,? \d{4})?|[a-z]+ \d{4}|\w+)\b"
)
_PREP_PHRASE_VERBS = {"work": {"at", "for", "as", "in"}, "live": {"in"}}
_CONTEXT_WORDS = frozenset(
    {"for", "when", "whenever", "during", "while", "if", "unless", "because"}
)
_COMPARATORS = frozenset({"over", "than", "instead", "vs", "versus", "rather"})
_ATTRIBUTE_NOUNS = frozenset(
    (
        "deadline favorite name timezone zone language color budget default limit role "
        "title location city country currency format version size date day time goal "
        "target owner manager lead employer job occupation stack editor ide preference "
        "unit theme schedule frequency cadence quota price plan tier status channel "
    ).split()
)
#: Lemma words that are nouns, never the predicate of a note ("favorite color").
_NOUN_LEMMAS = frozenset({"favorite", "fan", "fans"})
#: Subjects that name no entity of their own: such clauses are never compared by value.
_VAGUE_SUBJECTS = frozenset(
    "it that this there these those he she they you what which who here something".split()
)
_SUBJECT_ALIASES = {"i": "user", "we": "team", "team's": "team", "users": "user"}
#: A "different value" replaces at most this many words ("bar" -> "line", "3.10" -> "3.12").
_MAX_VALUE_CHANGE = 2
#: Values longer than this (in content words) are descriptions, not attribute values.
_MAX_VALUE_WORDS = 6
#: Predicates of the form "X is/are ..." that the parser reads as "be".
_BE = frozenset({"is", "are", "was", "were", "am"})
_HAVE = frozenset({"has", "have"})
#: Exclusive preference verbs: two different values compete ("prefers bar" vs "prefers line").
_EXCLUSIVE = frozenset(
    {"prefer", "prefers", "preferred", "favor", "favors", "want", "wants", "rather"}
)


@dataclass(frozen=True)
class _Clause:
    """One parsed statement: subject, predicate, object value (split into the preferred and
    the dispreferred side), qualifying context, polarity and whether it carries a time cue."""

    text: str
    core: tuple[str, ...]
    negated: bool
    time_cue: bool
    subject: tuple[str, ...] = ()
    pred: str | None = None
    exclusive: bool = False
    functional: bool = False
    pos: frozenset[str] = frozenset()
    neg: frozenset[str] = frozenset()
    context: frozenset[str] = frozenset()
    value_text: str = ""

    def triple(self) -> tuple[str, str, str]:
        subject = " ".join(self.subject) or "(assistant)"
        pred = self.pred or "states"
        if self.negated:
            pred = "not " + pred
        return (subject, pred, self.value_text or " ".join(self.core))


def _content(tokens: Sequence[str]) -> frozenset[str]:
    out = set()
    for tok in tokens:
        word, _ = _canon(tok)
        if tok not in _STOPWORDS and word not in _STOPWORDS:
            out.add(word)
    return frozenset(out)


def _is_verb(token: str) -> bool:
    return token in _BE or token in _HAVE or (token in _LEMMAS and token not in _NOUN_LEMMAS)


def _parse_clause(text: str) -> _Clause | None:
    """Parse one clause of a note into a :class:`_Clause` (None when it has no words)."""
    raw = _expand(text)
    time_cue = bool(_TIME_CUE.search(raw) or _TIME_CUE.search((text or "").lower()))
    t = _CHANGE_TO.sub(" uses", raw)
    t = _AS_OF.sub(" ", t)
    tokens = _TOKEN.findall(t)
    if not tokens:
        return None
    neg = 0
    kept: list[str] = []
    for tok in tokens:
        if tok in _NEGATIONS:
            neg += 1
        elif tok in _FILLERS:
            continue
        else:
            kept.append(tok)
    core: list[str] = []
    for tok in kept:
        word, flip = _canon(tok)
        neg += flip
        if tok not in _STOPWORDS and word not in _STOPWORDS:
            core.append(word)
    negated = neg % 2 == 1
    base = _Clause(text=text, core=tuple(core), negated=negated, time_cue=time_cue)

    # Predicate: the first known verb (a lemma verb or a form of "be").
    i = next((j for j, tok in enumerate(kept) if _is_verb(tok)), -1)
    if i < 0:
        return base
    verb = kept[i]
    subject_tokens = [s for s in kept[:i] if s not in _ARTICLES]
    rest = kept[i + 1 :]
    possessive = any(s.endswith("'s") for s in subject_tokens)
    if subject_tokens and subject_tokens[0] in _VAGUE_SUBJECTS:
        return base  # "it is ...", "that was ...": no entity to compare
    subject = tuple(
        _SUBJECT_ALIASES.get(s) or _stem(_NUMBER_WORDS.get(s, s)) for s in subject_tokens
    )
    if not subject and verb in _BE | _HAVE:
        return base  # "have a great day!"
    if verb in _HAVE and rest and _is_past(rest[0]):
        return base  # "have been", "have put": an auxiliary, not possession
    if verb in _BE:
        pred, exclusive, functional = "be", False, False
        if rest[:2] in (["based", "in"], ["located", "in"]):
            pred, functional, rest = "based_in", True, rest[2:]
        elif rest[:1] == ["from"]:
            pred, functional, rest = "from", True, rest[1:]
        elif "fan" in rest[:3] and "of" in rest[:4]:
            pred, rest = "like", rest[rest.index("of") + 1 :]
        else:
            functional = possessive or bool(set(subject) & _ATTRIBUTE_NOUNS)
    elif verb in _HAVE:
        pred, exclusive, functional = "have", False, False
    else:
        pred = _LEMMAS[verb][0]
        exclusive = verb in _EXCLUSIVE
        functional = False
        preps = _PREP_PHRASE_VERBS.get(pred)
        if preps and rest[:1] and rest[0] in preps:
            pred, functional, rest = (
                f"{pred}_{'at' if rest[0] == 'for' else rest[0]}",
                True,
                rest[1:],
            )
        if pred == "like" and rest[:1] == ["to"]:
            rest = rest[1:]
    rest = [r for r in rest if r not in ("a", "an", "the")]
    # Context qualifier ("for sales data", "when ...") and comparison ("X over Y").
    ctx_at = next((j for j, r in enumerate(rest) if j > 0 and r in _CONTEXT_WORDS), len(rest))
    value, context = rest[:ctx_at], rest[ctx_at:]
    cmp_at = next(
        (
            j
            for j, r in enumerate(value)
            if j > 0 and (r in _COMPARATORS or (r == "to" and pred == "like"))
        ),
        len(value),
    )
    pos_tokens, neg_tokens = value[:cmp_at], value[cmp_at + 1 :]
    return _Clause(
        text=text,
        core=tuple(core),
        negated=negated,
        time_cue=time_cue,
        subject=subject,
        pred=pred,
        exclusive=exclusive,
        functional=functional,
        pos=_content(pos_tokens),
        neg=_content(neg_tokens),
        context=_content(context),
        value_text=" ".join(value),
    )


@lru_cache(maxsize=16384)
def _clauses(text: str) -> tuple[_Clause, ...]:
    """The parsed clauses of a note (sentences and "; " parts); "previously:" parts of a
    consolidated note are history, not claims, and are skipped."""
    out = []
    for part in _CLAUSE_SPLIT.split(text or ""):
        part = part.strip()
        if not part or part.lower().startswith(("previously:", "previously ")):
            continue
        parsed = _parse_clause(part)
        if parsed is not None and parsed.core:
            out.append(parsed)
    return tuple(out)


def _clause_conflict(a: _Clause, b: _Clause) -> str | None:
    """'negation' or 'competing_relation' when the two clauses give the same entity and
    attribute different values; None for complementary, unrelated or equal statements."""
    if a.core and a.core == b.core and a.negated != b.negated:
        return "negation"
    if a.pred is None or b.pred is None or a.pred != b.pred or a.subject != b.subject:
        return None
    if a.context != b.context:
        return None  # "for sales data" vs "for trends": different attributes
    if a.negated != b.negated:
        return "negation" if a.pos and a.pos == b.pos else None
    if a.negated or not a.pos or not b.pos:
        return None  # two denials never compete
    if a.exclusive and b.exclusive and a.neg and b.neg and a.pos == b.neg and a.neg == b.pos:
        return "competing_relation"  # "X over Y" vs "Y over X"
    if a.pos == b.pos or a.pos <= b.pos or b.pos <= a.pos:
        return None  # same value, or one refines the other
    if len(a.pos) > _MAX_VALUE_WORDS or len(b.pos) > _MAX_VALUE_WORDS:
        return None
    if a.functional and b.functional:
        return "competing_relation"
    if (a.exclusive and b.exclusive) or a.pred in ("use", "have", "be", "need"):
        shared = {w for w in a.pos & b.pos if not _is_number(w)}
        small = len(a.pos - b.pos) <= _MAX_VALUE_CHANGE and len(b.pos - a.pos) <= _MAX_VALUE_CHANGE
        if shared and small:
            return "competing_relation"  # "Python 3.10" vs "Python 3.12", "bar" vs "line charts"
    return None


@dataclass(frozen=True)
class _Conflict:
    kind: str
    first: _Clause
    second: _Clause


def _text_conflict(a: str, b: str) -> _Conflict | None:
    """The first conflict between any clause of ``a`` and any clause of ``b``."""
    for ca in _clauses(a):
        for cb in _clauses(b):
            kind = _clause_conflict(ca, cb)
            if kind is not None:
                return _Conflict(kind, ca, cb)
    return None


# --------------------------------------------------------------------------- entities

_ENTITY_EXCLUDE = frozenset({"the", "a", "an", "this", "that", "it", "we", "they", "user", "note"})
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
                word[0].isalpha() and (len(word) <= 2 or word.lower() in _ENTITY_EXCLUDE)
            ):
                found.setdefault(word, None)
    return list(found)


def _missing_entities(ents: Iterable[str], text: str) -> list[str]:
    low = text.lower()
    return [e for e in ents if e.lower() not in low]


# --------------------------------------------------------------------------- extraction rules

_INJECTION = re.compile(
    r"\b(?:ignore|disregard|forget|override|bypass)\b.{0,40}?\b(?:previous|prior|above|earlier|"
    r"all|any|your|the|system|safety|these|those|my)\b.{0,30}?\b(?:instructions?|rules?|prompts?|"
    r"guidelines?|directives?|polic(?:y|ies)|messages?|context|constraints?|programming)\b"
    r"|\byou (?:must|should|will|shall|are going to) now\b|\byou are now\b"
    r"|^\s*\W{0,3}(?:system|assistant|developer|admin|root)\s*[:>\]]"
    r"|\b(?:system|developer) (?:prompt|message|instructions?)\b|\bjailbreak|\bdeveloper mode\b"
    r"|\bdo anything now\b|\bprompt injection\b|\bnew (?:instructions|rules)\b"
    r"|\b(?:act as|pretend (?:to be|you are|that you)|role-?play as)\b"
    r"|\byour (?:rules|instructions|guidelines|programming|restrictions|system prompt|training)\b"
    r"|\b(?:from now on|going forward),? you (?:are|will be|must|have|can)\b"
    r"|\b(?:reveal|print|show|leak|repeat)\b.{0,30}\b(?:prompt|instructions|secrets?|api keys?)\b"
    r"|<\s*/?\s*(?:system|instructions?|inst)\s*>|\[\s*/?\s*(?:system|inst)\s*\]"
    r"|\b(?:add|save|store|write|create|insert|inject|remember)\b.{0,20}\b(?:notes?|memor(?:y|ies))"
    r"\b.{0,10}\b(?:that|saying|stating)\b|\b(?:to|in|into) your memory\b"
    r"|\b(?:obey|comply with) (?:me|my commands|everything|all)\b"
    r"|\b(?:forget|ignore|disregard) (?:everything|all of (?:that|this|it)|what (?:i|you) (?:said|were told))\b"
    r"|\b(?:respond|reply|answer) only with\b|\bonly (?:respond|reply|answer) with\b"
    r"|\b(?:admin(?:istrator)?|root|superuser|elevated) (?:access|privileges|rights|permissions)\b",
    re.I | re.S,
)
#: Fake prompt markup and role prefixes at the start of any line ("</memory_policy>",
#: "<|im_start|>", "SYSTEM:", "assistant:"): text dressed up as part of the prompt.
_PROMPT_MARKUP = re.compile(
    r"<\s*/?\s*(?:memory[_ -]?policy|system|assistant|developer|instructions?|inst|im_start|"
    r"im_end)\b[^<>]{0,40}>"
    r"|<\|\s*(?:im_start|im_end|system|assistant|user|endoftext)\s*\|>"
    r"|^[^\w\n]{0,3}(?:system|assistant|developer|admin|root|tool)\s*[:>\]]",
    re.I | re.M,
)


def reads_as_instruction(text: str) -> bool:
    """True when ``text`` reads as an instruction aimed at the assistant.

    The one test of "steering" text, shared by extraction (such a message yields no
    note), the in-flight write path (``rejected-type``), hardening (revoked) and
    importance scoring (never auto-protected): "ignore previous instructions",
    "forget everything", "respond only with", persona or privilege claims, and fake
    prompt markup or role prefixes (``</memory_policy>``, ``SYSTEM:``) at a line start.
    """
    if not isinstance(text, str) or not text:
        return False
    return _INJECTION.search(text) is not None or _PROMPT_MARKUP.search(text) is not None


_PII = re.compile(
    r"[\w.+-]+@[\w-]+\.[\w.-]+"
    r"|(?<![\w.])(?:\+?\d{1,3}[ .-]?)?(?:\(\d{2,4}\)[ .-]?)?\d{3,4}[ .-]\d{3,4}(?:[ .-]\d{2,4})?(?![\w.])"
    r"|\b(?:\d[ -]?){13,19}\b|\b\d{3}-\d{2}-\d{4}\b|\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){3,7}\b"
    r"|\b\d{1,5} (?:\w+ ){1,3}(?:street|st|avenue|ave|road|rd|boulevard|blvd|lane|ln|drive|dr|"
    r"court|ct|way|place|pl|terrace|square)\b"
    r"|\bmy (?:full |real |legal |first |last )?name\b|\bcall me\b|\bi am called\b"
    r"|\bmy (?:password|passcode|pin|api key|secret|token|ssn|social security|credit card|"
    r"debit card|card number|bank account|account number|iban|routing number|passport|"
    r"driver'?s licen[cs]e|date of birth|birthday|dob|home address|address|phone|cell|mobile|"
    r"email|e-mail|username|login)\b",
    re.I,
)
_SENSITIVE = re.compile(
    r"\b(?:christian|muslim|jewish|hindu|buddhist|atheist|catholic|religio\w*|gay|lesbian|"
    r"bisexual|transgender|queer|pregnan\w*|diabet\w*|cancer|hiv|depress\w*|anxiety|adhd|"
    r"autis\w*|disabilit\w*|illness|disease|diagnosed|therapist|medication|democrat|"
    r"republican|political party|criminal record|arrested|convicted|my (?:salary|income|debts?))\b",
    re.I,
)
_SMALL_TALK = re.compile(
    r"^(?:hi|hello|hey|yo|thanks|thank you|thx|ty|cheers|bye|goodbye|see you|ok|okay|sure|"
    r"yes|yeah|yep|no|nope|cool|nice|great|awesome|perfect|got it|sounds good|lol|haha|"
    r"how are you|how is it going|what is up|good (?:morning|afternoon|evening|night)|"
    r"nice to meet you|have a (?:nice|good|great) (?:day|one|weekend)|well done|great job|"
    r"you are welcome|no problem)\b[\s\W]*$",
    re.I,
)
_WEATHER = re.compile(
    r"\b(?:weather|raining|rainy|sunny|snowing|forecast|temperature outside)\b", re.I
)
_EPHEMERAL = re.compile(
    r"\b(?:this time|for now|right now|today|tonight|tomorrow|yesterday|at the moment|"
    r"for the moment|just this|for this|in this (?:case|instance)|this particular|"
    r"this (?:morning|afternoon|evening|week|month|session|conversation|chat|report|chart|graph|"
    r"plot|table|document|doc|file|email|message|query|slide|deck|presentation|one|task|project|"
    r"draft|version|answer|response|analysis|spreadsheet|dataset|code|script)|"
    r"the (?:above|previous|last|next) (?:chart|report|answer|response|one|table|message)|"
    r"next (?:week|month|time)|later on|in a minute)\b",
    re.I,
)
_SPECULATION = re.compile(
    r"\b(?:maybe|perhaps|possibly|i might|i may|might be|could be|not sure|unsure|i wonder|"
    r"wondering|someday|some day|one day|thinking (?:about|of)|considering|if i|i could)\b",
    re.I,
)
_HEDGES = re.compile(
    r"^(?:i think|i guess|i suppose|i believe|i feel like|it seems|i would say)\b[,\s]*", re.I
)
_HEDGE_WORDS = re.compile(r"\b(?:kind of|sort of|probably|somewhat|a bit|i think|i guess)\b", re.I)
_SOFT_WORDS = re.compile(r"\b(?:usually|mostly|often|sometimes|tend to|generally)\b", re.I)
_LEAD_FILLERS = re.compile(
    r"^(?:also|and|but|so|well|oh|btw|by the way|fyi|just so you know|for the record|"
    r"for context|for your information|please note|note that|remember that|keep in mind that|"
    r"(?:just )?a heads up|heads up|in general|generally speaking|as a rule|ok|okay|yes|yeah|"
    r"sure|great|thanks|thank you|hi|hello|hey|honestly|personally|to be honest|fwiw|"
    r"for what it is worth)\b[,:;!.\s-]*",
    re.I,
)
_STANDING = re.compile(
    r"^(?:from now on|going forward|in (?:the )?future|moving forward|for (?:all )?future "
    r"\w+|every time|each time|whenever you \w+)[,:]?\s*",
    re.I,
)
_CORRECTION = re.compile(
    r"^(?:(?:actually|correction|sorry|oops|wait|scratch that|let me correct (?:that|myself)|"
    r"no,|nope,)[,:;!.\s-]*)+(?:(?:i|what i) meant(?: to say)?[,:]?\s*|i mean[,:]?\s*)?"
    r"|^(?:(?:i|what i) meant(?: to say)?|i mean)[,:]?\s+",
    re.I,
)
_QUESTION_TAIL = re.compile(r",?\s*(?:can|could|would|will) you\b.*$", re.I)
_PART_SPLIT = re.compile(
    r"\s*;\s*|,?\s+(?:and|but|plus)\s+(?=(?:i|we|my|our|always|never|please|also|for|this|"
    r"today|do not)\b)|,\s+(?=(?:i|we|my|our|always|never|please|from now on|going forward)\b)",
    re.I,
)
_CONDITIONAL_LEAD = re.compile(r"^(?:if|when|whenever|unless|although|because|since|while)\b", re.I)
_TRAILING_POLITE = re.compile(r"[,\s]*(?:please|thanks|thank you|thx|ok|okay)?[\s.!,;:]*$", re.I)
_DEICTIC = re.compile(
    r"^(?:it|this|that|these|those|them|the (?:chart|report|answer|response|one|result|idea))\b",
    re.I,
)
_UNIVERSAL = re.compile(
    r"\b(?:passwords?|credentials?|secrets?|api keys?|plain ?text|gdpr|hipaa|pci|sox|wcag|"
    r"accessibility|legal(?:ly)?|laws?|regulations?|regulatory|compliance|compliant|"
    r"personal data|pii)\b",
    re.I,
)
_BIO_HAVE = re.compile(
    r"^(?:kids?|children|child|sons?|daughters?|dogs?|cats?|pets?|brothers?|sisters?|"
    r"siblings?|grandchildren|husband|wife|partner|years? of experience|phd\b|ph\.d\.|"
    r"(?:\w+ )?degree|master'?s|bachelor'?s|doctorate|team of|direct reports|employees)",
    re.I,
)
_TOO_ADJ = re.compile(
    r"^(?:(?:way|much|far|a bit|a little|just) )?too (long|short|verbose|wordy|brief|technical|"
    r"vague|detailed|formal|informal|complicated|complex|simple|slow|generic|repetitive|"
    r"casual|dense|shallow)\b",
    re.I,
)
#: Verbs of work conventions stated with a bare "we" ("we deploy on Fridays").
_TEAM_VERBS = (
    "use|follow|prefer|require|deploy|store|report|ship|build|host|avoid|name|format|track|"
    "publish|release|review|code|test|standardize|standardise|log|measure|bill|invoice|"
    "operate|sell|serve|rely|develop|maintain|submit|document|prioritize|prioritise|target|"
    "schedule|deliver|run|write"
)
#: Objects that make a "we ..." sentence social talk, not a convention.
_SOCIAL_OBJECT = re.compile(r"\b(?:each other|one another|ourselves|together|it|that|this)\b", re.I)
#: Verbs an assistant-directed standing instruction may start with ("always cite ...").
_IMPERATIVE_VERBS = frozenset(
    (
        "use include cite add answer reply respond write format show give send provide keep make "
        "put start end list summarize summarise explain ask check mention round convert sort "
        "label confirm avoid return present highlight translate spell call refer address display "
        "report output link attach quote name capitalize bold number split break limit be do "
        "assume recommend suggest share remind tell greet sign open close compare offer copy "
        "test run deploy push commit merge review document comment indent wrap print describe "
        "state clarify verify validate follow stick stay treat consider default structure "
        "organize organise group order separate prioritize prioritise begin finish conclude "
        "abbreviate shorten expand simplify apologize apologise guess speculate invent fabricate "
        "lie swear joke talk discuss email text ping contact schedule book cancel delete remove "
        "drop change modify edit rewrite overwrite skip omit leave exclude hide truncate align "
        "color plot graph chart visualize visualise export respect double-check proofread "
        "store log encrypt expose reveal post publish go speak reference source sum total "
        "calculate compute estimate measure express convert date time-stamp timestamp"
    ).split()
)
#: Simple-past forms (and participles) that make "I always/never X" a story, not a habit.
_PAST_FORMS = frozenset(
    (
        "saw was were had did went got thought knew felt said made took came gave found told "
        "became left heard ran met brought began kept held wrote stood lost paid sent built fell "
        "understood spent won grew drew caught fought taught bought sought ate drank sang swam "
        "slept been gone done seen known"
    ).split()
)
#: Objects of like/love/hate that point at something in the conversation, not a preference.
_REACTION_OBJECT = re.compile(
    r"^(?:it(?! when)|this|that|these|those|them|how|what|when|where|why|the way|seeing|hearing)\b"
    r"|\byour?s?\b",
    re.I,
)


def _expand_keep_case(text: str) -> str:
    t = text.translate(_QUOTES)
    for pattern, repl in _CONTRACTIONS:
        t = pattern.sub(repl, t)
    return re.sub(r"\s+", " ", t).strip()


def _third_person(verb: str) -> str:
    low = verb.lower()
    irregular = {"have": "has", "do": "does", "go": "goes", "am": "is", "are": "is", "be": "is"}
    if low in irregular:
        return irregular[low]
    if re.search(r"(?:s|sh|ch|x|z|o)$", low):
        return verb + "es"
    if re.search(r"[^aeiou]y$", low):
        return verb[:-1] + "ies"
    return verb + "s"


_CHANGE_VERB = re.compile(
    r"^(?:has |have )?(?:recently |just |now )?(?:switched|moved|migrated|upgraded|changed)"
    r"(?: over)? to\b",
    re.I,
)


def _is_past(word: str) -> bool:
    w = word.lower().strip(",.;:!?")
    return w in _PAST_FORMS or (w.endswith("ed") and len(w) > 4 and not w.endswith("eed"))


def _conjugate(phrase: str) -> str:
    """'use tabs' -> 'uses tabs'; 'do not use tabs' -> 'does not use tabs'."""
    words = phrase.strip().rstrip(".!?;:,").split(" ", 1)
    if not words or not words[0]:
        return phrase
    head = words[0]
    if head.lower() in ("not", "never", "always", "also", "really", "usually", "generally"):
        return head + (" " + _conjugate(words[1]) if len(words) > 1 else "")
    return _third_person(head) + (" " + words[1] if len(words) > 1 else "")


_PRONOUN_MAPS: dict[str, dict[str, str]] = {
    "user": {
        "i am": "they are",
        "i": "they",
        "me": "them",
        "my": "their",
        "mine": "theirs",
        "myself": "themselves",
        "you are": "the assistant is",
        "you": "the assistant",
        "your": "the assistant's",
        "yours": "the assistant's",
        "yourself": "itself",
    },
    "assistant": {
        "i am": "the user is",
        "i": "the user",
        "me": "the user",
        "my": "the user's",
        "mine": "the user's",
        "myself": "the user",
        "you are": "it is",
        "you": "it",
        "your": "its",
        "yours": "its",
        "yourself": "itself",
    },
    "team": {
        "we are": "the team is",
        "we": "the team",
        "us": "the team",
        "our": "the team's",
        "ours": "the team's",
        "i am": "the user is",
        "i": "the user",
        "me": "the user",
        "my": "the user's",
        "you": "the assistant",
        "your": "the assistant's",
    },
}
_PRONOUN_RES = {
    mode: re.compile(
        r"\b(" + "|".join(sorted((re.escape(k) for k in table), key=len, reverse=True)) + r")\b",
        re.I,
    )
    for mode, table in _PRONOUN_MAPS.items()
}


def _third_person_text(text: str, mode: str) -> str:
    table = _PRONOUN_MAPS[mode]
    return _PRONOUN_RES[mode].sub(lambda m: table[m.group(1).lower()], text)


def _finish(prefix: str, rest: str, mode: str) -> str:
    """``prefix + rest`` as one third-person sentence ending in a period."""
    rest = _TRAILING_POLITE.sub("", _third_person_text(rest.strip(), mode)).strip(" ,;:-")
    text = f"{prefix} {rest}".strip()
    return text[:1].upper() + text[1:] + "."


def _clip(text: str, limit: int = MAX_NOTE_CHARS) -> str:
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rsplit(" ", 1)[0].rstrip(" ,;:")
    return cut + "."


@dataclass
class _Draft:
    """A candidate note while the offline rules build it."""

    content: str
    type: str
    scope_level: str
    confidence: float
    source_message_id: str | None
    corrected: bool = False


def _match_statement(part: str, *, standing: bool, rated: bool, in_comment: bool) -> _Draft | None:
    """Turn one first-person statement into a draft note, or None when it is not durable."""
    p = part.strip()
    low = p.lower()

    def draft(content: str, type_: str, confidence: float, scope: str = "user") -> _Draft:
        return _Draft(content, type_, scope, confidence, None)

    # --- assistant-directed standing instructions ("always/never ...", "don't ever ...")
    adverb: str | None = None
    rule_body = ""
    if m := re.match(r"^(?:please )?do not ever (.+)$", p, re.I):
        adverb, rule_body = "never", m.group(1)
    elif m := re.match(r"^(?:please )?do not (.+?) (?:ever )?again$", p, re.I):
        adverb, rule_body = "never", m.group(1)
    elif m := re.match(r"^(?:please )?(always|never) (.+)$", p, re.I):
        adverb, rule_body = m.group(1).lower(), m.group(2)
    elif standing and not re.match(r"^(?:i|we|my|our)\b", low):
        if m := re.match(r"^(?:please )?(?:(do not) )?(.+)$", p, re.I):
            adverb, rule_body = ("never" if m.group(1) else ""), m.group(2)
    first = rule_body.split(" ", 1)[0].lower().strip(",.;:!")
    if adverb is not None and first in _IMPERATIVE_VERBS:
        rule = f"{adverb} {rule_body}".strip()
        if _UNIVERSAL.search(rule):
            text = _TRAILING_POLITE.sub("", _third_person_text(rule, "assistant")).strip(" ,;:")
            return draft(text[:1].upper() + text[1:] + ".", "Constraint", 90, "global")
        kind = "Constraint" if rated else "Preference"
        return draft(_finish("User wants the assistant to", rule, "assistant"), kind, 88)

    # --- wants/needs the assistant to do something: only standing rules are durable
    m = re.match(r"^i (?:really )?(?:want|need|expect|would like) you to (.+)$", p, re.I)
    if m:
        body = m.group(1)
        is_rule = (
            standing
            or re.match(r"^(?:always|never)\b", body, re.I)
            or re.search(r"\b(?:every time|each time|in general|whenever|by default)\b", body, re.I)
        )
        if not is_rule:
            return None
        kind = "Constraint" if rated else "Preference"
        return draft(_finish("User wants the assistant to", body, "assistant"), kind, 88)

    # --- team / company conventions
    m = re.match(r"^(?:at|in) (?:my|our) (?:company|team|org\w*|department),?\s+(.+)$", p, re.I)
    if m:
        p, low = m.group(1), m.group(1).lower()
    m = re.match(
        r"^(?:our|my) (team|company|org|organization|organisation|department|dept|group|squad|"
        r"employer|firm|business|startup)('s)? (.+)$",
        p,
        re.I,
    )
    if m:
        who = (
            "Team"
            if m.group(1).lower() in ("team", "department", "dept", "group", "squad")
            else "Company"
        )
        body = m.group(3)
        head = body.split(" ", 1)[0]
        story = _is_past(head) and not _CHANGE_VERB.match(body)
        if story or re.match(r"^(?:has|have) been\b", body, re.I):
            return None  # a story about the team, not a convention
        is_rule = bool(
            re.search(r"\b(?:always|never|must|do not|does not|requires?)\b", body, re.I)
        )
        kind = "Constraint" if (is_rule and rated) else "Context"
        return draft(_finish(who + (m.group(2) or ""), body, "team"), kind, 90, "company")
    m = re.match(
        rf"^we (always |never |usually |generally |typically |all )?(do not )?({_TEAM_VERBS}) (.+)$",
        p,
        re.I,
    )
    if m and not _SOCIAL_OBJECT.search(m.group(4)):
        adv, neg, verb, body = (m.group(1) or ""), m.group(2), m.group(3), m.group(4)
        verb_text = f"does not {verb}" if neg else _third_person(verb)
        is_rule = bool(adv.strip().lower() in ("always", "never") or neg)
        kind = "Constraint" if (is_rule and rated) else "Context"
        return draft(_finish(f"Team {adv}{verb_text}", body, "team"), kind, 90, "company")

    # --- a change of tool or place ("we switched to X", "I moved to Y")
    m = re.match(r"^(i|we) (.+)$", p, re.I)
    if m and (change := _CHANGE_VERB.match(m.group(2))):
        verb = re.sub(r"^(?:has |have )", "", change.group(0), flags=re.I).lower()
        rest = m.group(2)[change.end() :]
        if m.group(1).lower() == "we":
            return draft(_finish(f"Team {verb}", rest, "team"), "Context", 90, "company")
        return draft(_finish(f"User {verb}", rest, "user"), "Context", 90)

    # --- first-person preferences
    m = re.match(
        r"^i (?:really |strongly |generally |usually |always |definitely |much |also |still )*"
        r"(?:prefer|favor|favour)s? (.+)$",
        p,
        re.I,
    )
    if m:
        return draft(_finish("User prefers", m.group(1), "user"), "Preference", 90)
    m = re.match(r"^i would (?:much )?(?:rather|prefer) (.+)$", p, re.I)
    if m:
        return draft(_finish("User would rather", m.group(1), "user"), "Preference", 85)
    m = re.match(
        r"^i (?:really |absolutely |truly |just |also )*(?:hate|dislike|detest|loathe|"
        r"can not stand|do not like|do not enjoy|am not a fan of|am not fond of) (.+)$",
        p,
        re.I,
    )
    if m:
        if _REACTION_OBJECT.search(m.group(1)):
            return None
        return draft(_finish("User dislikes", m.group(1), "user"), "Preference", 88)
    m = re.match(r"^i (?:really )?do not want (.+)$", p, re.I)
    if m:
        if _DEICTIC.match(m.group(1)):
            return None
        return draft(_finish("User does not want", m.group(1), "user"), "Preference", 85)
    m = re.match(
        r"^i (?:really |absolutely |truly |just |also )*(like|love|enjoy|adore)s? (.+)$", p, re.I
    ) or re.match(r"^i am (?:a |an )?(?:big |huge |great )?(fan) of (.+)$", p, re.I)
    if m:
        obj = m.group(2)
        if _REACTION_OBJECT.search(obj) or (not in_comment and re.match(r"^the\b", obj, re.I)):
            return None
        verb = {"fan": "likes"}.get(m.group(1).lower(), m.group(1).lower() + "s")
        return draft(_finish(f"User {verb}", m.group(2), "user"), "Preference", 85)
    m = re.match(r"^i (always|never) (.+)$", p, re.I)
    if m and not _is_past(m.group(2).split(" ", 1)[0]):
        return draft(
            _finish(f"User {m.group(1).lower()}", _conjugate(m.group(2)), "user"), "Preference", 85
        )

    # --- biographical facts (Context, >= 90)
    m = re.match(r"^i am (?:based|located) in (.+)$", p, re.I)
    if m:
        return draft(_finish("User is based in", m.group(1), "user"), "Context", 92)
    m = re.match(r"^i am from (.+)$", p, re.I)
    if m:
        return draft(_finish("User is from", m.group(1), "user"), "Context", 92)
    m = re.match(r"^i am (a|an) (.+)$", p, re.I)
    if m and not re.match(
        r"^(?:bit|little|tad|lot|quick|sec|moment|(?:huge |big |great )?fan)\b", m.group(2), re.I
    ):
        return draft(_finish(f"User is {m.group(1).lower()}", m.group(2), "user"), "Context", 92)
    m = re.match(r"^i (?:currently )?work (at|for|as|in) (.+)$", p, re.I)
    if m:
        return draft(_finish(f"User works {m.group(1).lower()}", m.group(2), "user"), "Context", 92)
    m = re.match(r"^i (?:currently )?live in (.+)$", p, re.I)
    if m:
        return draft(_finish("User lives in", m.group(1), "user"), "Context", 92)
    m = re.match(
        r"^i (?:have|have got) (a|an|one|two|three|four|five|six|seven|eight|nine|ten|\d+) (.+)$",
        p,
        re.I,
    )
    if m and _BIO_HAVE.match(m.group(2)):
        return draft(_finish(f"User has {m.group(1).lower()}", m.group(2), "user"), "Context", 90)
    m = re.match(r"^i speak (.+)$", p, re.I)
    if m:
        return draft(_finish("User speaks", m.group(1), "user"), "Context", 90)
    m = re.match(r"^i (?:mainly |mostly |primarily )?use (.+)$", p, re.I)
    if m and not _DEICTIC.match(m.group(1)):
        return draft(_finish("User uses", m.group(1), "user"), "Context", 90)
    m = re.match(
        r"^my ((?:favorite|favourite|preferred|native|primary|main|default) [\w ]{2,40}?|job|"
        r"role|job title|title|occupation|profession|background|specialty|specialization|"
        r"expertise|field|timezone|time zone|pronouns|department) (?:is|are) (.+)$",
        p,
        re.I,
    )
    if m:
        attr = m.group(1).lower()
        kind = (
            "Preference" if attr.startswith(("favorite", "favourite", "preferred")) else "Context"
        )
        return draft(
            _finish(f"User's {attr} is", m.group(2), "user"), kind, 92 if kind == "Context" else 90
        )

    # --- rating comments: "too long", "love the bullet points"
    if in_comment:
        m = _TOO_ADJ.match(p)
        if m:
            adj = m.group(1).lower()
            return draft(f"User dislikes responses that are too {adj}.", "Preference", 82)
        m = re.match(r"^(like|love|prefer|enjoy|hate|dislike)s? (.+)$", p, re.I)
        if m:
            return _match_statement(f"I {p}", standing=standing, rated=rated, in_comment=False)
    return None


def _parts(sentence: str) -> list[str]:
    """Split a sentence into statements: on ';' and on 'and'/'but'/',' before a new subject;
    a part that starts with an adverb inherits the previous part's subject."""
    raw = [s.strip() for s in _PART_SPLIT.split(sentence) if s and s.strip()]
    merged: list[str] = []
    for part in raw:
        if merged and _CONDITIONAL_LEAD.match(merged[-1]) and "," not in merged[-1]:
            merged[-1] = f"{merged[-1]}, {part}"
        else:
            merged.append(part)
    out: list[str] = []
    subject = ""
    for part in merged:
        m = re.match(r"^(i|we|our team|my team)\b", part, re.I)
        if m:
            subject = m.group(1)
        elif subject and re.match(
            r"^(?:also |really )?(?:always|never|usually|prefer|like|love|hate|use)\b", part, re.I
        ):
            part = f"{subject} {part}"
        out.append(part)
    return out


def _strip_leads(text: str) -> str:
    prev = None
    while prev != text:
        prev = text
        text = _LEAD_FILLERS.sub("", text, count=1).strip()
    return text


def _replace_value(previous: str, fragment: str) -> str | None:
    """'User prefers bar charts over pie charts.' + 'line charts' ->
    'User prefers line charts over pie charts.' (the corrected value)."""
    fragment = _TRAILING_POLITE.sub("", _third_person_text(fragment, "user")).strip(" ,;:")
    if not fragment or len(fragment.split()) > 8:
        return None
    m = re.match(
        r"^(User (?:prefers|would rather|likes|loves|enjoys|dislikes|does not want|uses|is (?:a|an|based in|from)|"
        r"works (?:at|for|as|in)|lives in|speaks|has)|Team \w+|Company \w+|User's [\w ]+? is|"
        r"User wants the assistant to) (.+?)\.?$",
        previous,
    )
    if not m:
        return None
    head, obj = m.group(1), m.group(2)
    split = re.search(r"\s(?:over|than|instead of|rather than|for|when|during|while)\s", obj)
    tail = obj[split.start() :] if split else ""
    return f"{head} {fragment}{tail}."


# --------------------------------------------------------------------------- failures

_FAILURE_LESSONS: tuple[tuple[re.Pattern[str], str, str], ...] = tuple(
    (re.compile(p, re.I), label, lesson)
    for p, label, lesson in (
        (
            r"context length|context window|maximum context|too many tokens|token limit|"
            r"context_length_exceeded|prompt is too long",
            "a context-length error",
            "inputs can exceed the model's context window, so trim or chunk large inputs",
        ),
        (
            r"rate.?limit|too many requests|\b429\b|throttl",
            "a rate-limit error",
            "back off and retry later, and batch or space out requests",
        ),
        (
            r"quota|insufficient_quota|billing|credits? (?:exhausted|exceeded)|usage limit",
            "a quota error",
            "the provider quota can run out, so check remaining quota before large jobs",
        ),
        (
            r"time[d -]?out|timed out|deadline exceeded|took too long",
            "a timeout",
            "long-running steps can exceed their time limit, so keep calls small or allow more time",
        ),
        (
            r"permission denied|forbidden|\b403\b|unauthori[sz]ed|\b401\b|access denied|"
            r"not authori[sz]ed|insufficient (?:privileges|permissions|scope)|missing (?:scope|permission)",
            "a permission error",
            "check credentials and the required permissions before calling the resource",
        ),
        (
            r"not found|\b404\b|no such (?:file|table|column|directory|key|record)|does not exist|"
            r"unknown (?:table|column|entity|field|model)",
            "a not-found error",
            "verify that referenced records and resources exist before using them",
        ),
        (
            r"invalid (?:input|format|json|argument|parameter|date|value|request|syntax)|malformed|"
            r"parse error|could not parse|failed to parse|json ?decode|schema validation|"
            r"validation error|unexpected token|type ?error|value ?error",
            "an invalid-input error",
            "validate the input format before calling tools",
        ),
        (
            r"connection (?:refused|reset|error|aborted)|network (?:error|unreachable)|"
            r"service unavailable|\b50[234]\b|bad gateway|econnreset|dns",
            "a connection error",
            "the upstream service can be unavailable, so retry with backoff",
        ),
        (
            r"out of memory|\boom\b|memoryerror|cannot allocate",
            "an out-of-memory error",
            "process large inputs in smaller batches",
        ),
    )
)
_FAILURE_ERROR = re.compile(
    r"Error:\s*(.*?)(?:\s*Identify a generalizable lesson.*)?$", re.I | re.S
)


# =========================================================================== offline judge


def _newer(a: Note, b: Note) -> int:
    """1 when ``a`` was created after ``b``, -1 when before, 0 when equal or unknown."""
    if a.created_at is None or b.created_at is None or a.created_at == b.created_at:
        return 0
    return 1 if a.created_at > b.created_at else -1


def _authority(a: Note, b: Note) -> tuple[Note, Note, str] | None:
    """(winner, loser, rule) by the authority order: newer by more than 7 days, then the
    higher importance score (None = 0), then the higher access count; None when all tie."""
    if a.created_at is not None and b.created_at is not None:
        gap = a.created_at - b.created_at
        if gap > SUPERSEDE_AFTER:
            return a, b, "newer by more than 7 days"
        if -gap > SUPERSEDE_AFTER:
            return b, a, "newer by more than 7 days"
    ia, ib = a.importance_score or 0.0, b.importance_score or 0.0
    if ia != ib:
        return (a, b, "higher importance") if ia > ib else (b, a, "higher importance")
    if a.access_count != b.access_count:
        return (
            (a, b, "higher access count")
            if a.access_count > b.access_count
            else (b, a, "higher access count")
        )
    return None


def _pair_precheck(a: Note, b: Note) -> ContradictionDecision | None:
    """A decision without looking at the text: a note never contradicts itself, and notes of
    different agents or scopes (``Note.scope_key``) are never compared."""
    if a.id == b.id:
        return ContradictionDecision(False, reason="same note")
    if a.agent_id != b.agent_id:
        return ContradictionDecision(False, reason="different agents: both kept")
    if a.scope_key != b.scope_key:
        return ContradictionDecision(False, reason="different scopes: both kept")
    return None


def _cluster_problem(notes: Sequence[Note]) -> str | None:
    """Why a cluster cannot be consolidated (None when it is valid)."""
    if len(notes) < 2:
        return "a cluster needs at least 2 notes"
    if len({n.agent_id for n in notes}) > 1:
        return "the notes belong to different agents"
    if len({n.id for n in notes}) < len(notes):
        return "the cluster repeats a note"
    return None


def _scope_level(notes: Sequence[Note]) -> str:
    """'user' when every note has the same user, 'company' when every note has the same
    company, else 'global' (the least restrictive level true for all)."""
    users = {n.user_id for n in notes}
    if len(users) == 1 and None not in users:
        return "user"
    companies = {n.company_id for n in notes}
    if len(companies) == 1 and None not in companies:
        return "company"
    return "global"


def _recency_key(n: Note) -> tuple[float, float]:
    ts = n.created_at.timestamp() if n.created_at is not None else float("-inf")
    return (ts, n.importance_score or 0.0)


class OfflineJudge:
    """Deterministic judge: rules plus (optionally) embeddings, no model, no network.

    With ``embedder`` None it falls back to a lexical cosine over content words. Every
    decision is a pure function of its inputs (and the embedder's vectors).
    """

    name = "offline"

    def __init__(self, embedder: Embedder | None = None, *, cache_size: int = 4096) -> None:
        """Use ``embedder`` (any :class:`Embedder`) for similarities; None: lexical only."""
        self.embedder = embedder
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = int(cache_size)
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ similarity

    def _vectors(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors of ``texts`` (embedded once per distinct text, LRU-cached)."""
        assert self.embedder is not None
        with self._lock:
            found = {t: self._cache[t] for t in dict.fromkeys(texts) if t in self._cache}
        todo = [t for t in dict.fromkeys(texts) if t not in found]
        if todo:
            try:
                vecs = np.asarray(self.embedder.embed(list(todo)), dtype=np.float32)
            except Exception as e:
                raise JudgeError(f"offline judge: embedding failed: {e}") from e
            if vecs.ndim != 2 or vecs.shape[0] != len(todo):
                raise JudgeError(
                    f"offline judge: embedder returned shape {vecs.shape} for {len(todo)} texts"
                )
            vecs = vecs / np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
            found.update(zip(todo, vecs, strict=True))
        with self._lock:
            for t, v in found.items():
                self._cache[t] = v
                self._cache.move_to_end(t)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return np.stack([found[t] for t in texts])

    def similarity(self, text: str, others: Sequence[str]) -> list[float]:
        """Cosine similarity of ``text`` to each of ``others`` (embedder, else lexical)."""
        if not others:
            return []
        if self.embedder is None:
            return [_lexical_similarity(text, o) for o in others]
        vecs = self._vectors([text, *others])
        return [float(x) for x in vecs[1:] @ vecs[0]]

    def _duplicate_of(self, candidate: str, notes: Sequence[Note]) -> tuple[Note, str] | None:
        """The note that ``candidate`` duplicates (or is a strict subset of), with the reason."""
        if not notes:
            return None
        norm = normalize_text(candidate)
        seq = _bag(candidate)
        for n in notes:
            if normalize_text(n.note) == norm:
                return n, f"identical to note {n.id}"
        for n in notes:
            other = _bag(n.note)
            if seq.sequence and seq.sequence == other.sequence and seq.negated == other.negated:
                return n, f"same content words as note {n.id}"
        sims = self.similarity(candidate, [n.note for n in notes])
        for n, s in sorted(zip(notes, sims, strict=True), key=lambda x: -x[1]):
            if s < DUPLICATE_SIMILARITY:
                break
            if _information_diff(candidate, n.note) is None:
                return n, f"restates note {n.id} (similarity {s:.2f}) without new information"
        return None

    # ------------------------------------------------------------------ extraction

    def extract_notes(
        self,
        messages: Sequence[ConversationMessage],
        existing: Sequence[Note],
        *,
        rating_context: str,
    ) -> list[CandidateNote]:
        """Durable statements of the user, rewritten as third-person notes.

        Reads user messages and rating comments (the user's words on any message); skips
        small talk, questions, one-off requests, speculation, PII and sensitive facts, and
        whole messages that try to steer the assistant ("ignore previous instructions").
        Later statements and corrections replace earlier conflicting ones. A candidate that
        duplicates an existing note is dropped; one that gives an existing note's attribute a
        new value carries that note's id in ``merge_with_existing_ids``. For
        ``rating_context="failure"`` at most one Issue lesson is returned.
        """
        if rating_context not in RATING_CONTEXTS:
            raise ValidationError(
                f"rating_context must be one of {', '.join(RATING_CONTEXTS)}; got {rating_context!r}"
            )
        if rating_context == "failure":
            drafts = self._failure_lesson(messages)
        else:
            drafts = self._statements(messages, rated=rating_context in ("positive", "negative"))
        return self._against_existing(drafts, existing)

    def _statements(self, messages: Sequence[ConversationMessage], *, rated: bool) -> list[_Draft]:
        drafts: list[_Draft] = []
        for msg in messages:
            sources: list[tuple[str, bool]] = []
            if msg.role.lower() == "user" and msg.text:
                sources.append((msg.text, False))
            if msg.rating_comment:
                sources.append((msg.rating_comment, True))
            for text, in_comment in sources:
                if reads_as_instruction(text):
                    continue  # the whole message is untrusted: nothing in it becomes a note
                for sentence in re.split(r"(?<=[.!?])\s+|\n+", _expand_keep_case(text)):
                    self._sentence(sentence, msg, drafts, rated=rated, in_comment=in_comment)
        return drafts

    def _sentence(
        self,
        sentence: str,
        msg: ConversationMessage,
        drafts: list[_Draft],
        *,
        rated: bool,
        in_comment: bool,
    ) -> None:
        s = sentence.strip()
        if len(s) < 4 or _PII.search(s) or _SENSITIVE.search(s):
            return
        if s.endswith("?"):
            s = _QUESTION_TAIL.sub("", s).strip()
            if not s or s.endswith("?"):
                return  # a question without a stated preference
        s = _strip_leads(s)
        corrected = False
        if m := _CORRECTION.match(s):
            corrected, s = True, _strip_leads(s[m.end() :])
        standing = False
        if m := _STANDING.match(s):
            standing, s = True, s[m.end() :]
        for part in _parts(s):
            part = _strip_leads(part)
            if not part or _SMALL_TALK.match(part) or _WEATHER.search(part):
                continue
            if _EPHEMERAL.search(part) or _SPECULATION.search(part):
                continue
            hedged = False
            if m := _HEDGES.match(part):
                hedged, part = True, part[m.end() :]
            hedged = hedged or bool(_HEDGE_WORDS.search(part))
            soft = bool(_SOFT_WORDS.search(part))
            d = _match_statement(part, standing=standing, rated=rated, in_comment=in_comment)
            if d is None:
                if corrected and drafts:
                    replaced = _replace_value(drafts[-1].content, part)
                    if replaced is not None:
                        prev = drafts.pop()
                        prev.content, prev.corrected = _clip(replaced), True
                        prev.source_message_id = msg.message_id
                        drafts.append(prev)
                continue
            d.content = _clip(d.content)
            if len(d.content) < 10:
                continue
            if hedged:
                d.confidence = 72.0
            elif soft:
                d.confidence = min(d.confidence, 82.0)
            d.source_message_id = msg.message_id
            d.corrected = corrected
            # A later statement (or explicit correction) replaces earlier conflicting ones.
            drafts[:] = [x for x in drafts if _text_conflict(x.content, d.content) is None]
            drafts.append(d)

    def _failure_lesson(self, messages: Sequence[ConversationMessage]) -> list[_Draft]:
        for msg in messages:
            if msg.role.lower() != "system" or not msg.text:
                continue
            m = _FAILURE_ERROR.search(msg.text)
            error = m.group(1) if m else msg.text
            for pattern, label, lesson in _FAILURE_LESSONS:
                if pattern.search(error):
                    content = _clip(f"Runs of this agent can fail with {label}: {lesson}.")
                    return [_Draft(content, "Issue", "global", 82.0, msg.message_id)]
        return []

    def _against_existing(
        self, drafts: list[_Draft], existing: Sequence[Note]
    ) -> list[CandidateNote]:
        out: list[CandidateNote] = []
        seen: set[str] = set()
        for d in drafts:
            key = normalize_text(d.content)
            if key in seen:
                continue
            seen.add(key)
            words = _bag(d.content).words
            related = [n for n in existing if words & _bag(n.note).words]
            if self._duplicate_of(d.content, related) is not None:
                continue
            merge = tuple(n.id for n in related if _text_conflict(d.content, n.note) is not None)
            out.append(
                CandidateNote(
                    content=d.content,
                    type=d.type,
                    scope_level=d.scope_level,
                    confidence=float(d.confidence),
                    merge_with_existing_ids=merge,
                    protection_tier_hint="Ephemeral" if d.type == "Issue" else None,
                    source_message_id=d.source_message_id,
                )
            )
        return out

    def extract_examples(
        self, messages: Sequence[ConversationMessage], existing: Sequence[Example]
    ) -> list[CandidateExample]:
        """(user request -> assistant answer) pairs whose answer the user rated 8 or more.

        success_score = rating * 10 (capped at 100), confidence 80. Skipped: small talk,
        inputs under 10 characters, PII, injection attempts, and inputs whose normalised
        text equals an existing example's (or an earlier pair's) input.
        """
        seen = {normalize_text(e.example_input) for e in existing}
        out: list[CandidateExample] = []
        question: ConversationMessage | None = None
        for msg in messages:
            role = msg.role.lower()
            if role == "user":
                question = msg
                continue
            if role != "assistant" or question is None or msg.rating is None or msg.rating < 8:
                continue
            inp, ans = question.text.strip(), msg.text.strip()
            key = normalize_text(inp)
            question = None
            if len(key) < 10 or not ans or key in seen or _SMALL_TALK.match(inp):
                continue
            if _PII.search(inp) or _PII.search(ans) or reads_as_instruction(inp):
                continue
            seen.add(key)
            out.append(
                CandidateExample(
                    example_input=inp,
                    example_output=ans,
                    success_score=float(min(100, msg.rating * 10)),
                    confidence=80.0,
                    source_message_id=msg.message_id,
                )
            )
        return out

    # ------------------------------------------------------------------ dedupe

    def is_duplicate(self, candidate: str, matches: Sequence[Note]) -> DedupeDecision:
        """should_add False only for a true duplicate or strict subset of a match:
        normalised-equal text, the same content words in the same order, or cosine >= 0.92
        with no new number, no negation change and no new content word. Otherwise True."""
        if not matches:
            return DedupeDecision(True, "no similar notes")
        dup = self._duplicate_of(candidate, matches)
        if dup is not None:
            return DedupeDecision(False, f"duplicate: {dup[1]}")
        sims = self.similarity(candidate, [n.note for n in matches])
        best = max(range(len(matches)), key=lambda i: sims[i])
        diff = _information_diff(candidate, matches[best].note)
        detail = f"; vs note {matches[best].id}: {diff}" if diff else ""
        return DedupeDecision(
            True, f"adds or changes information (best similarity {sims[best]:.2f}{detail})"
        )

    # ------------------------------------------------------------------ consolidation

    def synthesize_cluster(self, notes: Sequence[Note], *, anchored: bool) -> ConsolidationDecision:
        """One note replacing a valid cluster; never skips a valid cluster.

        Base: the highest consolidation_count note when ``anchored``, else the newest (tie:
        higher importance). Clauses of the other notes are appended after "; also: " unless
        already covered; a clause that conflicts with a clause of a newer note is dropped
        (kept as "; previously: ..." only when it carries an entity the rest lacks). Every
        entity of every source survives, even past 300 characters. Type: the most common
        (tie: the base's); scope: user/company/global by what all notes share.
        """
        problem = _cluster_problem(notes)
        if problem is not None:
            return ConsolidationDecision(False, reason=problem)
        if anchored:
            base = max(notes, key=lambda n: (n.consolidation_count, *_recency_key(n)))
        else:
            base = max(notes, key=_recency_key)
        others = sorted((n for n in notes if n.id != base.id), key=_recency_key, reverse=True)
        # (clause text, parsed, owner note) in priority order: base first, then newest first.
        items: list[tuple[str, _Clause | None, Note]] = []
        history: list[str] = []  # "previously: ..." parts of earlier consolidations
        for n in (base, *others):
            for part in _CLAUSE_SPLIT.split(n.note):
                part = part.strip().rstrip(".").strip()
                if part.lower().startswith("previously:"):
                    history.append(part.split(":", 1)[1].strip())
                elif part:
                    items.append((part, _parse_clause(part), n))
        # Conflicts: the clause of the newer note wins (tie: importance, then priority order).
        superseded: set[int] = set()
        for i in range(len(items)):
            for j in range(i + 1, len(items)):
                ci, cj = items[i][1], items[j][1]
                if i in superseded or j in superseded or ci is None or cj is None:
                    continue
                if items[i][2].id == items[j][2].id or _clause_conflict(ci, cj) is None:
                    continue
                loser = j if _recency_key(items[i][2]) >= _recency_key(items[j][2]) else i
                superseded.add(loser)
        kept: list[str] = []
        old: list[str] = []
        dropped = 0
        for idx, (text, _parsed, owner) in enumerate(items):
            if idx in superseded:
                old.append(text)
                continue
            if owner.id != base.id and self._covered(text, kept):
                dropped += 1
                continue
            # A kept clause that this one states in full (and more) is replaced in place.
            refined = next(
                (
                    i
                    for i, k in enumerate(kept)
                    if _information_diff(k, text) is None
                    and not _missing_entities(entities(k), text)
                ),
                None,
            )
            if refined is not None:
                kept[refined] = text
                dropped += 1
            else:
                kept.append(text)
        all_entities = entities(" ".join(n.note for n in notes))
        old = [
            o
            for o in dict.fromkeys([*old, *history])
            if o and _missing_entities(entities(o), "; ".join(kept))
        ]
        content = self._render(kept, old, all_entities)
        type_ = self._majority_type(notes, base)
        n_old = len(superseded)
        reason = (
            f"Merged {len(notes)} related notes around note {base.id}"
            f" ({'anchored on the most consolidated note' if anchored else 'newest note as base'});"
            f" {dropped} repeated clause(s) folded, {n_old} superseded clause(s) resolved newer-wins."
        )
        return ConsolidationDecision(
            should_consolidate=True,
            content=content,
            type=type_,
            scope_level=_scope_level(notes),
            confidence=85.0,
            source_note_ids=tuple(n.id for n in notes),
            reason=reason,
        )

    def _covered(self, clause: str, kept: Sequence[str]) -> bool:
        """True when ``clause`` adds nothing to the kept clauses (and loses no entity)."""
        if not kept:
            return False
        if _missing_entities(entities(clause), " ".join(kept)):
            return False
        norm = normalize_text(clause)
        if any(normalize_text(k) == norm or _information_diff(clause, k) is None for k in kept):
            return True
        sims = self.similarity(clause, list(kept))
        return any(
            s >= COVERED_SIMILARITY and _bag(clause).negated == _bag(k).negated
            for s, k in zip(sims, kept, strict=True)
        )

    @staticmethod
    def _render(kept: list[str], old: list[str], all_entities: list[str]) -> str:
        def text(k: list[str], o: list[str]) -> str:
            out = k[0] if k else ""
            if len(k) > 1:
                out += "; also: " + "; ".join(k[1:])
            for item in o:
                out += f"; previously: {item}" if out else f"Previously: {item}"
            return out + "."

        # Over 300 chars: drop appended clauses whose entities the rest still carries.
        kept = list(kept)
        i = len(kept) - 1
        while len(text(kept, old)) > MAX_CONSOLIDATED_CHARS and i >= 1:
            trial = kept[:i] + kept[i + 1 :]
            if not _missing_entities(all_entities, text(trial, old)):
                kept = trial
            i -= 1
        return text(kept, old)

    @staticmethod
    def _majority_type(notes: Sequence[Note], base: Note) -> str:
        counts = Counter(str(n.type) for n in notes)
        top = max(counts.values())
        winners = {t for t, c in counts.items() if c == top}
        return str(base.type) if str(base.type) in winners else sorted(winners)[0]

    # ------------------------------------------------------------------ contradictions

    def detect_contradiction(self, a: Note, b: Note) -> ContradictionDecision:
        """Rule-based entity-attribute-value check, resolved by the authority order.

        'negation' (one note denies the other), 'competing_relation' (same subject and
        predicate, a different value for the same attribute) or 'temporal_supersession'
        (either of those where the newer note has a time cue such as "now", "as of",
        "switched", "no longer"). Winner: newer by more than 7 days, else higher importance,
        else higher access count. When all tie: is_contradiction False with the detected
        type kept ("keep both: no authority"). Self-pairs, different agents and different
        scopes are never contradictions.
        """
        pre = _pair_precheck(a, b)
        if pre is not None:
            return pre
        conflict = _text_conflict(a.note, b.note)
        if conflict is None:
            return ContradictionDecision(
                False, reason="no conflicting entity-attribute values: both kept"
            )
        kind = conflict.kind
        newer = _newer(a, b)
        newer_clause = conflict.first if newer > 0 else conflict.second if newer < 0 else None
        if newer_clause is not None and newer_clause.time_cue:
            kind = "temporal_supersession"
        triples = (conflict.first.triple(), conflict.second.triple())
        auth = _authority(a, b)
        if auth is None:
            return ContradictionDecision(
                False,
                contradiction_type=kind,
                reason=f"{kind} detected but keep both: no authority (same age, importance and access count)",
                confidence=85.0,
                entity_triples=triples,
            )
        winner, loser, rule = auth
        return ContradictionDecision(
            True,
            contradiction_type=kind,
            keep_note_id=winner.id,
            revoke_note_id=loser.id,
            reason=f"{kind} rule: '{conflict.first.text}' vs '{conflict.second.text}'; note {winner.id} wins ({rule})",
            confidence=85.0,
            entity_triples=triples,
        )


# =========================================================================== litellm judge


def _choice(options: Sequence[str]) -> Any:
    """A before-validator mapping a value case-insensitively onto one of ``options``."""
    table = {o.lower(): o for o in options}

    def check(value: Any) -> Any:
        if isinstance(value, str) and value.strip().lower() in table:
            return table[value.strip().lower()]
        return value

    return check


_NoteTypeName = Annotated[
    Literal["Preference", "Constraint", "Context", "Example", "Issue"],
    BeforeValidator(_choice(NOTE_TYPES)),
]
_ScopeName = Annotated[Literal["global", "company", "user"], BeforeValidator(_choice(SCOPE_LEVELS))]
_Confidence = Annotated[float, Field(ge=0, le=100)]


class _Out(BaseModel):
    """Base of the model-output schemas: camelCase or snake_case keys, extra keys ignored."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


class _NoteOut(_Out):
    content: str = Field(min_length=1, max_length=1000)
    type: _NoteTypeName
    scope_level: _ScopeName | None = None
    confidence: _Confidence
    merge_with_existing_id: str | None = None
    merge_with_existing_ids: list[str] = Field(default_factory=list, max_length=100)
    protection_tier_hint: (
        Annotated[
            Literal["Ephemeral", "Standard"], BeforeValidator(_choice(("Ephemeral", "Standard")))
        ]
        | None
    ) = None
    source_message_id: str | None = None


class _NotesOut(_Out):
    notes: list[_NoteOut] = Field(default_factory=list, max_length=1000)


class _ExampleOut(_Out):
    example_input: str = Field(min_length=1, max_length=20000)
    example_output: str = Field(min_length=1, max_length=50000)
    success_score: Annotated[float, Field(ge=0, le=100)]
    confidence: _Confidence
    source_message_id: str | None = None


class _ExamplesOut(_Out):
    examples: list[_ExampleOut] = Field(default_factory=list, max_length=1000)


class _DedupeOut(_Out):
    should_add: StrictBool
    reason: str = Field(default="", max_length=2000)


class _ConsolidatedNoteOut(_Out):
    type: _NoteTypeName | None = None
    content: str = Field(default="", max_length=4000)
    scope_level: _ScopeName | None = None
    confidence: _Confidence = 85.0


class _ConsolidateOut(_Out):
    should_consolidate: StrictBool
    consolidated_note: _ConsolidatedNoteOut | None = None
    source_note_ids: list[str] = Field(default_factory=list, max_length=100)
    reason: str = Field(default="", max_length=2000)


def _triple(value: Any) -> Any:
    if isinstance(value, dict):
        return [value.get("entity"), value.get("attribute"), value.get("value")]
    return value


class _ContradictionOut(_Out):
    entity_triples: list[Annotated[tuple[str, str, str], BeforeValidator(_triple)]] = Field(
        default_factory=list, max_length=50
    )
    is_contradiction: StrictBool
    contradiction_type: (
        Annotated[
            Literal["competing_relation", "negation", "temporal_supersession"],
            BeforeValidator(_choice(CONTRADICTION_TYPES)),
        ]
        | None
    ) = None
    keep_note_id: str | None = None
    revoke_note_id: str | None = None
    reason: str = Field(default="", max_length=2000)
    confidence: _Confidence = 0.0

    @field_validator("contradiction_type", mode="before")
    @classmethod
    def _null_type(cls, v: Any) -> Any:
        return None if isinstance(v, str) and v.strip().lower() in ("", "null", "none") else v


#: How the judge asks for JSON (``LiteLLMJudge(response_format=...)``,
#: ``$MEMORY_LLM_RESPONSE_FORMAT``): "json_object" (JSON mode where litellm says the model
#: has it), "schema" (``{"type": "json_object", "schema": ...}``: llama-cpp-python's server
#: and others constrain decoding to the task's JSON schema), "json_schema" (OpenAI structured
#: outputs, also llama.cpp's own server and vLLM) or "none".
RESPONSE_FORMATS: tuple[str, ...] = ("json_object", "schema", "json_schema", "none")


def _string(*, nullable: bool = False) -> dict[str, Any]:
    """A string (lengths are left to ``max_tokens`` and the reply models: a ``maxLength``
    becomes a deeply nested grammar rule that slows llama.cpp's sampling)."""
    if nullable:
        return {"anyOf": [{"type": "string"}, {"type": "null"}]}
    return {"type": "string"}


def _enum(values: Sequence[str | None]) -> dict[str, Any]:
    """One of ``values`` (``None`` allows null)."""
    return {"enum": list(values)}


def _object(**properties: Any) -> dict[str, Any]:
    """A closed object whose properties are all required, in this order."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _array(items: dict[str, Any], max_items: int) -> dict[str, Any]:
    return {"type": "array", "items": items, "maxItems": max_items}


_SCORE = {"type": "integer"}
_BOOL = {"type": "boolean"}
_ID = _string()
#: The JSON schema of each task's reply, for constrained decoding: keys, enums, bounded
#: arrays. Here ids are free strings; each call narrows them to the ids it shows the model
#: (:func:`_narrow_ids`). Every reply is still checked after parsing (ids among the given
#: ones, confidence range, ...), for servers that ignore the schema and for every model.
TASK_SCHEMAS: dict[str, dict[str, Any]] = {
    "extract notes": _object(
        notes=_array(
            _object(
                content=_string(),
                type=_enum(("Preference", "Constraint", "Context", "Issue")),
                scopeLevel=_enum(SCOPE_LEVELS),
                confidence=_SCORE,
                mergeWithExistingIds=_array(_ID, 5),
                protectionTierHint=_enum(("Ephemeral", "Standard", None)),
                sourceMessageId=_string(nullable=True),
            ),
            5,
        )
    ),
    "extract examples": _object(
        examples=_array(
            _object(
                exampleInput=_string(),
                exampleOutput=_string(),
                successScore=_SCORE,
                confidence=_SCORE,
                sourceMessageId=_string(nullable=True),
            ),
            3,
        )
    ),
    "deduplicate": _object(shouldAdd=_BOOL, reason=_string()),
    "consolidate": _object(
        shouldConsolidate=_BOOL,
        consolidatedNote=_object(
            type=_enum(NOTE_TYPES),
            content=_string(),
            scopeLevel=_enum(SCOPE_LEVELS),
            confidence=_SCORE,
        ),
        sourceNoteIds=_array(_ID, 20),
        reason=_string(),
    ),
    "contradiction": _object(
        entityTriples=_array(
            {"type": "array", "items": _string(), "minItems": 3, "maxItems": 3}, 4
        ),
        isContradiction=_BOOL,
        contradictionType=_enum((*CONTRADICTION_TYPES, None)),
        keepNoteId=_string(nullable=True),
        revokeNoteId=_string(nullable=True),
        reason=_string(),
        confidence=_SCORE,
    ),
}


def _narrow_ids(schema: Any, ids: Mapping[str, Sequence[str]]) -> Any:
    """``schema`` with the properties named in ``ids`` limited to those ids: a (nullable)
    string becomes an enum of them (plus null), an array of ids takes only them (or none)."""
    if isinstance(schema, list):
        return [_narrow_ids(v, ids) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _narrow_ids(v, ids) for k, v in schema.items()}
    props = out.get("properties")
    if isinstance(props, dict):
        for key, allowed in ids.items():
            prop = props.get(key)
            if prop is None:
                continue
            allowed = list(dict.fromkeys(allowed))
            if prop.get("type") == "array":
                props[key] = (
                    {"type": "array", "items": {"enum": allowed}, "maxItems": prop["maxItems"]}
                    if allowed
                    else {"type": "array", "items": _ID, "maxItems": 0}
                )
            else:
                props[key] = {"enum": [*allowed, None] if "anyOf" in prop else allowed}
    return out


def judge_options_from_env(env: Any = None) -> dict[str, Any]:
    """``LiteLLMJudge`` options from ``$MEMORY_LLM_RESPONSE_FORMAT``,
    ``$MEMORY_LLM_MAX_TOKENS`` and ``$MEMORY_LLM_TIMEOUT`` (unset: the defaults). A bad value
    is a ``ConfigError``."""
    env = os.environ if env is None else env
    options: dict[str, Any] = {}
    fmt = (env.get("MEMORY_LLM_RESPONSE_FORMAT") or "").strip().lower()
    if fmt:
        if fmt not in RESPONSE_FORMATS:
            raise ConfigError(
                f"MEMORY_LLM_RESPONSE_FORMAT must be one of {', '.join(RESPONSE_FORMATS)}; got {fmt!r}"
            )
        options["response_format"] = fmt
    for key, name, kind in (
        ("max_tokens", "MEMORY_LLM_MAX_TOKENS", int),
        ("timeout", "MEMORY_LLM_TIMEOUT", float),
    ):
        raw = (env.get(name) or "").strip()
        if not raw:
            continue
        try:
            value = kind(raw)
        except ValueError:
            value = 0
        if not value > 0:
            raise ConfigError(f"{name} must be a positive number; got {raw!r}")
        options[key] = value
    return options


def _untrusted(text: str | None) -> bool:
    """Text a model's answer may not turn into memory: an injection attempt or personal
    data (the offline rules' filters, applied to the model's output and its sources)."""
    return bool(text) and bool(_INJECTION.search(text) or _PII.search(text))


_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.S)


def parse_json_object(text: str) -> dict[str, Any]:
    """The JSON object in a model's reply: ```json fences and prose around the object are
    tolerated, and trailing commas are repaired. Raises ``JudgeError`` otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise JudgeError("the model returned an empty reply")
    s = text.strip()
    if m := _FENCE.search(s):
        s = m.group(1).strip()
    attempts = [s]
    start, end = s.find("{"), s.rfind("}")
    if start != -1 and end > start:
        attempts.append(s[start : end + 1])
    attempts += [re.sub(r",\s*([}\]])", r"\1", a) for a in list(attempts)]
    last: Exception | None = None
    for candidate in attempts:
        try:
            value = json.loads(candidate)
        except ValueError as e:
            last = e
            continue
        if not isinstance(value, dict):
            raise JudgeError(f"the model returned JSON {type(value).__name__}, expected an object")
        return value
    raise JudgeError(f"the model returned malformed JSON: {last}") from last


class LiteLLMJudge:
    """Judge backed by any litellm chat model (OpenAI, Anthropic, Ollama, ...).

    Every call: temperature 0, ``timeout`` seconds, ``num_retries`` retries, at most
    ``max_tokens`` tokens when set, and the reply format of ``response_format`` (see
    :data:`RESPONSE_FORMATS`: JSON mode when the model supports it by default; "schema" or
    "json_schema" send the task's JSON schema from :data:`TASK_SCHEMAS` for constrained
    decoding); ``completion_kwargs`` are passed to ``litellm.completion`` last
    (tests use ``mock_response``). The reply is parsed and validated (note types, scope
    levels, confidence 0-100, ids among the given ones); any failure raises ``JudgeError``.
    litellm is imported on the first call, never at module import.
    """

    def __init__(
        self,
        model: str,
        *,
        timeout: float = 30,
        num_retries: int = 2,
        temperature: float = 0,
        completion_kwargs: dict[str, Any] | None = None,
        response_format: str = "json_object",
        max_tokens: int | None = None,
    ) -> None:
        """Store the settings; nothing is imported or called yet."""
        if not isinstance(model, str) or not model.strip():
            raise ConfigError("LiteLLMJudge needs a litellm model string")
        if response_format not in RESPONSE_FORMATS:
            raise ConfigError(
                f"response_format must be one of {', '.join(RESPONSE_FORMATS)}; got {response_format!r}"
            )
        self.response_format = response_format
        self.max_tokens = max_tokens
        self.model = model.strip()
        self.name = f"litellm:{self.model}"
        self.timeout = timeout
        self.num_retries = int(num_retries)
        self.temperature = temperature
        self.completion_kwargs = dict(completion_kwargs or {})
        self._json_mode: bool | None = None

    # ------------------------------------------------------------------ transport

    def _litellm(self) -> Any:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        try:
            import litellm
        except ImportError as e:  # pragma: no cover - litellm is a dependency
            raise JudgeError("litellm is not installed") from e
        litellm.suppress_debug_info = True
        return litellm

    def _supports_json(self, litellm: Any) -> bool:
        if self._json_mode is None:
            try:
                params = litellm.get_supported_openai_params(model=self.model) or []
            except Exception:
                params = []
            self._json_mode = "response_format" in params
        return self._json_mode

    def _response_format(
        self, task: str, litellm: Any, ids: Mapping[str, Sequence[str]] | None = None
    ) -> dict[str, Any] | None:
        """The ``response_format`` of a call for ``task`` in this judge's mode (a schema's
        id properties limited to ``ids``)."""
        schema = _narrow_ids(TASK_SCHEMAS[task], ids or {})
        if self.response_format == "schema":
            return {"type": "json_object", "schema": schema}
        if self.response_format == "json_schema":
            name = task.replace(" ", "_")
            return {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema, "strict": True},
            }
        if self.response_format == "json_object" and self._supports_json(litellm):
            return {"type": "json_object"}
        return None

    def _ask(
        self,
        task: str,
        messages: list[dict[str, str]],
        ids: Mapping[str, Sequence[str]] | None = None,
    ) -> dict[str, Any]:
        """One completion for ``task``; the reply's JSON object (``JudgeError`` on failure)."""
        litellm = self._litellm()
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "timeout": self.timeout,
            "num_retries": self.num_retries,
        }
        if self.max_tokens:
            kwargs["max_tokens"] = self.max_tokens
        response_format = self._response_format(task, litellm, ids)
        if response_format is not None:
            kwargs["response_format"] = response_format
        kwargs.update(self.completion_kwargs)
        try:
            response = litellm.completion(**kwargs)
        except Exception as e:
            raise JudgeError(f"{self.name}: {task} call failed ({type(e).__name__}): {e}") from e
        try:
            content = response.choices[0].message.content
        except (AttributeError, IndexError, KeyError, TypeError) as e:
            raise JudgeError(f"{self.name}: {task} reply has no message content") from e
        try:
            return parse_json_object(content)
        except JudgeError as e:
            raise JudgeError(f"{self.name}: {task}: {e}") from e

    def _validate(self, task: str, schema: type[_Out], data: dict[str, Any]) -> Any:
        try:
            return schema.model_validate(data)
        except PydanticValidationError as e:
            raise JudgeError(f"{self.name}: {task} reply fails its schema: {e}") from e

    # ------------------------------------------------------------------ decisions

    def extract_notes(
        self,
        messages: Sequence[ConversationMessage],
        existing: Sequence[Note],
        *,
        rating_context: str,
    ) -> list[CandidateNote]:
        """Notes the model extracts (prompt 'extract notes'). Merge ids must name existing
        notes and source ids given messages; "failure" keeps at most one Issue/Context lesson
        with the Ephemeral hint. No messages: [] without a call."""
        if rating_context not in RATING_CONTEXTS:
            raise ValidationError(
                f"rating_context must be one of {', '.join(RATING_CONTEXTS)}; got {rating_context!r}"
            )
        if not messages:
            return []
        data = {
            "ratingContext": rating_context,
            "messages": [
                {
                    "id": m.message_id,
                    "role": m.role,
                    "text": m.text,
                    "rating": m.rating,
                    "ratingComment": m.rating_comment,
                }
                for m in messages
            ],
            "existingNotes": [
                {"id": n.id, "type": str(n.type), "content": n.note} for n in existing
            ],
        }
        prompt = render(EXTRACT_NOTES_SYSTEM, data, rating_context=rating_context)
        existing_ids = {n.id for n in existing}
        message_ids = {m.message_id for m in messages if m.message_id}
        ids = {"sourceMessageId": sorted(message_ids), "mergeWithExistingIds": sorted(existing_ids)}
        out = self._validate("extract notes", _NotesOut, self._ask("extract notes", prompt, ids))
        hostile = {m.message_id for m in messages if m.message_id and _untrusted(m.text)}
        notes: list[CandidateNote] = []
        for item in out.notes:
            merge = list(item.merge_with_existing_ids)
            if item.merge_with_existing_id:
                merge.append(item.merge_with_existing_id)
            merge = list(dict.fromkeys(m for m in merge if m))
            unknown = [m for m in merge if m not in existing_ids]
            if unknown:
                raise JudgeError(
                    f"{self.name}: extract notes names unknown existing notes {unknown[:5]}"
                )
            if item.source_message_id and item.source_message_id not in message_ids:
                raise JudgeError(
                    f"{self.name}: extract notes names unknown message {item.source_message_id!r}"
                )
            if _untrusted(item.content) or item.source_message_id in hostile:
                continue  # what the offline rules never mine, a model may not write either
            type_, hint = item.type, item.protection_tier_hint
            if rating_context == "failure":
                type_ = type_ if type_ in ("Issue", "Context") else "Issue"
                hint = "Ephemeral"
            notes.append(
                CandidateNote(
                    content=item.content.strip(),
                    type=type_,
                    scope_level=item.scope_level or "user",
                    confidence=float(item.confidence),
                    merge_with_existing_ids=tuple(merge),
                    protection_tier_hint=hint,
                    source_message_id=item.source_message_id,
                )
            )
        return notes[:1] if rating_context == "failure" else notes

    def extract_examples(
        self, messages: Sequence[ConversationMessage], existing: Sequence[Example]
    ) -> list[CandidateExample]:
        """Examples the model picks; kept when success_score >= 70 and confidence >= 70 and
        the normalised input is new. No messages: [] without a call."""
        if not messages:
            return []
        data = {
            "messages": [
                {
                    "id": m.message_id,
                    "role": m.role,
                    "text": m.text,
                    "rating": m.rating,
                    "ratingComment": m.rating_comment,
                }
                for m in messages
            ],
            "existingExamples": [{"id": e.id, "input": e.example_input} for e in existing],
        }
        prompt = render(EXTRACT_EXAMPLES_SYSTEM, data)
        message_ids = {m.message_id for m in messages if m.message_id}
        ids = {"sourceMessageId": sorted(message_ids)}
        out = self._validate(
            "extract examples", _ExamplesOut, self._ask("extract examples", prompt, ids)
        )
        seen = {normalize_text(e.example_input) for e in existing}
        result: list[CandidateExample] = []
        for item in out.examples:
            if item.source_message_id and item.source_message_id not in message_ids:
                raise JudgeError(
                    f"{self.name}: extract examples names unknown message {item.source_message_id!r}"
                )
            key = normalize_text(item.example_input)
            if _untrusted(item.example_input) or _PII.search(item.example_output):
                continue
            if (
                item.success_score < MIN_EXAMPLE_SCORE
                or item.confidence < MIN_EXAMPLE_SCORE
                or key in seen
            ):
                continue
            seen.add(key)
            result.append(
                CandidateExample(
                    example_input=item.example_input,
                    example_output=item.example_output,
                    success_score=float(item.success_score),
                    confidence=float(item.confidence),
                    source_message_id=item.source_message_id,
                )
            )
        return result

    def is_duplicate(self, candidate: str, matches: Sequence[Note]) -> DedupeDecision:
        """The model's {shouldAdd, reason}; no matches: add without a call."""
        if not matches:
            return DedupeDecision(True, "no similar notes")
        data = {
            "candidate": candidate,
            "similarNotes": [{"id": n.id, "type": str(n.type), "content": n.note} for n in matches],
        }
        out = self._validate(
            "deduplicate", _DedupeOut, self._ask("deduplicate", render(DEDUPE_SYSTEM, data))
        )
        return DedupeDecision(
            bool(out.should_add),
            out.reason or ("adds information" if out.should_add else "duplicate"),
        )

    def synthesize_cluster(self, notes: Sequence[Note], *, anchored: bool) -> ConsolidationDecision:
        """The model's consolidation; an invalid cluster is refused without a call. Source
        ids must be cluster ids (none given: all); the note must keep every entity of the
        cluster (as the offline synthesis does), else ``JudgeError``; a missing type becomes
        the type of the newest note."""
        problem = _cluster_problem(notes)
        if problem is not None:
            return ConsolidationDecision(False, reason=problem)
        data = {
            "anchoredMode": anchored,
            "notes": [
                {
                    "id": n.id,
                    "type": str(n.type),
                    "content": n.note,
                    "createdAt": n.created_at.isoformat() if n.created_at else None,
                    "accessCount": n.access_count,
                    "importanceScore": n.importance_score,
                    "consolidationCount": n.consolidation_count,
                    "agentId": n.agent_id,
                    "userId": n.user_id,
                    "companyId": n.company_id,
                }
                for n in notes
            ],
        }
        prompt = render(CONSOLIDATE_SYSTEM, data, anchored=str(anchored).lower())
        ids = {n.id for n in notes}
        out = self._validate(
            "consolidate",
            _ConsolidateOut,
            self._ask("consolidate", prompt, {"sourceNoteIds": sorted(ids)}),
        )
        unknown = [i for i in out.source_note_ids if i not in ids]
        if unknown:
            raise JudgeError(
                f"{self.name}: consolidate names notes outside the cluster {unknown[:5]}"
            )
        if not out.should_consolidate:
            return ConsolidationDecision(
                False, reason=out.reason or "the model kept the notes separate"
            )
        note = out.consolidated_note
        if note is None or not note.content.strip():
            raise JudgeError(f"{self.name}: consolidate said yes but gave no consolidated note")
        missing = _missing_entities(entities(" ".join(n.note for n in notes)), note.content)
        if missing:  # archiving the sources into this note would lose them
            raise JudgeError(f"{self.name}: consolidate drops entities {missing[:5]}")
        newest = max(notes, key=_recency_key)
        return ConsolidationDecision(
            should_consolidate=True,
            content=note.content.strip(),
            type=note.type or str(newest.type),
            scope_level=note.scope_level or _scope_level(notes),
            confidence=float(note.confidence),
            source_note_ids=tuple(dict.fromkeys(out.source_note_ids)) or tuple(n.id for n in notes),
            reason=out.reason,
        )

    def detect_contradiction(self, a: Note, b: Note) -> ContradictionDecision:
        """The model's two-stage contradiction verdict. Self-pairs and pairs of different
        agents or scopes are answered without a call; keep/revoke ids must be the two notes."""
        pre = _pair_precheck(a, b)
        if pre is not None:
            return pre
        data = {
            "notes": [
                {
                    "id": n.id,
                    "type": str(n.type),
                    "content": n.note,
                    "createdAt": n.created_at.isoformat() if n.created_at else None,
                    "importanceScore": n.importance_score,
                    "accessCount": n.access_count,
                }
                for n in (a, b)
            ]
        }
        prompt = render(CONTRADICTION_SYSTEM, data)
        pair_ids = [a.id, b.id]
        out = self._validate(
            "contradiction",
            _ContradictionOut,
            self._ask("contradiction", prompt, {"keepNoteId": pair_ids, "revokeNoteId": pair_ids}),
        )
        pair = {a.id, b.id}
        named = [i for i in (out.keep_note_id, out.revoke_note_id) if i]
        if any(i not in pair for i in named):
            raise JudgeError(f"{self.name}: contradiction names notes outside the pair {named}")
        triples = tuple(tuple(t) for t in out.entity_triples)
        if not out.is_contradiction:
            return ContradictionDecision(
                False,
                contradiction_type=out.contradiction_type,
                reason=out.reason,
                confidence=float(out.confidence),
                entity_triples=triples,  # type: ignore[arg-type]
            )
        if out.contradiction_type is None:
            raise JudgeError(f"{self.name}: contradiction without a contradictionType")
        if {out.keep_note_id, out.revoke_note_id} != pair:
            raise JudgeError(
                f"{self.name}: a contradiction must keep one note of the pair and revoke the other"
            )
        return ContradictionDecision(
            True,
            contradiction_type=out.contradiction_type,
            keep_note_id=out.keep_note_id,
            revoke_note_id=out.revoke_note_id,
            reason=out.reason,
            confidence=float(out.confidence),
            entity_triples=triples,  # type: ignore[arg-type]
        )
