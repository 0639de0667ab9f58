"""The LoCoMo data set: conversations, sessions, turns and questions, and the notes a
conversation becomes (one Active note per turn). Read by ``bench locomo`` and ``bench
extraction``."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memory_pipelines.errors import ValidationError
from memory_pipelines.notes import AuthorType, Note, NoteStatus, NoteType, stable_id

AGENT_ID = "locomo-bench"


CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}

#: Formats of ``bench locomo --format``: the file as it is, or its chat view.
FORMATS = ("locomo", "chat")
#: The roles of the chat view, as ``remember`` and the proxy record a chat's messages.
USER, ASSISTANT = "user", "assistant"
#: The chat view joins the assistant side's turns of a session this many at a time (0: all
#: of a session's in one): about 640 characters from LoCoMo's ~125-character turns.
CHAT_JOIN = 5

#: The LoCoMo conversations that were read while the hand-written parts were written: the
#: retrieval cues (:mod:`memory_pipelines.injection.evidence`), today's default
#: :class:`~memory_pipelines.config.InjectConfig` weights, and the offline judge's
#: extraction rules (:mod:`memory_pipelines.judge.life` and its lexicons). All five dev
#: conversations: a benchmark fold that holds one of them out does not give a held-out
#: estimate for those parts, only an upper one. A conversation outside this set (data
#: nobody here has read) is the honest test. Not covered: the chat view
#: (:func:`chat_sample`, :func:`second_person`, :func:`time_probe_sample`) and the role and
#: relative-time cues (:data:`memory_pipelines.injection.evidence.WRITTEN_UNREAD`) were
#: written without reading any conversation (only the two speaker names of each file are
#: read, mechanically), so every fold validates those.
READ_WHILE_WRITING: frozenset[str] = frozenset(
    {"conv-26", "conv-30", "conv-41", "conv-42", "conv-43"}
)


_DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M%p on %d %B, %Y")


@dataclass(frozen=True)
class Turn:
    """One LoCoMo turn as it becomes a note. ``ids``: the evidence ids the note stands
    for when it joins several turns (the chat view's assistant turns); empty: its own."""

    dia_id: str
    session: int
    text: str
    created_at: datetime
    ids: tuple[str, ...] = ()

    @property
    def evidence_ids(self) -> tuple[str, ...]:
        return self.ids or (self.dia_id,)


@dataclass(frozen=True)
class Question:
    """One question of categories 1-4 and its normalised evidence ids."""

    sample_id: str
    text: str
    category: int
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]


def parse_session_date(text: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` -> an aware UTC datetime."""
    cleaned = " ".join(text.split())
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(cleaned, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    raise ValidationError(f"unparseable LoCoMo session date {text!r}")


_EVIDENCE = re.compile(r"^D:?(\d+):(\d+)$")


def normalise_evidence(raw: Sequence[str]) -> tuple[str, ...]:
    """Evidence ids as ``D<session>:<turn>``: ``"D:11:26" -> "D11:26"``, ``"D10:1; D10:2"``
    -> two ids; fragments that are not ids (``"D"``) are dropped; order kept, no repeats."""
    out: list[str] = []
    for item in raw:
        for part in re.split(r"[;,\s]+", str(item)):
            m = _EVIDENCE.match(part.strip())
            if m:
                ident = f"D{int(m.group(1))}:{int(m.group(2))}"
                if ident not in out:
                    out.append(ident)
    return tuple(out)


def load_conversations(
    path: Path | str,
    limit: int | None = None,
    *,
    format: str = "locomo",
    chat_join: int = CHAT_JOIN,
    time_probe: bool = False,
) -> list[Conversation]:
    """Read a LoCoMo-format JSON file (a list of samples); ``format="chat"``: its chat view
    (:func:`chat_sample`, assistant turns joined ``chat_join`` at a time); ``time_probe``:
    temporal questions with how long ago (:func:`time_probe_sample`)."""
    if format not in FORMATS:
        raise ValidationError(f"format must be one of {', '.join(FORMATS)}, got {format!r}")
    data = json.loads(Path(path).read_text())[: limit if limit else None]
    if format == "chat":
        data = [chat_sample(sample, chat_join) for sample in data]
    if time_probe:
        data = [time_probe_sample(sample) for sample in data]
    convs = []
    for sample in data:
        sid = str(sample["sample_id"])
        c = sample["conversation"]
        turns: list[Turn] = []
        n = 1
        while f"session_{n}" in c:
            when = parse_session_date(c[f"session_{n}_date_time"])
            for t in c[f"session_{n}"] or []:
                ids = tuple(str(i) for i in t.get("dia_ids", ()))
                turns.append(Turn(str(t["dia_id"]), n, f"{t['speaker']}: {_body(t)}", when, ids))
            n += 1
        questions = tuple(
            Question(
                sid,
                str(q["question"]),
                int(q["category"]),
                normalise_evidence(q.get("evidence", [])),
            )
            for q in sample.get("qa", [])
            if int(q.get("category", 0)) in CATEGORIES
        )
        convs.append(Conversation(sid, tuple(turns), questions))
    return convs


def turn_notes(conv: Conversation, agent_id: str = AGENT_ID) -> list[Note]:
    """The notes of one conversation (one user scope)."""
    return [
        Note(
            id=stable_id("locomo", conv.sample_id, t.dia_id, str(i)),
            agent_id=agent_id,
            user_id=conv.sample_id,
            note=t.text,
            type=NoteType.CONTEXT,
            status=NoteStatus.ACTIVE,
            author_type=AuthorType.USER,
            created_at=t.created_at,
            source_conversation_id=f"{conv.sample_id}/session_{t.session}",
            source_conversation_detail_id=t.dia_id,
        )
        for i, t in enumerate(conv.turns)
    ]


# --------------------------------------------------------------------------- the chat view


def _body(turn: Mapping[str, Any]) -> str:
    """A turn's text, with ``" [shares photo: caption]"`` when it has a caption."""
    text = str(turn["text"])
    return text + (f" [shares photo: {turn['blip_caption']}]" if turn.get("blip_caption") else "")


def chat_sample(sample: Mapping[str, Any], join: int = CHAT_JOIN) -> dict[str, Any]:
    """The chat view of one LoCoMo-format sample, a mechanical transform written from the
    description of a user-assistant chat benchmark, not from reading any conversation.

    The first speaker (``speaker_a``) becomes ``user`` and the other ``assistant``; in each
    session the assistant side's turns are joined ``join`` at a time into one long turn
    (0: all of the session's), placed where the first of them was, whose ``dia_ids`` are
    the union of theirs (LoCoMo's speakers alternate, so the user turns between them stay
    turns of their own); captions become part of the text. In the questions the first
    speaker's name becomes I/me/my and the other's you/your (:func:`second_person`). Every
    turn keeps its session's date. Returns a LoCoMo-format sample."""
    if join < 0:
        raise ValidationError(f"join must be 0 (a whole session) or more, got {join!r}")
    c = sample["conversation"]
    user, assistant = str(c["speaker_a"]), str(c["speaker_b"])
    conv: dict[str, Any] = {"speaker_a": USER, "speaker_b": ASSISTANT}
    n = 1
    while f"session_{n}" in c:
        conv[f"session_{n}_date_time"] = c[f"session_{n}_date_time"]
        turns: list[dict[str, Any]] = []
        block: dict[str, Any] | None = None
        for t in c[f"session_{n}"] or []:
            dia, text = str(t["dia_id"]), _body(t)
            if t["speaker"] == user:
                turns.append({"speaker": USER, "dia_id": dia, "text": text})
            elif block is not None and (join == 0 or len(block["dia_ids"]) < join):
                block["text"] += " " + text
                block["dia_ids"].append(dia)
            else:
                block = {"speaker": ASSISTANT, "dia_id": dia, "text": text, "dia_ids": [dia]}
                turns.append(block)
        conv[f"session_{n}"] = turns
        n += 1
    qa = [
        {**q, "question": second_person(str(q["question"]), user, assistant)}
        for q in sample.get("qa", [])
    ]
    return {"sample_id": sample["sample_id"], "conversation": conv, "qa": qa}


#: Words after which a name is the subject of its clause ("did Ann go" -> "did I go").
_SUBJECT_AFTER = frozenset(
    "did does do is was were has have had would will can could should might may must "
    "when where what why how who which and or that if since before after while because "
    "but".split()
)
#: Verb agreement once a name became I/you: ``(wrong, right)`` in lower case.
_AGREEMENT = (
    ("i is", "i am"), ("is i", "am i"), ("i has", "i have"), ("has i", "have i"),
    ("i does", "i do"), ("does i", "do i"), ("you is", "you are"), ("is you", "are you"),
    ("you was", "you were"), ("was you", "were you"), ("you has", "you have"),
    ("has you", "have you"), ("you does", "you do"), ("does you", "do you"),
)  # fmt: skip


def second_person(question: str, user: str, assistant: str) -> str:
    """A question about two named speakers as the user asks it of the assistant: ``user``'s
    name becomes I / me (after a preposition or verb) / my (possessive), ``assistant``'s
    you / your; a verb right beside the new pronoun agrees with it ("Is Ann" -> "Am I").
    Mechanical: other verbs ("Ann likes" -> "I likes") are left as they are."""
    names = {user: ("I", "me", "my"), assistant: ("you", "you", "your")}
    alternatives = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
    pattern = re.compile(rf"\b({alternatives})(['\u2019]s\b|(?<=s)')?(?![\w'])")

    def swap(m: re.Match[str]) -> str:
        subject, obj, possessive = names[m.group(1)]
        before = question[: m.start()].rstrip()
        previous = re.findall(r"[\w']+$", before)
        if m.group(2):
            word = possessive
        elif (
            not before
            or before[-1] in ".?!"
            or (previous and previous[0].lower() in _SUBJECT_AFTER)
        ):
            word = subject
        else:
            word = obj
        if word != "I" and (not before or before[-1] in ".?!"):
            word = word.capitalize()
        return word

    out = pattern.sub(swap, question)
    for wrong, right in _AGREEMENT:
        out = re.sub(
            rf"\b{wrong}\b",
            lambda m, right=right: _same_case(m.group(0), right),
            out,
            flags=re.I,
        )
    return out


def _same_case(found: str, replacement: str) -> str:
    """``replacement`` with ``found``'s first-letter case ("I" stays capital)."""
    words = replacement.split()
    words = ["I" if w == "i" else w for w in words]
    if found[:1].isupper():
        words[0] = words[0][:1].upper() + words[0][1:]
    return " ".join(words)


def time_probe_sample(sample: Mapping[str, Any]) -> dict[str, Any]:
    """A probe of the relative time windows (``bench locomo --time-probe``): every temporal
    question (category 2) that starts with "When" and whose evidence lies in one session
    gets ", about N days/weeks/months/years ago" from the last session (the question's
    time) back to that session: "When did I go to the group?" -> "When did I go to the
    group, about 3 weeks ago?". Mechanical; the phrase is right by construction, as a user
    who remembers roughly when would say it, so the figures measure what the window cue
    does with an accurate phrase, not how often users give one."""
    c = sample["conversation"]
    dates: dict[int, datetime] = {}
    n = 1
    while f"session_{n}" in c:
        dates[n] = parse_session_date(c[f"session_{n}_date_time"])
        n += 1
    if not dates:
        return dict(sample)
    asked = max(dates.values())
    qa = []
    for q in sample.get("qa", []):
        text = str(q["question"])
        sessions = {int(i[1:].split(":")[0]) for i in normalise_evidence(q.get("evidence", []))}
        if (
            int(q.get("category", 0)) == 2
            and text.lower().startswith("when ")
            and len(sessions) == 1
        ):
            (session,) = sessions
            if session in dates:
                phrase = _ago((asked - dates[session]).days)
                if phrase:
                    q = {**q, "question": f"{text.rstrip(' ?')}, about {phrase}?"}
        qa.append(q)
    return {**sample, "qa": qa}


def _ago(days: int) -> str | None:
    """``days`` as a person would round it: "3 days ago", "2 weeks ago", "5 months ago"."""
    if days < 1:
        return None
    if days < 14:
        n, unit = days, "day"
    elif days < 60:
        n, unit = round(days / 7), "week"
    elif days < 730:
        n, unit = round(days / 30), "month"
    else:
        n, unit = round(days / 365), "year"
    return f"{n} {unit}{'s' if n != 1 else ''} ago"


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every LoCoMo benchmark takes: the file, the ks, how many conversations,
    the embedder and its cache."""
    parser.add_argument("--data", required=True, help="LoCoMo-format JSON file")
    parser.add_argument("--k", type=int, nargs="+", default=[5, 10])
    parser.add_argument("--limit-conversations", type=int, default=None)
    parser.add_argument(
        "--embedder",
        choices=("minilm", "hash"),
        default="minilm",
        help="hash: the non-semantic test embedder (fast smoke runs only)",
    )
    parser.add_argument(
        "--embedding-cache",
        default=None,
        help="SQLite file to reuse embeddings between runs (default: none)",
    )
