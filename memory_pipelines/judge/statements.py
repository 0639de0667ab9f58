"""Offline extraction: one first-person statement read as a third-person draft note.

:func:`_match_statement` maps a statement ("I prefer bar charts", "always cite sources",
"our team deploys on Fridays") onto a draft note of a type, scope and confidence, or None
when it is not durable; :func:`_parts` splits a sentence into statements and
:func:`_replace_value` applies a correction ("actually, line charts") to the last draft.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memory_pipelines.judge.decisions import MAX_NOTE_CHARS
from memory_pipelines.judge.lexicon import _CONTRACTIONS, _is_past
from memory_pipelines.judge.rules import (
    _BIO_HAVE,
    _CHANGE_VERB,
    _CONDITIONAL_LEAD,
    _DEICTIC,
    _IMPERATIVE_VERBS,
    _LEAD_FILLERS,
    _PART_SPLIT,
    _REACTION_OBJECT,
    _SOCIAL_OBJECT,
    _TEAM_VERBS,
    _TOO_ADJ,
    _TRAILING_POLITE,
    _UNIVERSAL,
)
from memory_pipelines.text import QUOTES


def _expand_keep_case(text: str) -> str:
    t = text.translate(QUOTES)
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
    #: the rule family that wrote it (see :data:`RULE_FAMILIES`)
    rule: str = "preference"


class _Next:
    """A family's answer when none of its rules applies: the next family is tried."""


#: what a family returns when none of its rules applies (None: the statement is not durable)
_NEXT = _Next()


def _draft(family: str, content: str, type_: str, confidence: float, scope: str = "user") -> _Draft:
    return _Draft(content, type_, scope, confidence, None, rule=family)


def _instruction(p: str, standing: bool, rated: bool) -> _Draft | None | _Next:
    """Assistant-directed standing instructions ("always/never ...", "don't ever ...") and
    what the user wants the assistant to do (only standing rules are durable)."""
    adverb: str | None = None
    rule_body = ""
    if m := re.match(r"^(?:please )?do not ever (.+)$", p, re.I):
        adverb, rule_body = "never", m.group(1)
    elif m := re.match(r"^(?:please )?do not (.+?) (?:ever )?again$", p, re.I):
        adverb, rule_body = "never", m.group(1)
    elif m := re.match(r"^(?:please )?(always|never) (.+)$", p, re.I):
        adverb, rule_body = m.group(1).lower(), m.group(2)
    elif standing and not re.match(r"^(?:i|we|my|our)\b", p.lower()):
        if m := re.match(r"^(?:please )?(?:(do not) )?(.+)$", p, re.I):
            adverb, rule_body = ("never" if m.group(1) else ""), m.group(2)
    first = rule_body.split(" ", 1)[0].lower().strip(",.;:!")
    if adverb is not None and first in _IMPERATIVE_VERBS:
        rule = f"{adverb} {rule_body}".strip()
        if _UNIVERSAL.search(rule):
            text = _TRAILING_POLITE.sub("", _third_person_text(rule, "assistant")).strip(" ,;:")
            return _draft(
                "instruction", text[:1].upper() + text[1:] + ".", "Constraint", 90, "global"
            )
        kind = "Constraint" if rated else "Preference"
        return _draft(
            "instruction", _finish("User wants the assistant to", rule, "assistant"), kind, 88
        )
    m = re.match(r"^i (?:really )?(?:want|need|expect|would like) you to (.+)$", p, re.I)
    if not m:
        return _NEXT
    body = m.group(1)
    is_rule = (
        standing
        or re.match(r"^(?:always|never)\b", body, re.I)
        or re.search(r"\b(?:every time|each time|in general|whenever|by default)\b", body, re.I)
    )
    if not is_rule:
        return None
    kind = "Constraint" if rated else "Preference"
    return _draft(
        "instruction", _finish("User wants the assistant to", body, "assistant"), kind, 88
    )


def _without_workplace(p: str) -> str:
    """ "At my company, X" -> "X" (the rules after the instructions read X)."""
    m = re.match(r"^(?:at|in) (?:my|our) (?:company|team|org\w*|department),?\s+(.+)$", p, re.I)
    return m.group(1) if m else p


def _team(p: str, rated: bool) -> _Draft | None | _Next:
    """Team and company conventions ("our team deploys on Fridays", "we never ...")."""
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
        return _draft("team", _finish(who + (m.group(2) or ""), body, "team"), kind, 90, "company")
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
        return _draft("team", _finish(f"Team {adv}{verb_text}", body, "team"), kind, 90, "company")
    return _NEXT


def _change(p: str) -> _Draft | None | _Next:
    """A change of tool or place ("we switched to X", "I moved to Y")."""
    m = re.match(r"^(i|we) (.+)$", p, re.I)
    if not (m and (change := _CHANGE_VERB.match(m.group(2)))):
        return _NEXT
    verb = re.sub(r"^(?:has |have )", "", change.group(0), flags=re.I).lower()
    rest = m.group(2)[change.end() :]
    if m.group(1).lower() == "we":
        return _draft("change", _finish(f"Team {verb}", rest, "team"), "Context", 90, "company")
    return _draft("change", _finish(f"User {verb}", rest, "user"), "Context", 90)


def _preference(p: str, in_comment: bool) -> _Draft | None | _Next:
    """First-person preferences: prefers, would rather, dislikes, does not want, likes,
    always/never."""

    def draft(content: str, confidence: float) -> _Draft:
        return _draft("preference", content, "Preference", confidence)

    m = re.match(
        r"^i (?:really |strongly |generally |usually |always |definitely |much |also |still )*"
        r"(?:prefer|favor|favour)s? (.+)$",
        p,
        re.I,
    )
    if m:
        return draft(_finish("User prefers", m.group(1), "user"), 90)
    m = re.match(r"^i would (?:much )?(?:rather|prefer) (.+)$", p, re.I)
    if m:
        return draft(_finish("User would rather", m.group(1), "user"), 85)
    m = re.match(
        r"^i (?:really |absolutely |truly |just |also )*(?:hate|dislike|detest|loathe|"
        r"can not stand|do not like|do not enjoy|am not a fan of|am not fond of) (.+)$",
        p,
        re.I,
    )
    if m:
        if _REACTION_OBJECT.search(m.group(1)):
            return None
        return draft(_finish("User dislikes", m.group(1), "user"), 88)
    m = re.match(r"^i (?:really )?do not want (.+)$", p, re.I)
    if m:
        if _DEICTIC.match(m.group(1)):
            return None
        return draft(_finish("User does not want", m.group(1), "user"), 85)
    m = re.match(
        r"^i (?:really |absolutely |truly |just |also )*(like|love|enjoy|adore)s? (.+)$", p, re.I
    ) or re.match(r"^i am (?:a |an )?(?:big |huge |great )?(fan) of (.+)$", p, re.I)
    if m:
        obj = m.group(2)
        if _REACTION_OBJECT.search(obj) or (not in_comment and re.match(r"^the\b", obj, re.I)):
            return None
        verb = {"fan": "likes"}.get(m.group(1).lower(), m.group(1).lower() + "s")
        return draft(_finish(f"User {verb}", m.group(2), "user"), 85)
    m = re.match(r"^i (always|never) (.+)$", p, re.I)
    if m and not _is_past(m.group(2).split(" ", 1)[0]):
        return draft(_finish(f"User {m.group(1).lower()}", _conjugate(m.group(2)), "user"), 85)
    return _NEXT


def _biography(p: str) -> _Draft | None | _Next:
    """Biographical facts (Context, >= 90): where the user is based or from, what they
    are, where they work or live, what they have, speak or use, their job or favourites."""

    def draft(content: str, confidence: float, type_: str = "Context") -> _Draft:
        return _draft("biography", content, type_, confidence)

    m = re.match(r"^i am (?:based|located) in (.+)$", p, re.I)
    if m:
        return draft(_finish("User is based in", m.group(1), "user"), 92)
    m = re.match(r"^i am from (.+)$", p, re.I)
    if m:
        return draft(_finish("User is from", m.group(1), "user"), 92)
    m = re.match(r"^i am (a|an) (.+)$", p, re.I)
    if m and not re.match(
        r"^(?:bit|little|tad|lot|quick|sec|moment|(?:huge |big |great )?fan)\b", m.group(2), re.I
    ):
        return draft(_finish(f"User is {m.group(1).lower()}", m.group(2), "user"), 92)
    m = re.match(r"^i (?:currently )?work (at|for|as|in) (.+)$", p, re.I)
    if m:
        return draft(_finish(f"User works {m.group(1).lower()}", m.group(2), "user"), 92)
    m = re.match(r"^i (?:currently )?live in (.+)$", p, re.I)
    if m:
        return draft(_finish("User lives in", m.group(1), "user"), 92)
    m = re.match(
        r"^i (?:have|have got) (a|an|one|two|three|four|five|six|seven|eight|nine|ten|\d+) (.+)$",
        p,
        re.I,
    )
    if m and _BIO_HAVE.match(m.group(2)):
        return draft(_finish(f"User has {m.group(1).lower()}", m.group(2), "user"), 90)
    m = re.match(r"^i speak (.+)$", p, re.I)
    if m:
        return draft(_finish("User speaks", m.group(1), "user"), 90)
    m = re.match(r"^i (?:mainly |mostly |primarily )?use (.+)$", p, re.I)
    if m and not _DEICTIC.match(m.group(1)):
        return draft(_finish("User uses", m.group(1), "user"), 90)
    m = re.match(
        r"^my ((?:favorite|favourite|preferred|native|primary|main|default) [\w ]{2,40}?|job|"
        r"role|job title|title|occupation|profession|background|specialty|specialization|"
        r"expertise|field|timezone|time zone|pronouns|department) (?:is|are) (.+)$",
        p,
        re.I,
    )
    if m:
        attr = m.group(1).lower()
        favourite = attr.startswith(("favorite", "favourite", "preferred"))
        return draft(
            _finish(f"User's {attr} is", m.group(2), "user"),
            90 if favourite else 92,
            "Preference" if favourite else "Context",
        )
    return _NEXT


def _rating_comment(p: str, standing: bool, rated: bool) -> _Draft | None:
    """A rating comment: "too long", or "love the bullet points" read as "I love ..."."""
    m = _TOO_ADJ.match(p)
    if m:
        adj = m.group(1).lower()
        return _draft(
            "rating_comment", f"User dislikes responses that are too {adj}.", "Preference", 82
        )
    m = re.match(r"^(like|love|prefer|enjoy|hate|dislike)s? (.+)$", p, re.I)
    if m:
        return _match_statement(f"I {p}", standing=standing, rated=rated, in_comment=False)
    return None


def _match_statement(part: str, *, standing: bool, rated: bool, in_comment: bool) -> _Draft | None:
    """Turn one first-person statement into a draft note, or None when it is not durable.

    The rule families are tried in order (instructions, team conventions, changes,
    preferences, biography, rating comments); the first whose rule applies answers,
    with a draft or with None (not durable). A workplace lead ("at my company, ...") is
    dropped after the instructions."""
    p = part.strip()
    answer = _instruction(p, standing, rated)
    if not isinstance(answer, _Next):
        return answer
    p = _without_workplace(p)
    for family in (
        lambda: _team(p, rated),
        lambda: _change(p),
        lambda: _preference(p, in_comment),
        lambda: _biography(p),
    ):
        answer = family()
        if not isinstance(answer, _Next):
            return answer
    if in_comment:
        return _rating_comment(p, standing, rated)
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
