"""The Memory Manager cycle phases, called directly: extraction (notes, failed runs,
examples), dedupe and merge revocation, hardening, the injection fold, the cycle record
and the sensor signal. A scripted judge stands in for the LLM; ``svc_real`` tests use the
real embedder where dedupe semantics matter."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta

import pytest
from factories import add_events
from sqlalchemy import select

from memory_pipelines import MemoryService
from memory_pipelines.config import ManagerConfig
from memory_pipelines.errors import ConfigError, JudgeError
from memory_pipelines.judge import (
    CandidateExample,
    CandidateNote,
    ConversationMessage,
    DedupeDecision,
)
from memory_pipelines.notes import Note
from memory_pipelines.phases import hardening
from memory_pipelines.phases.cycle import LAST_CYCLE_AT, CycleError
from memory_pipelines.phases.fold import FOLD_CURSOR, FOLD_PENDING
from memory_pipelines.phases.mining import failure_thread
from memory_pipelines.phases.reports import PhaseReport
from memory_pipelines.sources import Sources, manager_runs


@dataclass
class ScriptedJudge:
    """Proposes the notes scripted for a message text; decides dedupe by a rule."""

    name: str = "scripted"
    notes: dict[str, list[CandidateNote]] = field(default_factory=dict)
    examples: dict[str, list[CandidateExample]] = field(default_factory=dict)
    failure_notes: list[CandidateNote] = field(default_factory=list)
    fail_extract: bool = False
    #: extraction fails for any batch holding one of these texts (a "poison" conversation)
    fail_texts: set[str] = field(default_factory=set)
    dedupe_error: bool = False
    duplicate: bool = True
    calls: list[tuple] = field(default_factory=list)

    def extract_notes(
        self, messages: Sequence[ConversationMessage], existing, *, rating_context: str
    ):
        self.calls.append(
            (
                "notes",
                tuple(m.text for m in messages),
                rating_context,
                tuple(n.id for n in existing),
            )
        )
        if self.fail_extract or self.fail_texts & {m.text for m in messages}:
            raise JudgeError("model timed out")
        out = []
        for m in messages:
            out += [replace(c, source_message_id=m.message_id) for c in self.notes.get(m.text, [])]
        if rating_context == "failure":
            out += self.failure_notes
        return out

    def extract_examples(self, messages, existing):
        self.calls.append(("examples", tuple(m.text for m in messages)))
        if self.fail_extract or self.fail_texts & {m.text for m in messages}:
            raise JudgeError("model timed out")
        out = []
        for m in messages:
            out += [
                replace(c, source_message_id=m.message_id) for c in self.examples.get(m.text, [])
            ]
        return out

    def is_duplicate(self, candidate: str, matches: Sequence[Note]) -> DedupeDecision:
        self.calls.append(("dedupe", candidate, tuple(n.id for n in matches)))
        if self.dedupe_error:
            raise JudgeError("malformed JSON from the model")
        return DedupeDecision(
            not self.duplicate, "same fact" if self.duplicate else "adds information"
        )

    def synthesize_cluster(self, notes, *, anchored):  # pragma: no cover - not used by the cycle
        raise JudgeError("not scripted")

    def detect_contradiction(self, a, b):  # pragma: no cover - not used by the cycle
        raise JudgeError("not scripted")


def cand(content: str, type: str = "Preference", confidence: float = 90, **kw) -> CandidateNote:
    return CandidateNote(content=content, type=type, confidence=confidence, **kw)


@pytest.fixture
def judge() -> ScriptedJudge:
    return ScriptedJudge()


@pytest.fixture
def msvc(judge, open_service):
    """A service whose judge is the scripted one (cheap hashing embedder)."""
    with open_service(llm=judge) as s:
        s.add_company("acme")
        s.add_user("alice", "acme")
        s.add_user("bob", "acme")
        s.configure_agent("helper")
        yield s


def say(
    svc: MemoryService, conv: str, text: str, *, rating: int | None = None, user: str = "alice"
) -> str:
    if svc.sources.get_conversation(conv) is None:
        svc.add_conversation(conv, "helper", user)
    mid = f"{conv}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"
    svc.add_message(conv, mid, "user", text, rating=rating)
    return mid


def steps(svc: MemoryService, run_id: str) -> list[str]:
    return [s["step_name"] for s in svc.sources.steps(run_id)]


# --------------------------------------------------------------------------- extraction


def test_extract_creates_scoped_active_notes_with_provenance(msvc, judge):
    judge.notes["I prefer tea. Our team uses Postgres. Always cite sources."] = [
        cand("User prefers tea over coffee", scope_level="user"),
        cand("The team uses PostgreSQL 16", type="Context", scope_level="company"),
        cand("Always cite sources in answers", type="Constraint", scope_level="global"),
        cand("User may like cake", confidence=60),  # below 80
        cand("short", confidence=95),  # under 10 chars
        cand("Some unknown typed thing here", type="Opinion"),
    ]
    mid = say(msvc, "c1", "I prefer tea. Our team uses Postgres. Always cite sources.", rating=9)
    msvc.add_agent_run("run-1", "helper", user_id="alice", company_id="acme", conversation_id="c1")

    report = msvc.manager.extract_notes("mm-run")

    assert report["notesCreated"] == 3 and report["rawNoteCount"] == 6
    assert report["notesFiltered_lowConfidence"] == 1 and report["notesFiltered_tooShort"] == 1
    assert report["notesFiltered_invalidType"] == 1
    assert judge.calls[0][2] == "positive"
    notes = {n.note: n for n in msvc.store.notes.all()}
    tea = notes["User prefers tea over coffee"]
    assert (tea.agent_id, tea.user_id, tea.company_id) == ("helper", "alice", "acme")
    assert tea.status == "Active" and tea.author_type == "MemoryManager" and tea.is_auto_generated
    assert tea.access_count == 1 and tea.protection_tier == "Standard"
    assert (tea.source_conversation_id, tea.source_conversation_detail_id, tea.source_run_id) == (
        "c1",
        mid,
        "run-1",
    )
    team = notes["The team uses PostgreSQL 16"]
    assert (team.agent_id, team.user_id, team.company_id) == ("helper", None, "acme")
    glob = notes["Always cite sources in answers"]
    assert (glob.agent_id, glob.user_id, glob.company_id) == ("helper", None, None)
    assert steps(msvc, "mm-run") == [
        "Load Conversations With New Activity",
        "Load High-Value Agent Runs",
        "Load Instructive Failed Agent Runs",
        "Extract Notes from Conversations",
        "Deduplicate Note Candidates",
        "Create Note Records",
    ]
    assert {c["action"] for c in report.changed} == {"created"}


def test_conversation_messages_are_mined_once(msvc, judge, clock):
    judge.notes["I prefer green tea in the morning"] = [
        cand("User prefers green tea in the morning")
    ]
    say(msvc, "c1", "I prefer green tea in the morning", rating=9)
    assert msvc.manager.extract_notes()["notesCreated"] == 1
    clock.advance(minutes=1)
    again = msvc.manager.extract_notes()
    assert again["conversationsProcessed"] == 0 and again["notesCreated"] == 0
    assert [c for c in judge.calls if c[0] == "notes"] == [judge.calls[0]]

    clock.advance(minutes=1)
    say(msvc, "c1", "Also, never schedule meetings on Friday")
    msvc.manager.extract_notes()
    last = [c for c in judge.calls if c[0] == "notes"][-1]
    assert last[1] == ("Also, never schedule meetings on Friday",)  # only the new message
    assert last[2] == "unrated"
    assert len(msvc.store.notes.all()) == 1


def test_rating_context_classes(msvc, judge):
    say(msvc, "neg", "The answer was wrong", rating=2)
    say(msvc, "mid", "Meh", rating=5)
    say(msvc, "hv", "Thanks for the report", user="bob")
    msvc.add_agent_run(
        "run-hv", "helper", user_id="bob", conversation_id="hv", artifact_share_count=2
    )
    msvc.manager.extract_notes()
    contexts = {c[1][0]: c[2] for c in judge.calls if c[0] == "notes"}
    assert contexts == {
        "The answer was wrong": "negative",
        "Meh": "unrated",
        "Thanks for the report": "positive",
    }


def test_only_agents_using_memory_are_mined(msvc, judge):
    msvc.configure_agent("quiet", inject_notes=False, inject_examples=False)
    msvc.add_conversation("cq", "quiet", "alice")
    msvc.add_message("cq", "cq-1", "user", "I prefer tabs over spaces", rating=9)
    msvc.configure_agent("helper", status="Inactive")
    report = msvc.manager.extract_notes("r")
    assert report.extra["message"].startswith("No agents have note/example injection enabled")
    assert judge.calls == []


def test_judge_failure_keeps_the_conversation_for_the_next_cycle(msvc, judge, clock):
    judge.notes["I prefer short answers"] = [cand("User prefers short answers")]
    say(msvc, "c1", "I prefer short answers", rating=9)
    judge.fail_extract = True
    failed = msvc.manager.extract_notes("r1")
    assert failed["noteJudgeFailures"] == 1 and failed["notesCreated"] == 0
    assert msvc.store.notes.count() == 0
    judge.fail_extract = False
    clock.advance(hours=2)  # far past the activity window: the watermark held back
    assert msvc.manager.extract_notes("r2")["notesCreated"] == 1


POISON = "Here is the whole 400-page manual, summarise it " + "x" * 40


def _asked(judge: ScriptedJudge, text: str, kind: str = "notes") -> int:
    return sum(1 for c in judge.calls if c[0] == kind and text in c[1])


def test_a_conversation_the_judge_keeps_failing_is_given_up_after_a_day(msvc, judge, clock):
    """A conversation whose extraction always fails (too long for the model, say) is asked
    again each cycle, holding the watermark, until it has failed 3 times over a day; then
    its cursor passes it, an audit step names it, and new messages in it are mined."""
    judge.notes["I prefer short answers"] = [cand("User prefers short answers")]
    judge.fail_texts = {POISON}
    say(msvc, "bad", POISON, rating=9)
    say(msvc, "good", "I prefer short answers", rating=9)
    first = msvc.manager.extract("r1")
    assert first["noteJudgeFailures"] == 1 and first["notesCreated"] == 1
    for hours, run in ((2, "r2"), (2, "r3")):  # 3 failures, but within a day: asked again
        clock.advance(hours=hours)
        report = msvc.manager.extract(run)
        assert report["noteJudgeFailures"] == 1 and "noteSourcesGivenUp" not in report
    assert _asked(judge, POISON) == 3 and _asked(judge, POISON, "examples") == 3
    clock.advance(hours=21)  # the 4th failure, 25 hours after the first: given up
    report = msvc.manager.extract("r4")
    assert report["noteSourcesGivenUp"] == 1 and report["exampleSourcesGivenUp"] == 1
    assert steps(msvc, "r4").count("Give Up On Sources The Judge Keeps Failing") == 2
    given = [s for s in msvc.sources.steps("r4") if s["step_name"].startswith("Give Up")]
    assert "conversation bad" in json.dumps([s["output_json"] for s in given], default=str)
    clock.advance(hours=2)
    report = msvc.manager.extract("r5")
    assert report["noteJudgeFailures"] == 0 and _asked(judge, POISON) == 4
    # a later message in the same conversation is a new batch, mined on its own
    judge.notes["I prefer tea"] = [cand("User prefers tea")]
    say(msvc, "bad", "I prefer tea", rating=9)
    clock.advance(minutes=10)
    assert msvc.manager.extract_notes("r6")["notesCreated"] == 1
    assert _asked(judge, POISON) == 4 and _asked(judge, "I prefer tea") == 1


def test_a_success_starts_the_failure_count_again_and_zero_attempts_never_gives_up(
    msvc, judge, clock
):
    judge.notes["I prefer tea"] = [cand("User prefers tea")]
    say(msvc, "c1", "I prefer tea", rating=9)
    judge.fail_extract = True
    msvc.manager.extract_notes("r1")
    clock.advance(days=2)
    msvc.manager.extract_notes("r2")  # 2 failures over 2 days
    judge.fail_extract = False
    clock.advance(hours=1)
    assert msvc.manager.extract_notes("r3")["notesCreated"] == 1  # the count is cleared
    say(msvc, "c1", "I prefer green tea", rating=9)
    judge.fail_extract = True
    clock.advance(hours=1)
    msvc.manager.extract_notes("r4")
    clock.advance(days=2)
    report = msvc.manager.extract_notes("r5")  # 2 failures since the success: kept
    assert report["noteJudgeFailures"] == 1 and "noteSourcesGivenUp" not in report
    msvc.manager_config = replace(msvc.manager_config, judge_give_up_attempts=0)
    for _ in range(3):
        clock.advance(days=2)
        report = msvc.manager.extract_notes()
        assert report["noteJudgeFailures"] == 1 and "noteSourcesGivenUp" not in report


def test_failed_runs_become_ephemeral_corrective_notes_once(msvc, judge):
    judge.failure_notes = [
        cand("Check the GitHub rate limit before listing pull requests", type="Preference")
    ]
    msvc.add_agent_run(
        "f1", "helper", user_id="alice", status="Failed", success=False, error_message="x" * 2500
    )
    msvc.add_agent_run("f2", "helper", user_id="bob", status="Completed", success=False)
    msvc.add_agent_run("live", "helper", status="Running", success=False)
    msvc.add_agent_run("quiet-cancel", "helper", status="Cancelled", success=None)

    report = msvc.manager.extract_notes()

    failures = [c for c in judge.calls if c[0] == "notes" and c[2] == "failure"]
    assert len(failures) == 2 and report["failedRunsMined"] == 2
    text = failures[0][1][0]
    assert text.startswith(
        'An agent run ended with status "Failed". Error: ' + "x" * 2000 + "… (truncated)."
    )
    notes = msvc.store.notes.all()
    assert len(notes) == 2  # one lesson per failed run (different scopes)
    assert {n.type for n in notes} == {"Issue"} and {n.protection_tier for n in notes} == {
        "Ephemeral"
    }
    assert {n.source_run_id for n in notes} == {"f1", "f2"}
    assert {(n.user_id, n.company_id) for n in notes} == {("alice", "acme"), ("bob", "acme")}
    msvc.manager.extract_notes()
    assert len([c for c in judge.calls if c[0] == "notes" and c[2] == "failure"]) == 2


def test_failure_thread_message():
    m = failure_thread("Cancelled", "boom")
    assert m.role == "system" and m.rating == -1
    assert m.text == (
        'An agent run ended with status "Cancelled". Error: boom. Identify a generalizable lesson '
        "to avoid repeating this failure; if none generalizes, extract nothing."
    )


def test_merge_revokes_targets_with_lineage_but_keeps_protected(msvc, judge):
    old = msvc.add_note(
        "User prefers Python 3.11", agent_id="helper", user_id="alice", company_id="acme"
    )
    locked = msvc.add_note(
        "User's language is Python 3.10", agent_id="helper", user_id="alice", company_id="acme",
        protection_tier="Protected",
    )  # fmt: skip
    other = msvc.add_note("Bob prefers Rust", agent_id="helper", user_id="bob", company_id="acme")
    wider = msvc.add_note("Users here prefer Python 3.9", agent_id="helper", company_id="acme")
    ids = (old.id, locked.id, other.id, wider.id, "not-a-note")
    judge.notes["Actually I use Python 3.12 now"] = [
        cand("User prefers Python 3.12", merge_with_existing_ids=ids),
        cand("user prefers python 3.12 ", merge_with_existing_ids=(old.id,)),  # collapses
    ]
    say(msvc, "c9", "Actually I use Python 3.12 now", rating=9)

    report = msvc.manager.extract_notes()

    assert (
        report["notesCreated"] == 1 and report["notesMerged"] == 1 and report["mergeConflicts"] == 1
    )
    new = next(n for n in msvc.store.notes.all() if n.note == "User prefers Python 3.12")
    revoked = msvc.get_note(old.id)
    assert revoked.status == "Revoked" and revoked.consolidated_into_note_id == new.id
    assert revoked.comments.endswith(
        "Superseded: contradiction detected, replaced by new note from conversation c9"
    )
    kept = msvc.get_note(locked.id)
    assert kept.status == "Active" and kept.consolidated_into_note_id is None
    assert "[Merge-target conflict:" in kept.comments
    assert msvc.get_note(other.id).status == "Active"  # another user's note is never a target
    assert msvc.get_note(wider.id).status == "Active"  # a user's note never revokes a wider one


def test_dedupe_exact_judged_and_failed_judge(msvc, judge):
    existing = msvc.add_note(
        "User prefers tea over coffee", agent_id="helper", user_id="alice", company_id="acme"
    )
    wide = msvc.add_note("Answers use metric units", agent_id="helper")
    judge.notes["about drinks"] = [
        cand("  user prefers TEA   over coffee"),  # exact after normalisation
        cand("User prefers tea over coffee!"),  # near-duplicate: the judge decides
        cand("Answers use metric units."),  # near-duplicate of an agent-wide note (lattice)
    ]
    say(msvc, "c1", "about drinks", rating=9)
    report = msvc.manager.extract_notes("r1")
    assert report["notesCreated"] == 0 and report["notesRejected"] == 3
    assert {r["reason"] for r in report.extra["rejectedNotes"]} == {
        "exact restatement of an existing note",
        "same fact",
    }
    dedupe_calls = [c for c in judge.calls if c[0] == "dedupe"]
    assert {m for c in dedupe_calls for m in c[2]} == {existing.id, wide.id}

    judge.dedupe_error = True
    judge.notes["more drinks"] = [cand("User prefers tea over coffee!!")]
    say(msvc, "c2", "more drinks", rating=9)
    failed = msvc.manager.extract_notes("r2")
    assert failed["notesCreated"] == 0
    assert failed.extra["rejectedNotes"][0]["reason"] == "too similar to existing notes"
    assert msvc.get_note(existing.id).status == "Active" and msvc.store.notes.count() == 2


def test_same_note_from_two_conversations_is_created_once(msvc, judge):
    judge.notes["I like dark mode"] = [cand("User prefers dark mode")]
    say(msvc, "c1", "I like dark mode", rating=9)
    say(msvc, "c2", "I like dark mode", rating=9)
    report = msvc.manager.extract_notes()
    assert report["notesCreated"] == 1 and report["notesRejected"] == 1


def test_rerun_after_a_lost_cursor_does_not_duplicate(msvc, judge):
    judge.notes["I prefer vim"] = [cand("User prefers vim keybindings")]
    say(msvc, "c1", "I prefer vim", rating=9)
    msvc.manager.extract_notes()
    msvc.sources.set_states({"cursor:notes:conversation:c1": None, "watermark:notes": None})
    again = msvc.manager.extract_notes()
    assert again["conversationsProcessed"] == 1 and again["notesCreated"] == 0
    assert msvc.store.notes.count() == 1


def test_extract_examples_thresholds_dedupe_and_cursor(msvc, judge, clock):
    msvc.configure_agent("helper", inject_examples=True)
    msvc.add_example("helper", "How do I export a CSV?", "Reports > Export > CSV", success_score=90)
    judge.examples["show me"] = [
        CandidateExample("How do I reset 2FA?", "Admin > Users > Reset 2FA", 90, 90),
        CandidateExample("How do I export a CSV?", "Use the export button", 95, 95),  # exact input
        CandidateExample("How do I rotate a key?", "Settings > Keys", 60, 90),  # low success
        CandidateExample("How do I add a user?", "Admin > Users > Add", 90, 50),  # low confidence
    ]
    say(msvc, "c1", "show me", rating=9)
    report = msvc.manager.extract_examples("ex")
    assert report["examplesCreated"] == 1 and report["examplesRejected"] == 1
    new = msvc.examples(example_input="How do I reset 2FA?").iloc[0]
    assert (
        new["status"] == "Active"
        and bool(new["is_auto_generated"])
        and new["source_conversation_id"] == "c1"
    )
    assert new["user_id"] == "alice"
    assert "Create Example Records" in steps(msvc, "ex")
    clock.advance(minutes=1)
    assert msvc.manager.extract_examples()["conversationsProcessed"] == 0
    assert len(msvc.examples()) == 2


def test_extract_does_notes_then_examples_under_one_run(msvc, judge):
    msvc.configure_agent("helper", inject_examples=True)
    judge.notes["I prefer short answers"] = [cand("User prefers short answers")]
    judge.examples["I prefer short answers"] = [
        CandidateExample("Summarise this", "Short.", 90, 90)
    ]
    say(msvc, "c1", "I prefer short answers", rating=9)
    report = msvc.manager.extract("both")
    assert report["notesCreated"] == 1 and report["examplesCreated"] == 1
    assert report["conversationsProcessed"] == 1 and report["exampleConversationsProcessed"] == 1
    names = steps(msvc, "both")
    assert names.index("Create Note Records") < names.index("Create Example Records")


# --------------------------------------------------------------------------- hardening


def provisional(svc: MemoryService, text: str, user: str = "alice", **kw) -> Note:
    return svc.add_note(
        text, status="Provisional", author_type="Agent", agent_id="helper", user_id=user,
        company_id="acme", expires_at=svc.now().replace(year=2027), **kw,
    )  # fmt: skip


def test_harden_promotes_and_clears_expiry(msvc, judge):
    p = provisional(msvc, "User deploys on Tuesdays")
    report = msvc.manager.harden("h")
    assert dict(report) == {"hardened": 1, "deduped": 0, "failed": 0, "provisionalCount": 1}
    note = msvc.get_note(p.id)
    assert note.status == "Active" and note.expires_at is None
    assert steps(msvc, "h") == ["Harden Provisional Notes"]
    assert msvc.sources.steps("h")[0]["input_json"] == {"maxNotesPerRun": 200}


def test_harden_archives_a_duplicate_into_the_active_note(msvc, judge, clock):
    active = msvc.add_note(
        "User deploys on Tuesdays", agent_id="helper", user_id="alice", company_id="acme"
    )
    p = provisional(msvc, "User deploys on Tuesdays")
    clock.advance(minutes=5)
    report = msvc.manager.harden()
    assert report["deduped"] == 1 and report["hardened"] == 0
    archived = msvc.get_note(p.id)
    assert archived.status == "Archived" and archived.consolidated_into_note_id == active.id
    assert archived.comments.endswith(f"[Hardening: duplicate of {active.id} — same fact]")
    target = msvc.get_note(active.id)
    assert target.access_count == active.access_count + 1 and target.last_accessed_at == clock()


def test_harden_judge_failure_keeps_the_note_provisional(msvc, judge):
    active = msvc.add_note(
        "User deploys on Tuesdays", agent_id="helper", user_id="alice", company_id="acme"
    )
    p = provisional(msvc, "User deploys on Tuesdays")
    judge.dedupe_error = True
    report = msvc.manager.harden()
    assert report["failed"] == 1 and report["deduped"] == 0 and report["hardened"] == 0
    kept = msvc.get_note(p.id)
    assert kept.status == "Provisional" and kept.consolidated_into_note_id is None
    assert msvc.get_note(active.id).access_count == active.access_count
    assert msvc.sources.steps(step_name="Harden Provisional Notes")[0]["status"] == "Failed"


def test_harden_compares_exactly_the_same_scope(msvc, judge):
    msvc.add_note("User deploys on Tuesdays", agent_id="helper", user_id="bob", company_id="acme")
    msvc.add_note("User deploys on Tuesdays", agent_id="helper", company_id="acme")
    p = provisional(msvc, "User deploys on Tuesdays")
    assert msvc.manager.harden()["hardened"] == 1
    assert msvc.get_note(p.id).status == "Active"
    assert not [c for c in judge.calls if c[0] == "dedupe"]


def test_harden_consolidates_duplicates_within_one_batch(msvc, judge, clock):
    first = provisional(msvc, "User deploys on Tuesdays")
    clock.advance(seconds=1)
    second = provisional(msvc, "User deploys on Tuesdays.")
    report = msvc.manager.harden()
    assert report["hardened"] == 1 and report["deduped"] == 1
    assert msvc.get_note(first.id).status == "Active"
    assert msvc.get_note(second.id).consolidated_into_note_id == first.id


def test_harden_takes_the_oldest_200_agent_notes(msvc, judge, clock):
    notes = []
    for i in range(203):
        clock.advance(seconds=1)
        notes.append(
            Note(note=f"Distinct fact number {i} about topic {i * 7}", status="Provisional",
                 author_type="Agent", agent_id="helper", user_id="alice", created_at=clock())
        )  # fmt: skip
    msvc.save_notes(notes)
    msvc.add_note("Human wrote this", status="Provisional", author_type="User", agent_id="helper")
    judge.duplicate = False
    report = msvc.manager.harden()
    assert report["provisionalCount"] == 200
    left = msvc.notes(status="Provisional")
    assert set(left["id"]) == {n.id for n in notes[200:]} | set(
        msvc.notes(author_type="User")["id"]
    )


def test_harden_dedupes_a_paraphrase_with_the_offline_judge(svc_real, clock):
    svc = svc_real
    svc.configure_agent("helper")
    active = svc.add_note(
        "Alice prefers dark mode in all dashboards",
        agent_id="helper",
        user_id="alice",
        company_id="acme",
    )
    p = provisional(svc, "Alice prefers dark mode in all her dashboards")
    other = provisional(svc, "Alice's team deploys the billing service on Tuesdays")
    report = svc.manager.harden()
    assert report["deduped"] == 1 and report["hardened"] == 1 and report["failed"] == 0
    assert svc.get_note(p.id).consolidated_into_note_id == active.id
    assert svc.get_note(other.id).status == "Active"


# --------------------------------------------------------------------------- fold



def test_fold_injection_events_exactly_once(msvc, clock):
    a = msvc.add_note("User prefers tea", agent_id="helper", access_count=2)
    ex = msvc.add_example("helper", "How do I export?", "Reports > Export")
    add_events(
        msvc, [("note", a.id), ("note", a.id), ("example", ex.id), ("note", "gone")], clock()
    )
    report = msvc.manager.fold_injection_events()
    assert (
        report["eventsFolded"] == 4
        and report["notesTouched"] == 1
        and report["examplesTouched"] == 1
    )
    note = msvc.get_note(a.id)
    assert note.access_count == 4 and note.last_accessed_at == clock()
    assert msvc.get_example(ex.id).access_count == 1
    assert msvc.manager.fold_injection_events()["eventsFolded"] == 0
    assert msvc.get_note(a.id).access_count == 4


def test_fold_recovers_from_a_crash_without_double_counting(msvc, clock, monkeypatch):
    a = msvc.add_note("User prefers tea", agent_id="helper")
    add_events(msvc, [("note", a.id)] * 3, clock())
    original = Sources.set_states

    def crash(self, values):
        if FOLD_PENDING in values:
            raise RuntimeError("killed after the note update")
        return original(self, values)

    monkeypatch.setattr(Sources, "set_states", crash)
    with pytest.raises(RuntimeError):
        msvc.manager.fold_injection_events()
    assert msvc.get_note(a.id).access_count == 3  # applied, cursor not advanced
    assert msvc.sources.get_state(FOLD_PENDING) is not None
    monkeypatch.setattr(Sources, "set_states", original)
    report = msvc.manager.fold_injection_events()
    assert report["recovered"] == 1 and msvc.get_note(a.id).access_count == 3
    assert msvc.sources.get_state(FOLD_CURSOR) == 3 and msvc.sources.get_state(FOLD_PENDING) is None


# --------------------------------------------------------------------------- cycle


def test_run_cycle_records_the_cycle_and_skips_untriggered_maintenance(msvc, judge, monkeypatch):
    from memory_pipelines.phases import cycle

    monkeypatch.setattr(
        cycle, "maintenance_trigger", lambda svc, force=False, partition=None: (False, "not-triggered")
    )
    judge.notes["I prefer tea"] = [cand("User prefers tea over coffee")]
    say(msvc, "c1", "I prefer tea", rating=9)
    provisional(msvc, "User deploys on Tuesdays")

    report = msvc.manager.run_cycle(run_id="cyc")

    assert (
        report["notesCreated"] == 1
        and report["hardened"] == 1
        and report["maintenanceRan"] is False
    )
    with msvc.sources.begin() as c:
        row = c.execute(select(manager_runs)).mappings().one()
    assert row["kind"] == "cycle" and row["status"] == "Completed"
    assert (
        row["counts"]["extract_notes"]["notesCreated"] == 1
        and row["counts"]["harden"]["hardened"] == 1
    )
    assert msvc.sources.get_state(LAST_CYCLE_AT) == msvc.now().isoformat()
    assert "Memory Manager Cycle" in steps(msvc, "cyc")


def test_run_cycle_runs_maintenance_when_triggered(msvc, judge, monkeypatch):
    from memory_pipelines.phases import cycle

    seen = {}

    def fake_run(svc, trigger, run_id=None, partition=None):
        seen.update(trigger=trigger, run_id=run_id)
        return PhaseReport({"notesScored": 3})

    monkeypatch.setattr(
        cycle, "maintenance_trigger", lambda svc, force=False, partition=None: (force, "forced")
    )
    monkeypatch.setattr(cycle, "run_maintenance", fake_run)
    report = msvc.manager.run_cycle(force_maintenance=True, run_id="cyc")
    assert seen == {"trigger": "forced", "run_id": "cyc"}
    assert report["maintenance_notesScored"] == 3 and report["maintenanceTrigger"] == "forced"


def test_run_cycle_failure_is_recorded_and_raised(msvc, judge, monkeypatch):
    from memory_pipelines.phases import cycle

    monkeypatch.setattr(
        cycle, "maintenance_trigger", lambda svc, force=False, partition=None: (False, "not-triggered")
    )
    monkeypatch.setattr(hardening, "run", lambda mem, run_id=None, partition=None: 1 / 0)
    p = provisional(msvc, "User deploys on Tuesdays")
    with pytest.raises(CycleError) as err:
        msvc.manager.run_cycle()
    assert isinstance(err.value.__cause__, ZeroDivisionError)
    with msvc.sources.begin() as c:
        assert c.execute(select(manager_runs.c.status)).scalar_one() == "Failed"
    assert msvc.get_note(p.id).status == "Provisional"


def test_cycle_signal_rated_messages_and_backlog(msvc, clock):
    mgr = msvc.manager
    first = mgr.cycle_signal(None)
    assert not first.should_run
    say(msvc, "c1", "Great answer", rating=9)
    run = mgr.cycle_signal(first.cursor)
    assert run.should_run and run.new_rated_messages == 1 and run.run_key
    assert not mgr.cycle_signal(run.cursor).should_run
    for i in range(mgr.config.provisional_backlog):
        clock.advance(seconds=1)
        provisional(msvc, f"Provisional fact {i}")
    backlog = mgr.cycle_signal(run.cursor)
    assert backlog.should_run and backlog.provisional_backlog == mgr.config.provisional_backlog
    assert backlog.run_key != run.run_key
    assert not mgr.cycle_signal(backlog.cursor).should_run


# --------------------------------------------------------------------------- litellm judge


def test_litellm_judge_extracts_and_its_failures_lose_nothing(clock, open_service):
    import litellm

    from memory_pipelines.judge import LiteLLMJudge

    reply = {
        "notes": [
            {"content": "User prefers tea over coffee", "type": "Preference", "scopeLevel": "user",
             "confidence": 95, "sourceMessageId": "m1"},
        ]
    }  # fmt: skip
    judge = LiteLLMJudge(
        "openai/gpt-4o-mini",
        num_retries=0,
        timeout=5,
        completion_kwargs={"mock_response": json.dumps(reply)},
    )
    with open_service(llm=judge) as svc:
        svc.configure_agent("helper")
        svc.add_conversation("c1", "helper", "alice")
        svc.add_message("c1", "m1", "user", "I prefer tea over coffee", rating=9)
        created = svc.manager.extract_notes()
        assert created["notesCreated"] == 1
        tea = svc.store.notes.all()[0]
        assert (
            tea.note == "User prefers tea over coffee" and tea.source_conversation_detail_id == "m1"
        )

        # a timeout: the conversation stays for the next cycle, nothing is written
        judge.completion_kwargs = {
            "mock_response": litellm.Timeout(
                message="timed out", model="gpt-4o-mini", llm_provider="openai"
            )
        }
        clock.advance(minutes=1)
        svc.add_message("c1", "m2", "user", "I prefer oolong tea, actually", rating=9)
        timed_out = svc.manager.extract_notes()
        assert timed_out["noteJudgeFailures"] == 1 and svc.store.notes.count() == 1

        # malformed JSON while hardening: the provisional duplicate stays Provisional
        dup = svc.add_note(
            "User prefers tea over coffee", status="Provisional", author_type="Agent", agent_id="helper",
            user_id="alice", expires_at=clock().replace(year=2027),
        )  # fmt: skip
        judge.completion_kwargs = {"mock_response": '{"shouldAdd": fal'}
        hardened = svc.manager.harden()
        assert hardened["failed"] == 1 and hardened["deduped"] == 0
        assert svc.get_note(dup.id).status == "Provisional"
        assert svc.get_note(tea.id).status == "Active" and svc.get_note(tea.id).access_count == 1

        # the model answers again: the held-back message is mined, the duplicate archived
        judge.completion_kwargs = {
            "mock_response": json.dumps({"shouldAdd": False, "reason": "same preference"})
        }
        assert svc.manager.harden()["deduped"] == 1
        assert svc.get_note(dup.id).consolidated_into_note_id == tea.id
        judge.completion_kwargs = {"mock_response": json.dumps({"notes": []})}
        assert svc.manager.extract_notes()["messagesProcessed"] == 1


# --------------------------------------------------------------------------- CLI


def test_cycle_command_prints_the_counts(home, capsys, monkeypatch, open_service):
    from memory_pipelines.apps.cli import cycle_command as main

    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    with open_service(clock=None) as svc:
        svc.configure_agent("helper")
        svc.add_conversation("c1", "helper", "alice")
        svc.add_message("c1", "m1", "user", "I prefer green tea over coffee.", rating=9)
    assert main(["--home", str(home), "--force-maintenance"]) == 0
    out = capsys.readouterr().out
    assert "notesCreated" in out and "maintenanceTrigger" in out
    assert "Processed 1 conversations (1 messages)" in out


# --------------------------------------------------------------------------- inventory


def test_note_inventory_and_integrity_properties(msvc, capsys, monkeypatch):
    from memory_pipelines import inventory
    from memory_pipelines.apps.cli import inventory_command

    a = msvc.add_note("User prefers tea", agent_id="helper", importance_score=8.5)
    msvc.add_note("Old fact", agent_id="helper", status="Archived", consolidated_into_note_id=a.id)
    msvc.add_note(
        "Lost lineage", agent_id="helper", status="Revoked", consolidated_into_note_id="gone"
    )
    msvc.add_note("Merged", agent_id="other", derived_from_note_ids=[a.id, "missing"])
    msvc.add_note("Agent wrote", agent_id="helper", author_type="Agent", expires_at=msvc.now())

    inv = inventory.note_inventory(msvc)
    by_status = dict(zip(inv["by_status"]["status"], inv["by_status"]["notes"], strict=True))
    assert by_status == {"Active": 3, "Archived": 1, "Revoked": 1}
    assert dict(zip(inv["by_agent"]["agent_id"], inv["by_agent"]["notes"], strict=True)) == {
        "helper": 4,
        "other": 1,
    }
    assert inv["agent_status"].loc["helper", "Active"] == 2
    assert inv["importance_summary"].iloc[0]["scored"] == 1
    assert inv["importance"].set_index("importance").loc["(unscored)", "notes"] == 2

    dangling = inventory.dangling_lineage(msvc)
    assert set(dangling["missing_id"]) == {"gone", "missing"}
    assert list(inventory.hardened_with_expiry(msvc)["note"]) == ["Agent wrote"]
    assert inventory.vector_problems(msvc).empty

    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    assert inventory_command(["--home", str(msvc.home)]) == 0
    out = capsys.readouterr().out
    assert "## by status" in out and "Archived" in out


def test_the_give_up_settings_refuse_negative_values():
    with pytest.raises(ConfigError, match="judge_give_up_attempts"):
        ManagerConfig(judge_give_up_attempts=-1)
    with pytest.raises(ConfigError, match="judge_give_up_after"):
        ManagerConfig(judge_give_up_after=timedelta(hours=-1))
    assert ManagerConfig(judge_give_up_attempts=0).judge_give_up_attempts == 0


def test_a_failed_run_the_judge_keeps_failing_is_given_up_and_not_mined_again(msvc, judge, clock):
    judge.failure_notes = [cand("Check the rate limit before listing pull requests", type="Issue")]
    judge.fail_texts = {failure_thread("Failed", "HTTP 429 from GitHub").text}
    msvc.add_agent_run(
        "f1", "helper", user_id="alice", status="Failed", success=False,
        error_message="HTTP 429 from GitHub",
    )

    def asked() -> int:
        return sum(1 for c in judge.calls if c[0] == "notes" and c[2] == "failure")

    for hours in (0, 2, 2):
        clock.advance(hours=hours)
        report = msvc.manager.extract_notes()
        assert report["noteJudgeFailures"] == 1 and "noteSourcesGivenUp" not in report
    clock.advance(hours=21)
    report = msvc.manager.extract_notes("r4")
    assert report["noteSourcesGivenUp"] == 1 and asked() == 4
    assert "Give Up On Sources The Judge Keeps Failing" in steps(msvc, "r4")
    clock.advance(hours=2)
    assert msvc.manager.extract_notes()["noteJudgeFailures"] == 0 and asked() == 4
    assert msvc.store.notes.count() == 0
