"""Evidence features of the fused ranking (pure): rank-based fusion, session evidence, and
the question's cues (speaker and entity names, dates and time phrases) matched against the
candidates. :func:`~memory_pipelines.injection.fusion.fuse` calls them; every feature is
off at weight 0 (see :class:`~memory_pipelines.config.InjectConfig`).

The speaker, entity and date cues and their word lists were written while reading all
five LoCoMo dev conversations (:data:`memory_pipelines.bench.locomo_data.READ_WHILE_WRITING`):
a benchmark over those conversations gives an upper estimate of them, not a held-out one.
The role cue and the relative time windows (:data:`WRITTEN_UNREAD`) were written from a
description of user-assistant chats, without reading any conversation: every fold of the
dev conversations validates them."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache

from memory_pipelines.text import RETRIEVAL_STOPWORDS

# --------------------------------------------------------------------------- rank fusion


def ranks(scores: Mapping[str, float]) -> dict[str, int]:
    """1-based ranks by score descending, ties by id (deterministic)."""
    order = sorted(scores, key=lambda i: (-scores[i], i))
    return {i: r for r, i in enumerate(order, start=1)}


def rrf_base(
    cos: Mapping[str, float],
    bm: Mapping[str, float],
    *,
    floor: float,
    vector_weight: float,
    text_weight: float,
    k: float,
) -> dict[str, float]:
    """Weighted reciprocal-rank fusion, scaled so a first rank is worth 1:
    ``vector_weight * (k + 1) / (k + rank by cosine) + text_weight * (k + 1) / (k + rank by
    BM25)``. Only cosines at or above ``floor`` and positive BM25 scores are ranked; an
    item missing from a ranking gets nothing from it."""
    by_cos = ranks({i: c for i, c in cos.items() if c >= floor})
    by_bm = ranks({i: s for i, s in bm.items() if s > 0})
    out: dict[str, float] = {}
    for i in set(cos) | set(bm):
        v = (k + 1) / (k + by_cos[i]) if i in by_cos else 0.0
        t = (k + 1) / (k + by_bm[i]) if i in by_bm else 0.0
        out[i] = vector_weight * v + text_weight * t
    return out


# --------------------------------------------------------------------------- session evidence


def session_best(base: Mapping[str, float], groups: Iterable[list[str]]) -> dict[str, float]:
    """Each grouped candidate's session evidence: the best base score in its group (itself
    included)."""
    out: dict[str, float] = {}
    for members in groups:
        best = max(base[i] for i in members)
        for i in members:
            out[i] = best
    return out


# --------------------------------------------------------------------------- question cues

#: The cues written without reading any benchmark conversation (only from the description
#: of chat histories: ``user``/``assistant`` roles, questions about what either said, and
#: relative time phrases): the role cue (:func:`addressed_role`, :func:`role_of`) and the
#: relative time windows beyond LoCoMo's date style (:func:`time_windows`). The conversations
#: read while writing them: none.
WRITTEN_UNREAD: dict[str, frozenset[str]] = {
    "role": frozenset(),
    "time windows": frozenset(),
}

_SPEAKER = re.compile(r"^\s*([A-Z][\w.'-]*(?: [A-Z][\w.'-]*){0,2}):\s")
_NAME = re.compile(r"\b[A-Z][a-z]+(?:-[A-Z]?[a-z]+)*\b")
MONTHS = (
    "january february march april may june july august september october november december"
).split()
_MONTH = re.compile(r"\b(" + "|".join(m.capitalize() for m in MONTHS) + r")\b")
_YEAR = re.compile(r"\b(19\d\d|20\d\d)\b")
#: Question openings that ask for a time.
_ASKS_TIME = re.compile(
    r"\b(when|how long|what (?:year|month|day|date|time)|which (?:year|month|day)"
    # written from the description of chat questions (none read): durations and order
    r"|how many (?:days|weeks|months|years)|in what order"
    r"|which\b[^?]*\b(?:first|earlier|later|most recently))\b",
    re.I,
)
#: A turn that places something in time: a date, a weekday or a relative phrase.
_TIME_PHRASE = re.compile(
    r"\b(yesterday|today|tonight|tomorrow|ago|last|next|this (?:week|month|year|weekend)"
    r"|recently|since|weekend|(?:mon|tues|wednes|thurs|fri|satur|sun)day"
    r"|" + "|".join(MONTHS) + r"|19\d\d|20\d\d)\b",
    re.I,
)
#: Relative phrases of the question -> (unit, offset) from the clock's now.
_RELATIVE = {
    "yesterday": ("day", -1),
    "today": ("day", 0),
    "last week": ("week", -1),
    "this week": ("week", 0),
    "last month": ("month", -1),
    "this month": ("month", 0),
    "last year": ("year", -1),
    "this year": ("year", 0),
}


#: A turn recorded with its chat role: ``"user: ..."`` / ``"Assistant: ..."``.
_ROLE = re.compile(r"^\s*(user|assistant)\s*:", re.I)
#: A request put to the assistant ("can you remind me ...") is not a question about it.
_REQUEST = re.compile(
    r"\b(?:can|could|would|will)\s+you\s+(?:please\s+)?"
    r"(?:remind|tell|help|give|show|list|recall|remember|find|look|check|summari[sz]e)\b",
    re.I,
)
_SECOND_PERSON = re.compile(r"\b(?:you|your|yours|yourself)\b", re.I)
_FIRST_PERSON = re.compile(r"\b(?:I|[Mm][Ee]|[Mm][Yy]|[Mm]ine|[Mm]yself)\b")


@lru_cache(maxsize=65536)
def role_of(text: str) -> str | None:
    """``"user"`` or ``"assistant"`` when a turn's text starts with that role and a colon
    (the way a chat's turns are stored as notes), else None (cached)."""
    m = _ROLE.match(text)
    return m.group(1).lower() if m else None


def addressed_role(query: str) -> str | None:
    """Whose words a question asks about: ``"assistant"`` when it speaks of the assistant
    in the second person ("what did you recommend", "your suggestion", "you told me"),
    else ``"user"`` when it speaks in the first person ("I", "my"), else None. A request
    opening ("can you remind me ...") does not count as the second person."""
    rest = _REQUEST.sub(" ", query)
    if _SECOND_PERSON.search(rest):
        return "assistant"
    if _FIRST_PERSON.search(rest):
        return "user"
    return None


@lru_cache(maxsize=65536)
def speaker_of(text: str) -> str | None:
    """The ``"Speaker: "`` prefix of a turn's text (one to three capitalised words), or
    None. Cached: the same candidates come back query after query."""
    m = _SPEAKER.match(text)
    return m.group(1) if m else None


@lru_cache(maxsize=65536)
def places_in_time(text: str) -> bool:
    """Whether a text names a date, a weekday or a relative time phrase (cached)."""
    return _TIME_PHRASE.search(text) is not None


def names_in(text: str) -> set[str]:
    """Capitalised words of a text that are not stop or question words."""
    return {w for w in _NAME.findall(text) if w.lower() not in RETRIEVAL_STOPWORDS}


def _month_span(year: int, month: int) -> tuple[datetime, datetime]:
    start = datetime(year, month, 1, tzinfo=UTC)
    end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=UTC)
    return start, end


def _relative_span(unit: str, offset: int, now: datetime) -> tuple[datetime, datetime]:
    day = datetime(now.year, now.month, now.day, tzinfo=UTC)
    if unit == "day":
        start = day + timedelta(days=offset)
        return start, start + timedelta(days=1)
    if unit == "week":
        start = day - timedelta(days=day.weekday()) + timedelta(weeks=offset)
        return start, start + timedelta(weeks=1)
    if unit == "month":
        index = now.year * 12 + now.month - 1 + offset
        return _month_span(index // 12, index % 12 + 1)
    return (
        datetime(now.year + offset, 1, 1, tzinfo=UTC),
        datetime(now.year + offset + 1, 1, 1, tzinfo=UTC),
    )


_DAY = timedelta(days=1)
_WORD_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6,
    "seven": 7, "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12,
    "a couple of": 2, "a few": 3, "few": 3, "several": 3,
}  # fmt: skip
_COUNT = r"(\d{1,3}|" + "|".join(sorted(_WORD_NUMBERS, key=len, reverse=True)) + ")"
_UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}
#: How far either side of "N units ago" still counts: people round.
_TOLERANCE = {"day": 1, "week": 3, "month": 15, "year": 182}
_AGO = re.compile(rf"\b{_COUNT}\s+(day|week|month|year)s?\s+ago\b", re.I)
_PAST_SPAN = re.compile(rf"\b(?:past|last)\s+{_COUNT}\s+(day|week|month)s?\b", re.I)
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WEEKDAY = re.compile(
    r"\b(?:(next|last|this past|past|this|on)\s+)?(" + "|".join(_WEEKDAYS) + r")\b", re.I
)
_WEEKEND = re.compile(r"\b(last|this past|past|this|the)\s+weekend\b", re.I)
_ISO_DATE = re.compile(r"\b(\d{4})[-/](\d{1,2})[-/](\d{1,2})\b")


def _count(word: str) -> int:
    word = " ".join(word.lower().split())
    return int(word) if word.isdigit() else _WORD_NUMBERS.get(word, 0)


def time_windows(query: str, now: datetime | None) -> tuple[tuple[datetime, datetime], ...]:
    """The spans of time a question's relative expressions name, resolved against the
    question's time ``now`` (UTC; None: no windows), written for any chat rather than one
    data set's date style: "the day before yesterday", "N days/weeks/months/years ago"
    (words or digits; give or take a day, 3 days, 15 days, half a year), "the past N
    days/weeks/months" and "the past few days", a weekday ("last Saturday", "on Monday":
    the latest such day before today, this day when it is today; "next ..." is not in the
    past), the weekend ("last weekend": the latest Saturday to Monday before today), and an
    ISO date (2023-05-08 or 2023/05/08). Each span also takes the next day: a thing is told
    a little after it happens. Months, years and yesterday/last week/... are
    :meth:`Cues.of`'s (LoCoMo's date style)."""
    if now is None:
        return ()
    now = now.astimezone(UTC)
    today = datetime(now.year, now.month, now.day, tzinfo=UTC)
    out: list[tuple[datetime, datetime]] = []
    if re.search(r"\bday before yesterday\b", query, re.I):
        out.append((today - 2 * _DAY, today - _DAY))
    for m in _AGO.finditer(query):
        n, unit = _count(m.group(1)), m.group(2).lower()
        if n:
            point = today - timedelta(days=n * _UNIT_DAYS[unit])
            tol = timedelta(days=_TOLERANCE[unit])
            out.append((point - tol, point + tol + _DAY))
    for m in _PAST_SPAN.finditer(query):
        n = _count(m.group(1))
        if n:
            out.append((today - timedelta(days=n * _UNIT_DAYS[m.group(2).lower()]), today + _DAY))
    for m in _WEEKDAY.finditer(query):
        if (m.group(1) or "").lower() == "next":
            continue
        back = (today.weekday() - _WEEKDAYS.index(m.group(2).lower())) % 7
        if back == 0 and (m.group(1) or "").lower() in ("last", "this past", "past"):
            back = 7
        day = today - timedelta(days=back)
        out.append((day, day + _DAY))
    for _m in _WEEKEND.finditer(query):
        saturday = today - timedelta(days=(today.weekday() - 5) % 7 or 7)
        out.append((saturday, saturday + 2 * _DAY))
    for m in _ISO_DATE.finditer(query):
        try:
            day = datetime(int(m.group(1)), int(m.group(2)), int(m.group(3)), tzinfo=UTC)
        except ValueError:
            continue
        out.append((day, day + _DAY))
    return tuple((start, end + _DAY) for start, end in out)


def _as_utc(created: datetime) -> datetime:
    """A note's creation time in UTC (a naive one taken as UTC already)."""
    return created.astimezone(UTC) if created.tzinfo else created.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Cues:
    """What a question says about who and when: its capitalised names, the months and years
    it names, the spans its relative phrases resolve to (UTC, from the clock's ``now``),
    and whether it asks for a time."""

    names: frozenset[str]
    months: frozenset[int]
    years: frozenset[int]
    spans: tuple[tuple[datetime, datetime], ...]
    asks_time: bool
    windows: tuple[tuple[datetime, datetime], ...] = ()
    role: str | None = None

    @classmethod
    def of(cls, query: str, now: datetime | None) -> Cues:
        lowered = query.lower()
        spans = ()
        if now is not None:
            utc = now.astimezone(UTC)
            spans = tuple(
                _relative_span(unit, offset, utc)
                for phrase, (unit, offset) in _RELATIVE.items()
                if re.search(rf"\b{phrase}\b", lowered)
            )
        months = {MONTHS.index(m.lower()) + 1 for m in _MONTH.findall(query)}
        if "May" in _MONTH.findall(query) and not re.search(r"\bMay\s+\d|\d\s+May\b", query):
            # "May" is a month only beside a number; else the modal verb
            months.discard(5)
        names = names_in(query) - {m.capitalize() for m in MONTHS}
        return cls(
            names=frozenset(names),
            months=frozenset(months),
            years=frozenset(int(y) for y in _YEAR.findall(query)),
            spans=spans,
            asks_time=bool(_ASKS_TIME.search(query)),
            windows=time_windows(query, now),
            role=addressed_role(query),
        )

    @property
    def about_time(self) -> bool:
        """Whether the question says anything about time at all."""
        return bool(self.months or self.years or self.spans or self.asks_time)

    def time_match(self, created: datetime | None, text: str) -> float:
        """1 when the note's date falls in a month, year or span the question names (a
        named month matches its own month and the next, when people talk about it), or
        when the question asks for a time and the turn places something in time; else 0."""
        if created is not None and (self.months or self.years or self.spans):
            when = _as_utc(created)
            prev = 12 if when.month == 1 else when.month - 1
            in_month = not self.months or when.month in self.months or prev in self.months
            in_year = not self.years or when.year in self.years
            if (self.months or self.years) and in_month and in_year:
                return 1.0
            if any(start <= when < end for start, end in self.spans):
                return 1.0
        return 1.0 if self.asks_time and places_in_time(text) else 0.0

    def window_match(self, created: datetime | None) -> float:
        """1 when the note was created inside a span the question's relative expressions
        name (:func:`time_windows`; yesterday/last week/... are :meth:`time_match`'s),
        else 0."""
        if created is None or not self.windows:
            return 0.0
        when = _as_utc(created)
        return float(any(start <= when < end for start, end in self.windows))


def cue_boosts(
    query: str,
    now: datetime | None,
    *,
    speaker_weight: float,
    entity_weight: float,
    time_weight: float,
    text_of: Callable[[object], str],
    created_of: Callable[[object], datetime | None],
    role_weight: float = 0.0,
    time_window_weight: float = 0.0,
) -> Callable[[Mapping[str, object]], dict[str, float]] | None:
    """The hook :func:`~memory_pipelines.injection.fusion.fuse` multiplies into each
    candidate's base score (``final += base * boost``), or None when every weight is 0.

    Speaker: ``speaker_weight`` when the turn's speaker (:func:`speaker_of`) is named in
    the question. Entity: ``entity_weight`` times the share of the question's names that
    are not speakers of any candidate and appear capitalised in the turn's text. Names
    count only when some candidate has them as speaker or capitalised word. Time:
    ``time_weight`` times :meth:`Cues.time_match`. Role: ``role_weight`` when the turn's
    chat role (:func:`role_of`) is the one the question asks about (:func:`addressed_role`).
    Time window: ``time_window_weight`` times :meth:`Cues.window_match`."""
    if not (speaker_weight or entity_weight or time_weight or role_weight or time_window_weight):
        return None
    cues = Cues.of(query, now)
    if not (speaker_weight or entity_weight or time_weight) and not (
        (role_weight and cues.role) or (time_window_weight and cues.windows)
    ):
        return None

    def boosts(items: Mapping[str, object]) -> dict[str, float]:
        texts = {i: text_of(item) for i, item in items.items()}
        speakers = {i: speaker_of(t) for i, t in texts.items()}
        known = {s for s in speakers.values() if s}
        named_speakers = {s for s in known if set(s.split()) & cues.names}
        entities: set[str] = set()
        words: dict[str, set[str]] = {}
        if entity_weight and cues.names:
            words = {i: names_in(t) for i, t in texts.items()}
            seen = set().union(*words.values()) if words else set()
            entities = (cues.names & seen) - {w for s in known for w in s.split()}
        out: dict[str, float] = {}
        for i in items:
            b = 0.0
            if speaker_weight and speakers[i] in named_speakers:
                b += speaker_weight
            if entities:
                b += entity_weight * len(entities & words[i]) / len(entities)
            if time_weight and cues.about_time:
                b += time_weight * cues.time_match(created_of(items[i]), texts[i])
            if role_weight and cues.role and role_of(texts[i]) == cues.role:
                b += role_weight
            if time_window_weight:
                b += time_window_weight * cues.window_match(created_of(items[i]))
            out[i] = b
        return out

    return boosts
