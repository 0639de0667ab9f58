"""What one message costs note extraction: the offline judge's work grows linearly with
the number of statements (each new draft is compared only with the drafts it could
conflict with), and every judge call of the Memory Manager and of ``remember`` reads at
most ``max_judged_message_chars`` characters of a message. Work is counted, not timed."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest

from memory_pipelines.judge import ConversationMessage, OfflineJudge, judged_messages
from memory_pipelines.judge import offline as offline_module
from memory_pipelines.judge.clauses import _conflict_keys, _text_conflict
from memory_pipelines.limits import limits

SENT_AT = datetime(2024, 5, 1, 12, tzinfo=UTC)
STATEMENTS = [
    "I love hiking in the mountains.",
    "My favourite colour is blue.",
    "My favourite colour is green.",
    "I work as a nurse at the hospital.",
    "Please always answer in French.",
    "Please always answer in German.",
    "I moved to Berlin last year.",
    "I prefer tea over coffee.",
    "I prefer coffee over tea.",
    "My daughter plays the violin.",
    "I don't eat meat.",
    "I eat meat.",
    "We use Python 3.10 for the backend.",
    "We use Python 3.12 for the backend.",
    "I don't like spicy food.",
    "I like spicy food.",
    "The weather is nice today.",
    "I prefer Python over Java for scripts.",
    "I prefer Java over Python for scripts.",
    "I have a dog.",
    "I have two dogs and a cat.",
    "I need large fonts.",
    "I need small fonts.",
    "I use dark mode.",
    "I don't use dark mode.",
    "I like bar charts for sales data.",
    "I like line charts for sales data.",
    "Our team uses Postgres 15.",
    "Our team uses Postgres 16.",
    "I live in Berlin.",
    "I live in Paris.",
    "Actually, I prefer green tea.",
]


def message(text: str, mid: str = "m1") -> ConversationMessage:
    return ConversationMessage("user", text, message_id=mid, sent_at=SENT_AT)


def counting_conflicts(monkeypatch) -> list[int]:
    calls = [0]

    def counted(a: str, b: str):
        calls[0] += 1
        return _text_conflict(a, b)

    monkeypatch.setattr(offline_module, "_text_conflict", counted)
    return calls


def test_conflict_checks_grow_linearly_with_the_statements_of_a_message(monkeypatch):
    calls = counting_conflicts(monkeypatch)
    rng = random.Random(7)
    judge = OfflineJudge(None)
    for n in (100, 400):
        calls[0] = 0
        text = " ".join(rng.choice(STATEMENTS) for _ in range(n))
        judge.extract_notes([message(text)], [], rating_context="unrated")
        # each statement is compared with the few distinct texts it could conflict with;
        # comparing every pair of drafts took n * n / 2 (80,000 calls for 400 statements)
        assert calls[0] <= 3 * n


def reference_extract(judge: OfflineJudge, messages, rating_context: str, monkeypatch):
    """The extraction with the plain rule: every earlier draft is compared with a new one."""

    def add(self, d):
        self[:] = [x for x in self if _text_conflict(x.content, d.content) is None]
        self.append(d)

    with monkeypatch.context() as m:
        m.setattr(offline_module._Drafts, "add", add)
        return judge.extract_notes(messages, [], rating_context=rating_context)


@pytest.mark.parametrize("seed", range(16))
def test_the_indexed_drafts_decide_as_comparing_every_pair(seed, monkeypatch):
    rng = random.Random(seed)
    judge = OfflineJudge(None)
    messages = [
        message(" ".join(rng.choice(STATEMENTS) for _ in range(rng.randint(1, 30))), f"m{i}")
        for i in range(rng.randint(1, 4))
    ]
    context = rng.choice(["unrated", "positive"])
    got = judge.extract_notes(messages, [], rating_context=context)
    assert got == reference_extract(judge, messages, context, monkeypatch)
    assert len({c.content for c in got}) == len(got)


def test_texts_that_conflict_share_a_key():
    judge = OfflineJudge(None)
    notes = [
        c.content for s in STATEMENTS for c in judge.extract_notes([message(s)], [], rating_context="unrated")
    ]
    texts = [*STATEMENTS, *notes]
    conflicting = [(a, b) for a in texts for b in texts if _text_conflict(a, b)]
    assert len(conflicting) >= 24  # the fixture holds real conflicts, as said and as notes
    for a, b in conflicting:
        assert _conflict_keys(a) & _conflict_keys(b), (a, b)


def test_judged_messages_bound_each_message_and_keep_short_ones_as_they_are():
    bound = limits().max_judged_message_chars
    huge = "I like tea. " * 90_000 + "I prefer answers in metric units."  # ~1 MB
    short = ConversationMessage("user", "I'm vegetarian.", rating=5, rating_comment="x" * (bound + 9), message_id="s")
    shown = judged_messages([message(huge, "h"), short])
    assert [m.message_id for m in shown] == ["h", "s"]
    assert shown[0].text == huge[-bound:] and shown[0].text.endswith("metric units.")
    assert shown[1].text == "I'm vegetarian." and shown[1].rating == 5
    assert shown[1].rating_comment == "x" * bound
    kept = message("I like tea.")
    assert judged_messages([kept])[0] is kept


def test_judged_messages_total_keeps_the_latest_turns():
    msgs = [message("a" * 30, "1"), message("b" * 30, "2"), message("c" * 30, "3")]
    shown = judged_messages(msgs, total_chars=50)
    assert [(m.message_id, m.text) for m in shown] == [("2", "b" * 20), ("3", "c" * 30)]
    assert judged_messages(msgs, total_chars=30) == [msgs[2]]
    assert judged_messages([], total_chars=10) == []


def test_the_bound_is_a_limit_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("MEMORY_MAX_JUDGED_MESSAGE_CHARS", "10")
    assert judged_messages([message("I like green tea a lot.")])[0].text == "tea a lot."


def test_the_extraction_phase_reads_a_bounded_tail_of_a_huge_message(svc):
    svc.configure_agent("helper")
    real, shown = svc.judge, []

    class Counting:
        name = "counting"

        def __getattr__(self, attr):
            return getattr(real, attr)

        def extract_notes(self, messages, existing, *, rating_context):
            shown.append([len(m.text) for m in messages])
            return real.extract_notes(messages, existing, rating_context=rating_context)

    svc.judge = Counting()
    pasted = "The quick brown fox jumps over the lazy dog. " * 25_000  # 1.1 million characters
    svc.add_conversation("c1", "helper", "dana")
    svc.add_message("c1", "m1", "user", "My favourite colour is green.")
    svc.add_message("c1", "m2", "user", pasted + "I prefer answers in metric units.")
    svc.manager.extract_notes("mm-run")
    bound = limits().max_judged_message_chars
    assert shown == [[len("My favourite colour is green."), bound]]
    notes = set(svc.notes()["note"])
    assert {"User prefers answers in metric units.", "User's favourite colour is green."} <= notes
    rows = svc.sources.messages_of("c1")
    assert len(rows[1]["text"]) == len(pasted) + len("I prefer answers in metric units.")
