"""Durable first-person facts about a person's life, for the offline judge.

What someone says about their own life in conversation: a dated event ("I went to a
support group yesterday"), what they are doing or planning ("I'm starting a dance
studio", "I'm going to run a marathon"), a habit or passion ("I've been painting since
college"), family, pets and health constraints ("my kids love hiking", "I'm allergic to
nuts"). Each rule family has a name (:data:`LIFE_FAMILIES`) so a benchmark can measure and
keep each one on conversations it was not written from. Relative dates are resolved from
the message time (:func:`resolve_dates`): "yesterday" in a message of 8 May 2023 becomes
"on 7 May 2023". Small talk, feelings and reactions are not facts and match nothing.

These rules (and the lexicons they use) were written while reading all five LoCoMo dev
conversations (:data:`memory_pipelines.bench.locomo_data.READ_WHILE_WRITING`): a
benchmark over those conversations gives an upper estimate of the rules, not a held-out
one, whatever its folds.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

#: rule family -> what it keeps
LIFE_FAMILIES: dict[str, str] = {
    "dated_event": "a past event of the speaker's life, with its date when the text gives one",
    "ongoing": "what the speaker is doing now or working towards",
    "plan": "what the speaker plans or intends to do",
    "habit": "what the speaker has done for a while or does regularly",
    "family": "the speaker's family members and what they do",
    "pet": "the speaker's pets",
    "health": "allergies, diets and injuries the speaker states",
}

_MONTHS = (
    "January February March April May June July August September October November December"
).split()
_WEEKDAYS = "monday tuesday wednesday thursday friday saturday sunday".split()


def _day(d: datetime) -> str:
    return f"{d.day} {_MONTHS[d.month - 1]} {d.year}"


def _month(year: int, month: int) -> str:
    year, month = year + (month - 1) // 12, (month - 1) % 12 + 1
    return f"{_MONTHS[month - 1]} {year}"


_RELATIVE = re.compile(
    r"\b(?:(?:earlier )?today|this (?:morning|afternoon|evening)|tonight|yesterday|last night|"
    r"tomorrow|(?:last|this past|past) (?:week|weekend|month|year)|(?:next) (?:week|weekend|month|"
    r"year)|a (?:week|month|year) ago|(?:last|this past) (?:monday|tuesday|wednesday|thursday|"
    r"friday|saturday|sunday|mon|tue|tues|wed|thu|thurs|fri|sat|sun)|(?:two|2|a couple of|a few) (?:days|weeks) ago)\b",
    re.I,
)


def resolve_dates(text: str, when: datetime | None) -> str:
    """``text`` with relative time phrases replaced by dates counted from ``when``;
    unchanged without ``when``."""
    if when is None:
        return text

    def repl(m: re.Match[str]) -> str:
        p = m.group(0).lower()
        if (
            p in ("today", "earlier today", "tonight")
            or p.startswith("this ")
            and p.endswith(("morning", "afternoon", "evening"))
        ):
            return f"on {_day(when)}"
        if p in ("yesterday", "last night"):
            return f"on {_day(when - timedelta(days=1))}"
        if p == "tomorrow":
            return f"on {_day(when + timedelta(days=1))}"
        if p.endswith("week") and not p.startswith("next"):
            return f"in the week before {_day(when)}"
        if p == "a week ago":
            return f"around {_day(when - timedelta(days=7))}"
        if p.endswith("weekend"):
            return (
                "on the weekend after " if p.startswith("next") else "on the weekend before "
            ) + _day(when)
        if p == "next week":
            return f"in the week after {_day(when)}"
        if p.endswith("month") and p != "a month ago":
            return "in " + _month(when.year, when.month + (1 if p.startswith("next") else -1))
        if p == "a month ago":
            return "in " + _month(when.year, when.month - 1)
        if p.endswith("year") or p == "a year ago":
            return f"in {when.year + (1 if p.startswith('next') else -1)}"
        if p.endswith("ago"):
            n = 2 if p.startswith(("two", "2", "a couple")) else 3
            unit = 7 if "week" in p else 1
            return f"around {_day(when - timedelta(days=n * unit))}"
        day = p.split()[-1]
        found = [i for i, name in enumerate(_WEEKDAYS) if name.startswith(day)]
        if found:
            back = (when.weekday() - found[0]) % 7 or 7
            return f"on {_day(when - timedelta(days=back))}"
        return m.group(0)

    return _RELATIVE.sub(repl, text)


def has_relative_date(text: str) -> bool:
    return _RELATIVE.search(text) is not None


_CASUAL = (
    (re.compile(r"\bgonna\b", re.I), "going to"),
    (re.compile(r"\bwanna\b", re.I), "want to"),
    (re.compile(r"\bgotta\b", re.I), "have to"),
    (re.compile(r"\b(\w+)in'(?=\s|$)", re.I), r"\1ing"),
    (re.compile(r"\bcuz\b|'cause\b", re.I), "because"),
)

#: Past-tense verbs of life events (a story about something that happened to the speaker).
_EVENT_VERBS = (
    "went|visited|attended|joined|started|began|finished|completed|graduated|won|lost|bought|"
    "adopted|got|received|took|signed up|enrolled|volunteered|ran|hiked|traveled|travelled|"
    "moved|launched|opened|founded|painted|made|created|built|wrote|published|performed|"
    "played|organized|organised|hosted|threw|celebrated|married|met|quit|left|retired|"
    "applied|passed|failed|broke|injured|hurt|sprained|donated|raised|taught|learned|learnt|"
    "discovered|read|watched|saw|baked|cooked|camped|competed|entered|landed|rehearsed|"
    "decided|tried|set up|put together|picked up|gave|had|climbed|swam|surfed|flew|drove|"
    "returned|spent|found|named|shut down|closed|sold|renovated|redid|fixed|planted|grew|"
    "recorded|released|designed|signed|earned|cleared|gained|passed"
)
_EVENT = re.compile(
    rf"^i (?:just |recently |finally |also |actually |even |once |already )*({_EVENT_VERBS}) (.+)$",
    re.I,
)
_EVENT_NO_SUBJECT = re.compile(rf"^(?:just )?({_EVENT_VERBS}) (?=my |a |an |the |to |back )", re.I)
_PERFECT = re.compile(
    r"^i have (?:just |recently |finally |also |already )*(been to|been into|been (?:\w+ing)|started|"
    r"finished|joined|taken|got|gotten|adopted|bought|made|done|completed|signed up|"
    r"decided|learned|learnt|found|begun|won|lost|had|become|built|written|painted|"
    r"published|launched|opened|volunteered|visited|attended|moved|enrolled) (.+)$",
    re.I,
)
_ONGOING = re.compile(
    r"^i am (?:now |currently |still |also |really |actually |busy |even )*"
    r"(starting|working|planning|preparing|learning|taking|training|practicing|practising|"
    r"volunteering|writing|building|looking for|searching for|saving|organizing|organising|"
    r"teaching|studying|running|expanding|attending|doing|getting ready|getting into|"
    r"trying|hoping|launching|opening|creating|making|setting up|renovating|painting|"
    r"reading|raising|coaching|mentoring|applying|competing|rehearsing|developing|"
    r"designing|recording|playing|into|part of|involved in|passionate about|a member of|"
    r"in the middle of|on the hunt for|focusing on|focused on|keen on|determined to|"
    r"going to|excited to|excited about|about to|thinking of) (.+)$",
    re.I,
)
_PLAN = re.compile(
    r"^i (?:really )?(?:plan to|am planning to|intend to|hope to|aim to|want to|"
    r"have decided to|decided to|am hoping to|am set on|am aiming to) (.+)$",
    re.I,
)
_HABIT = re.compile(
    r"^i (?:usually |often |regularly |always |still |also |really |just )*"
    r"(practice|practise|teach|volunteer|run|paint|play|go|rehearse|train|work out|cook|bake|"
    r"write|read|hike|swim|dance|sing|draw|collect|garden|meditate|journal|travel|"
    r"attend|coach|mentor|ride|camp|fish|knit|sew|study|do|spend|make|keep) (.+)$",
    re.I,
)
_FAMILY_NOUNS = (
    "husband|wife|kids?|children|child|sons?|daughters?|mom|mum|mother|dad|father|parents|"
    "family|brother|sisters?|brothers|siblings?|grandma|grandmother|grandpa|grandfather|"
    "grandparents|grandkids|grandchildren|partner|boyfriend|girlfriend|fianc[eé]e?|spouse|"
    "aunt|uncle|cousins?|niece|nephew|in-laws"
)
_FAMILY = re.compile(rf"^(my (?:\w+ )?(?:{_FAMILY_NOUNS})) (.+)$", re.I)
_PET = re.compile(
    r"^(my (?:\w+ )?(?:dogs?|cats?|pup|puppy|puppies|kittens?|pets?|horses?|rabbits?|"
    r"bunny|hamsters?|parrots?|birds?|fish|turtles?|snakes?|guinea pigs?)) (.+)$",
    re.I,
)
_PET_HAVE = re.compile(
    r"^i (?:have|have got|got|adopted) (?:a|an|two|three|\d+) (?:\w+ )?(dogs?|cats?|pup|puppy|"
    r"puppies|kittens?|pets?|horses?|rabbits?|bunny|hamsters?|parrots?|birds?|turtles?)\b(.*)$",
    re.I,
)
_HEALTH = re.compile(
    r"^i (?:am (?:allergic to|lactose intolerant|vegan|vegetarian|gluten[- ]free|on a diet|"
    r"recovering from)|(?:can not|do not|never) (?:eat|drink|have) |have (?:an? )?"
    r"(?:allergy|injury|bad back|knee injury)|(?:broke|injured|hurt|sprained) my )(.*)$",
    re.I,
)
#: Verbs after "my <family>" that are a fact about them, not a passing reaction.
_FACT_PREDICATE = re.compile(
    r"^(?:and i |and me )?(?:is|are|was|were|has|have|had|just|recently|also|still|"
    r"loves?|likes?|enjoys?|plays?|works?|lives?|goes|go|went|got|started|joined|turned|"
    r"graduated|moved|adopted|passed|took|takes|learned|learns|visited|does|did|"
    r"made|makes|built|won|lost|bought|came|comes|called)\b",
    re.I,
)
#: Objects that make an event a reaction to the conversation or a passing moment.
_VAGUE_OBJECT = re.compile(
    r"^(?:it|this|that|these|those|them|you|your|so|too|to (?:say|hear|see|know|ask)|"
    r"a (?:lot|chance|feeling|sec|second|minute|moment|look|break|bit)|what|how|why|"
    r"some (?:time|rest)|(?:very |so |really )?(?:much|many|lucky|good|great|nice|cool|fun)\b|"
    r"back to you|the (?:pic|photo|picture)|here|there|one|myself|used to it|"
    r"excited|happy|sad|glad|sorry|tired|sure|ready|nervous|stressed|thankful|grateful|"
    r"a ton|tons|loads)\b",
    re.I,
)
_FEELING_ONGOING = re.compile(
    r"^(?:doing (?:well|good|great|fine|ok|okay|alright|better)|trying (?:my best|to (?:stay|keep|be))|"
    r"looking forward|thinking about you|hoping for the best)\b",
    re.I,
)


def casual(text: str) -> str:
    """Spoken forms read as written ones: "gonna" -> "going to", "'cause" -> "because"."""
    for pattern, repl in _CASUAL:
        text = pattern.sub(repl, text)
    return text


def _substantive(rest: str, min_words: int = 2) -> bool:
    words = re.findall(r"[A-Za-z0-9']+", rest)
    return len(words) >= min_words and not _VAGUE_OBJECT.match(rest.strip())


#: A rest that talks to or about the other speaker, or only encourages: not a fact.
_ADDRESSEE = re.compile(
    r"\b(?:you|your|yours|ya|u)\b|^(?:keep|not|never|do my best|give up)\b|^going to keep\b",
    re.I,
)


def match_life(part: str) -> tuple[str, str, str] | None:
    """(family, subject phrase, rest) of a first-person life statement, or None.

    The subject phrase is what the note starts with ("User went", "User's kids"); the
    rest is still in the first person (the caller turns it to the third person)."""
    found = _match_life(part)
    if found is None or _ADDRESSEE.search(found[2]) or _ADDRESSEE.search(found[1][5:]):
        return None
    return found


def _match_life(part: str) -> tuple[str, str, str] | None:
    """(family, subject phrase, rest) of a first-person life statement, or None.

    The subject phrase is what the note starts with ("User went", "User's kids"); the
    rest is still in the first person (the caller turns it to the third person)."""
    p = casual(part.strip()).rstrip(" .!")
    if m := _EVENT_NO_SUBJECT.match(p):
        p = "I " + p
    if m := _HEALTH.match(p):
        head = p[: m.start(1)] if m.group(1) else p
        return "health", "User " + _third(head[2:].strip()), m.group(1)
    if m := _PET_HAVE.match(p):
        verb = re.match(r"^i (have got|have|got|adopted) ", p, re.I)
        assert verb is not None
        head = verb.group(1).lower()
        return "pet", "User " + ("has" if head.startswith("have") else head), p[verb.end() :]
    if m := _PET.match(p):
        if _FACT_PREDICATE.match(m.group(2)) and _substantive(m.group(2)):
            return "pet", "User's " + m.group(1)[3:], m.group(2)
        return None
    if m := _FAMILY.match(p):
        if _FACT_PREDICATE.match(m.group(2)) and _substantive(m.group(2)):
            return "family", "User's " + m.group(1)[3:], m.group(2)
        return None
    if m := _EVENT.match(p):
        if _substantive(m.group(2)):
            return "dated_event", f"User {m.group(1).lower()}", m.group(2)
        return None
    if m := _PERFECT.match(p):
        if _substantive(m.group(2), 1):
            return (
                "habit"
                if m.group(1).lower().startswith("been ")
                and not m.group(1).lower().startswith("been to")
                else "dated_event",
                f"User has {m.group(1).lower()}",
                m.group(2),
            )
        return None
    if m := _PLAN.match(p):
        if _substantive(m.group(1)) and not re.match(
            r"^(?:see|hear|know|say|thank)\b", m.group(1), re.I
        ):
            verb = p[2 : m.start(1)].strip()
            return "plan", "User " + _third(verb), m.group(1)
        return None
    if m := _ONGOING.match(p):
        rest = m.group(2)
        if _FEELING_ONGOING.match(f"{m.group(1)} {rest}") or not _substantive(rest, 1):
            return None
        return "ongoing", f"User is {m.group(1).lower()}", rest
    if m := _HABIT.match(p):
        if _substantive(m.group(2)):
            return "habit", "User " + _third(p[2 : m.start(2)].strip()), m.group(2)
    return None


def _third(verb_phrase: str) -> str:
    """'am planning to' -> 'is planning to', 'plan to' -> 'plans to', 'will' -> 'will'."""
    words = verb_phrase.split()
    if not words:
        return verb_phrase
    fixed = {"am": "is", "have": "has", "do": "does", "go": "goes", "can": "can"}
    for i, w in enumerate(words):
        low = w.lower()
        if low in ("really", "usually", "often", "regularly", "always", "still", "also", "just"):
            continue
        if low in fixed:
            words[i] = fixed[low]
        elif low in ("will", "would", "can", "could"):
            pass
        elif re.search(r"(?:s|sh|ch|x|z|o)$", low):
            words[i] = w + "es"
        elif re.search(r"[^aeiou]y$", low):
            words[i] = w[:-1] + "ies"
        else:
            words[i] = w + "s"
        break
    return " ".join(words)


_AGREEMENT = (
    (re.compile(r"\bthey was\b"), "they were"),
    (re.compile(r"\bthey has\b"), "they have"),
    (re.compile(r"\bthey is\b"), "they are"),
    (re.compile(r"\bthey does\b"), "they do"),
)


def agree(text: str) -> str:
    """Fix the verb agreement that the pronoun swap leaves ("they was" -> "they were")."""
    for pattern, repl in _AGREEMENT:
        text = pattern.sub(repl, text)
    return text
