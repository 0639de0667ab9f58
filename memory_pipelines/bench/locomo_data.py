"""The LoCoMo data set: conversations, sessions, turns and questions, and the notes a
conversation becomes (one Active note per turn). Read by ``bench locomo`` and ``bench
extraction``."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from memory_pipelines.errors import ValidationError
from memory_pipelines.notes import AuthorType, Note, NoteStatus, NoteType, stable_id

AGENT_ID = "locomo-bench"


CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}

#: The LoCoMo conversations that were read while the hand-written parts were written: the
#: retrieval cues (:mod:`memory_pipelines.injection.evidence`), today's default
#: :class:`~memory_pipelines.config.InjectConfig` weights, and the offline judge's
#: extraction rules (:mod:`memory_pipelines.judge.life` and its lexicons). All five dev
#: conversations: a benchmark fold that holds one of them out does not give a held-out
#: estimate for those parts, only an upper one. A conversation outside this set (data
#: nobody here has read) is the honest test.
READ_WHILE_WRITING: frozenset[str] = frozenset(
    {"conv-26", "conv-30", "conv-41", "conv-42", "conv-43"}
)


_DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%I:%M%p on %d %B, %Y")


@dataclass(frozen=True)
class Turn:
    """One LoCoMo turn as it becomes a note."""

    dia_id: str
    session: int
    text: str
    created_at: datetime


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


def load_conversations(path: Path | str, limit: int | None = None) -> list[Conversation]:
    """Read a LoCoMo-format JSON file (a list of samples)."""
    data = json.loads(Path(path).read_text())
    convs = []
    for sample in data[: limit if limit else None]:
        sid = str(sample["sample_id"])
        c = sample["conversation"]
        turns: list[Turn] = []
        n = 1
        while f"session_{n}" in c:
            when = parse_session_date(c[f"session_{n}_date_time"])
            for t in c[f"session_{n}"] or []:
                text = f"{t['speaker']}: {t['text']}"
                if t.get("blip_caption"):
                    text += f" [shares photo: {t['blip_caption']}]"
                turns.append(Turn(str(t["dia_id"]), n, text, when))
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
