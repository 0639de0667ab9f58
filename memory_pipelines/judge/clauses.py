"""The clause parser: subject, predicate and value of each statement in a note.

A note is split into clauses (sentences and "; " parts); each clause is read as an
entity-attribute-value statement with polarity, context and a time cue. Two clauses
conflict ("negation", "competing_relation") when they give the same entity and attribute
different values. The offline judge uses this for contradictions, for corrections during
extraction and for newer-wins synthesis.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from memory_pipelines.judge.lexicon import (
    _ARTICLES,
    _LEMMAS,
    _NEGATIONS,
    _NUMBER_WORDS,
    _canon,
    _expand,
    _is_number,
    _is_past,
    _stem,
)
from memory_pipelines.text import CONTENT_STOPWORDS, FILLERS, TOKEN

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
        if tok not in CONTENT_STOPWORDS and word not in CONTENT_STOPWORDS:
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
    tokens = TOKEN.findall(t)
    if not tokens:
        return None
    kept, core, negated = _kept_tokens(tokens)
    base = _Clause(text=text, core=tuple(core), negated=negated, time_cue=time_cue)

    # Predicate: the first known verb (a lemma verb or a form of "be").
    i = next((j for j, tok in enumerate(kept) if _is_verb(tok)), -1)
    if i < 0:
        return base
    verb = kept[i]
    subject_tokens = [s for s in kept[:i] if s not in _ARTICLES]
    rest = kept[i + 1 :]
    if subject_tokens and subject_tokens[0] in _VAGUE_SUBJECTS:
        return base  # "it is ...", "that was ...": no entity to compare
    subject = tuple(
        _SUBJECT_ALIASES.get(s) or _stem(_NUMBER_WORDS.get(s, s)) for s in subject_tokens
    )
    if not subject and verb in _BE | _HAVE:
        return base  # "have a great day!"
    if verb in _HAVE and rest and _is_past(rest[0]):
        return base  # "have been", "have put": an auxiliary, not possession
    possessive = any(s.endswith("'s") for s in subject_tokens)
    pred, exclusive, functional, rest = _predicate(verb, subject, rest, possessive)
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


def _kept_tokens(tokens: Sequence[str]) -> tuple[list[str], list[str], bool]:
    """The clause's tokens without negations and fillers, its content words (canonical
    forms) and whether it is negated (an odd number of negations, antonym flips
    included)."""
    neg = 0
    kept: list[str] = []
    for tok in tokens:
        if tok in _NEGATIONS:
            neg += 1
        elif tok in FILLERS:
            continue
        else:
            kept.append(tok)
    core: list[str] = []
    for tok in kept:
        word, flip = _canon(tok)
        neg += flip
        if tok not in CONTENT_STOPWORDS and word not in CONTENT_STOPWORDS:
            core.append(word)
    return kept, core, neg % 2 == 1


def _predicate(
    verb: str, subject: tuple[str, ...], rest: list[str], possessive: bool
) -> tuple[str, bool, bool, list[str]]:
    """The clause's predicate from its verb, whether it is exclusive and functional
    (one value at a time), and the words after it that hold the value."""
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
        return pred, exclusive, functional, rest
    if verb in _HAVE:
        return "have", False, False, rest
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
    return pred, exclusive, functional, rest


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
    if (a.exclusive and b.exclusive) or a.pred in _SHARED_WORD_PREDICATES:
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


_SHARED_WORD_PREDICATES = ("use", "have", "be", "need")


def _conflict_keys(text: str) -> frozenset[tuple[object, ...]]:
    """Keys such that two texts can conflict (:func:`_text_conflict`) only when their key
    sets meet, one key per way :func:`_clause_conflict` can find a conflict: the same core
    of opposite polarity; on the same predicate, subject and context, the same value of
    opposite polarity, "X over Y" against "Y over X", two functional values, or values
    that share a word. Lets a caller compare a text with the few texts that share a key
    instead of with every text it holds (keep in step with :func:`_clause_conflict`)."""
    keys: set[tuple[object, ...]] = set()
    for c in _clauses(text):
        keys.add(("core", c.core))
        if c.pred is None or not c.pos:
            continue
        relation = (c.pred, c.subject, c.context)
        keys.add(("value", relation, c.pos))
        if c.negated:
            continue
        if c.exclusive and c.neg:
            keys.add(("swap", relation, frozenset((c.pos, c.neg))))
        if len(c.pos) > _MAX_VALUE_WORDS:
            continue
        if c.functional:
            keys.add(("functional", relation))
        if c.exclusive or c.pred in _SHARED_WORD_PREDICATES:
            keys.update(("word", relation, w) for w in c.pos if not _is_number(w))
    return frozenset(keys)


def _text_conflict(a: str, b: str) -> _Conflict | None:
    """The first conflict between any clause of ``a`` and any clause of ``b``."""
    for ca in _clauses(a):
        for cb in _clauses(b):
            kind = _clause_conflict(ca, cb)
            if kind is not None:
                return _Conflict(kind, ca, cb)
    return None
