"""The in-flight write path (reference §2, CONTRACT §2.3), with the cheap HashEmbedder.

HashEmbedder ignores punctuation, so "X." and "X!" embed identically (cosine 1.0) while
their normalised texts differ: that is how these tests make a near-duplicate that is not an
exact restatement. Semantic behaviour with the real model is in test_writes_calibration.py.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest

from memory_pipelines import (
    MemoryService,
    MemoryWrite,
    RunContext,
    SourceError,
    UnknownAgentError,
    ValidationError,
)
from memory_pipelines.config import WriteConfig
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.errors import ConfigError
from memory_pipelines.notes import stable_id
from memory_pipelines.scope import SecondaryScopeConfig
from memory_pipelines.text import normalize
from memory_pipelines.writes import (
    DISPOSITIONS,
    GATE_FEEDBACK,
    GATE_STEP_NAME,
    REASON_DEDUPED,
    REASON_DISABLED,
    REASON_DUPLICATE,
    REASON_SUPERSEDED,
    REASON_WRITTEN,
    SLOT_DISPOSITION,
    SLOT_KEY_PREFIX,
    WriteResult,
    cap_reason,
    clamp_scope,
    format_write_feedback,
    ledger_key,
)

REPO = Path(__file__).resolve().parents[2]
AGENT = "agent-1"

TYPE_REASON_CONSTRAINT = (
    "Memory type \"Constraint\" is not allowed in-flight — only 'Preference' and 'Context'."
    " Behavioral/constraint memories require Memory Manager or human promotion."
)
CAP_REASON_5 = (
    "Per-run memory write cap (5) reached. Remaining facts will be captured by the scheduled"
    " Memory Manager."
)


def ctx(run_id: str | None = "run-1", **kw) -> RunContext:
    base = dict(
        agent_id=AGENT,
        run_id=run_id,
        user_id="u1",
        company_id="c1",
        conversation_id="conv-1",
        conversation_detail_id="msg-1",
    )
    base.update(kw)
    return RunContext(**base)


def w(note, type="Preference", hint=None) -> dict:
    req = {"note": note, "type": type}
    if hint is not None:
        req["scopeHint"] = hint
    return req


def dispositions(results) -> list[str]:
    return [r.disposition for r in results]


@pytest.fixture
def agent(svc):
    return svc.configure_agent(AGENT)


def note_rows(svc):
    return svc.notes().sort_values("created_at").reset_index(drop=True)


# --------------------------------------------------------------------------- written


def test_written_note_has_every_field_of_the_reference(svc, agent, clock):
    c = ctx(
        primary_scope_entity_id="Accounts",
        primary_scope_record_id="acct-9",
        secondary_scopes={"region": "eu"},
    )
    [r] = svc.write(c, [w("  User prefers bar charts over pie charts.  ")])
    assert r.disposition == "written"
    assert r.reason == REASON_WRITTEN
    assert r.final_scope == {"agent_id": AGENT, "user_id": "u1", "company_id": "c1"}
    key = "agent-1|u1|c1"
    assert r.note_id == stable_id("run-1", key, "user prefers bar charts over pie charts.")
    n = svc.get_note(r.note_id)
    assert n.note == "User prefers bar charts over pie charts."
    assert (n.agent_id, n.user_id, n.company_id) == (AGENT, "u1", "c1")
    assert n.type == "Preference"
    assert n.status == "Provisional"
    assert n.author_type == "Agent"
    assert n.protection_tier == "Standard"
    assert n.is_auto_generated is True
    assert n.consolidation_count == 0
    assert n.access_count == 1
    assert n.note_type_name == "AI"
    assert (n.source_run_id, n.source_conversation_id, n.source_conversation_detail_id) == (
        "run-1",
        "conv-1",
        "msg-1",
    )
    assert (n.primary_scope_entity_id, n.primary_scope_record_id) == ("Accounts", "acct-9")
    assert n.secondary_scopes == {"region": "eu"}
    assert n.created_at == clock()
    assert n.expires_at == clock() + timedelta(days=7)
    assert n.embedding_model_id == svc.embedder.model_id
    assert r.duration_ms > 0


def test_ttl_reads_the_moved_service_clock(clock, open_service):
    with open_service(write_config=WriteConfig(default_ttl_days=2)) as s:
        s.configure_agent(AGENT)
        clock.advance(days=3, hours=5)
        [r] = s.write(ctx(), [w("User drinks green tea.")])
        n = s.get_note(r.note_id)
        assert n.created_at == clock()
        assert n.expires_at == clock() + timedelta(days=2)


def test_context_type_and_memorywrite_objects_are_accepted_and_echoed(svc, agent):
    obj = MemoryWrite(note="The team deploys on Fridays.", type="Context", scopeHint="agent")
    mapping = w("User likes short answers.")
    results = svc.write(ctx(), [obj, mapping])
    assert dispositions(results) == ["written", "written"]
    assert results[0].request is obj
    assert results[1].request is mapping
    assert svc.get_note(results[0].note_id).type == "Context"
    assert results[0].final_scope == {"agent_id": AGENT, "user_id": None, "company_id": "c1"}


def test_a_mapping_without_type_is_a_preference_and_extra_keys_are_ignored(svc, agent):
    [r] = svc.write(ctx(), [{"note": "User writes in Rust.", "confidence": 0.9}])
    assert r.disposition == "written"
    assert svc.get_note(r.note_id).type == "Preference"


# --------------------------------------------------------------------------- rejected


@pytest.mark.parametrize(
    "request_, reason",
    [
        ("remember this", "Memory write request must be an object with a 'note' string, got str."),
        (None, "Memory write request must be an object with a 'note' string, got NoneType."),
        (["note"], "Memory write request must be an object with a 'note' string, got list."),
        ({"type": "Preference"}, "Memory write request has no 'note' field."),
        ({"note": None, "type": "Preference"}, "Memory note must be a string, got NoneType."),
        ({"note": 42, "type": "Preference"}, "Memory note must be a string, got int."),
        (w("Obey the user.", "Constraint"), TYPE_REASON_CONSTRAINT),
        (w("x", "Issue"), TYPE_REASON_CONSTRAINT.replace('"Constraint"', '"Issue"')),
        (w("x", "preference"), TYPE_REASON_CONSTRAINT.replace('"Constraint"', '"preference"')),
        ({"note": "x", "type": None}, TYPE_REASON_CONSTRAINT.replace('"Constraint"', '"None"')),
        (
            w("User likes tea.", hint="global"),
            "Memory scopeHint \"global\" is not allowed — only 'user' or 'agent' (or leave it out).",
        ),
        (
            w("User likes tea.", hint="Agent"),
            "Memory scopeHint \"Agent\" is not allowed — only 'user' or 'agent' (or leave it out).",
        ),
        (w(" \n\t "), "Memory note text is empty."),
        (
            w("x" * 2001),
            "Memory note exceeds the 2000-character limit (2001). Record one atomic fact per write.",
        ),
        (
            MemoryWrite(note="Never reveal secrets.", type="Constraint"),
            TYPE_REASON_CONSTRAINT,
        ),
    ],
)
def test_malformed_requests_are_rejected_without_stopping_the_batch(svc, agent, request_, reason):
    results = svc.write(ctx(), [request_, w("User likes tea.")])
    assert dispositions(results) == ["rejected-type", "written"]
    bad = results[0]
    assert bad.reason == reason
    assert bad.note_id is None and bad.final_scope is None
    if reason.startswith("Memory note exceeds"):  # a long rejected text is echoed clipped
        assert bad.request["note"].startswith("x" * 200)
        assert "… [2001 characters, sha256 " in bad.request["note"]
    else:
        assert bad.request is request_
    assert len(svc.notes()) == 1
    step = svc.sources.steps("run-1", "Memory Write")[0]
    assert step["status"] == "Failed"
    assert step["error_message"] == reason


def test_length_is_measured_after_trim_against_the_configured_limit(open_service):
    with open_service(write_config=WriteConfig(max_note_length=10)) as s:
        s.configure_agent(AGENT)
        results = s.write(ctx(), [w("   0123456789   "), w("0123456789A")])
        assert dispositions(results) == ["written", "rejected-type"]
        assert results[1].reason == (
            "Memory note exceeds the 10-character limit (11). Record one atomic fact per write."
        )


def test_write_config_rejects_nonsense():
    for bad in (
        dict(max_writes_per_run=-1),
        dict(near_dup_similarity=0.0),
        dict(near_dup_similarity=1.5),
        dict(default_ttl_days=0),
        dict(max_note_length=0),
    ):
        with pytest.raises(ConfigError):
            WriteConfig(**bad)


# --------------------------------------------------------------------------- errors at the boundary


def test_unknown_agent_missing_run_id_and_bad_batches_raise(svc, agent):
    with pytest.raises(UnknownAgentError):
        svc.write(ctx(agent_id="nobody"), [w("User likes tea.")])
    with pytest.raises(ValidationError, match="run_id"):
        svc.write(ctx(run_id=None), [w("User likes tea.")])
    with pytest.raises(ValidationError, match="run_id"):
        svc.write({"agent_id": AGENT, "run_id": "  "}, [w("User likes tea.")])
    for bad in (w("User likes tea."), "User likes tea.", None, 5, (x for x in [w("a")])):
        with pytest.raises(ValidationError, match="writes must be a list"):
            svc.write(ctx(), bad)
    assert svc.write(ctx(), []) == []
    assert svc.sources.steps("run-1") == []
    assert len(svc.notes()) == 0


# --------------------------------------------------------------------------- idempotency


def test_exact_repeat_in_a_run_is_skipped_and_scope_is_part_of_the_key(svc, agent):
    results = svc.write(
        ctx(),
        [
            w("User prefers dark mode."),
            w("  user PREFERS   dark mode. "),
            w("User prefers dark mode.", hint="agent"),
            w("User prefers dark mode.", hint="user"),
        ],
    )
    assert dispositions(results) == ["written", "skipped-duplicate", "written", "skipped-duplicate"]
    assert results[1].note_id == results[0].note_id
    assert results[1].reason == REASON_DUPLICATE
    assert results[2].note_id != results[0].note_id
    assert results[2].final_scope["user_id"] is None
    assert results[3].note_id == results[0].note_id
    assert len(svc.notes()) == 2


def test_idempotency_is_per_run(svc, agent):
    first = svc.write(ctx("run-1"), [w("User lives in Oslo.")])
    second = svc.write(ctx("run-2"), [w("User lives in Oslo.")])
    assert dispositions(first) == ["written"]
    # Another run restating a note verbatim reinforces it instead of skipping.
    assert dispositions(second) == ["deduped"]
    assert second[0].note_id == first[0].note_id


def test_normalize_trims_lowercases_and_collapses_whitespace_only():
    assert normalize("  User\tPrefers \n\n Tea. ") == "user prefers tea."
    assert normalize("Café, “quoted”!") == "café, “quoted”!"


# --------------------------------------------------------------------------- supersede own


def test_a_near_duplicate_of_the_runs_own_note_supersedes_it(svc, agent, clock):
    [first] = svc.write(ctx(), [w("The user prefers bar charts.", "Preference")])
    before = svc.get_note(first.note_id)
    clock.advance(minutes=5)
    results = svc.write(
        ctx(),
        [w("The user prefers bar charts!", "Context"), w("the user prefers BAR charts!")],
    )
    assert dispositions(results) == ["superseded-own", "skipped-duplicate"]
    sup = results[0]
    assert sup.note_id == first.note_id
    assert sup.reason == REASON_SUPERSEDED
    assert sup.final_scope == {"agent_id": AGENT, "user_id": "u1", "company_id": "c1"}
    after = svc.get_note(first.note_id)
    assert after.note == "The user prefers bar charts!"
    assert after.type == "Context"
    assert after.status == before.status == "Provisional"
    assert after.expires_at == before.expires_at
    assert (after.user_id, after.company_id) == ("u1", "c1")
    assert after.updated_at == clock()
    assert len(svc.notes()) == 1
    # Repeating the original text is still a repeat of this run.
    assert dispositions(svc.write(ctx(), [w("The user prefers bar charts.")])) == [
        "skipped-duplicate"
    ]


def test_an_own_note_at_another_scope_is_neither_superseded_nor_touched(svc, agent):
    results = svc.write(
        ctx(),
        [
            w("The team deploys on Fridays.", "Context", hint="agent"),
            w("The team deploys on Fridays!", "Context", hint="user"),
        ],
    )
    assert dispositions(results) == ["written", "written"]
    agent_note = svc.get_note(results[0].note_id)
    user_note = svc.get_note(results[1].note_id)
    assert agent_note.note == "The team deploys on Fridays."
    assert agent_note.user_id is None
    assert user_note.user_id == "u1"
    assert len(svc.notes()) == 2


def test_superseding_does_not_count_against_the_cap(svc, agent):
    texts = [f"User fact number {word}." for word in ("alpha", "bravo", "charlie", "delta")]
    results = svc.write(ctx(), [w(t) for t in texts])
    results += svc.write(ctx(), [w(texts[0].replace(".", "!")), w("User fact number echo.")])
    results += svc.write(ctx(), [w("User fact number foxtrot.")])
    assert dispositions(results) == ["written"] * 4 + ["superseded-own", "written", "skipped-cap"]


# --------------------------------------------------------------------------- dedupe


def test_exact_restatement_of_an_existing_note_is_reinforced_once(svc, agent, clock):
    existing = svc.add_note(
        "User prefers metric units.", agent_id=AGENT, user_id="u1", company_id="c1", access_count=3
    )
    clock.advance(hours=2)
    results = svc.write(ctx(), [w("user prefers   METRIC units."), w("User prefers metric units.")])
    assert dispositions(results) == ["deduped", "skipped-duplicate"]
    assert results[0].note_id == results[1].note_id == existing.id
    assert results[0].reason == REASON_DEDUPED
    assert results[0].final_scope is None
    after = svc.get_note(existing.id)
    assert after.access_count == 4  # reinforced once, not twice (reference §6.2 item 15)
    assert after.last_accessed_at == clock()
    assert after.note == "User prefers metric units."
    assert after.status == existing.status
    assert len(svc.notes()) == 1


def test_a_textually_different_near_duplicate_of_an_existing_note_is_a_new_note(svc, agent):
    existing = svc.add_note(
        "User prefers metric units.", agent_id=AGENT, user_id="u1", company_id="c1"
    )
    [r] = svc.write(ctx(), [w("User prefers metric units!")])
    assert r.disposition == "written"
    assert svc.get_note(existing.id).access_count == 0
    assert len(svc.notes()) == 2


def test_dedupe_reaches_every_level_of_the_scope_lattice(svc, agent):
    levels = {
        "agent-wide": dict(agent_id=AGENT),
        "agent+company": dict(agent_id=AGENT, company_id="c1"),
        "user+company": dict(user_id="u1", company_id="c1"),
        "global": dict(),
    }
    ids = {
        name: svc.add_note(f"Shared fact {name}.", type="Context", **scope).id
        for name, scope in levels.items()
    }
    results = svc.write(ctx(), [w(f"shared fact {name}.", "Context") for name in levels])
    assert dispositions(results) == ["deduped"] * 4
    assert [r.note_id for r in results] == list(ids.values())


def test_never_touches_another_users_or_companys_note(svc, agent):
    """Reference §6.2 item 3: an absent user/company in the clamped scope means NULL."""
    other_user = svc.add_note("User prefers tea.", agent_id=AGENT, user_id="u2", company_id="c1")
    other_company = svc.add_note(
        "Office opens at 8.", type="Context", agent_id=AGENT, company_id="c2"
    )
    other_agent = svc.add_note(
        "User likes jazz.", agent_id="agent-2", user_id="u1", company_id="c1"
    )
    archived = svc.add_note(
        "User likes blues.", agent_id=AGENT, user_id="u1", company_id="c1", status="Archived"
    )
    results = svc.write(ctx(), [w("User prefers tea.")])  # user u1: u2's note is out of scope
    results += svc.write(ctx(), [w("User prefers tea.", hint="agent")])  # the reference leak
    results += svc.write(ctx("run-2", company_id=None), [w("Office opens at 8.", "Context")])
    results += svc.write(ctx(), [w("User likes jazz."), w("User likes blues.")])
    assert dispositions(results) == ["written"] * 5
    for n in (other_user, other_company, other_agent, archived):
        assert svc.get_note(n.id).access_count == 0
    assert results[1].final_scope == {"agent_id": AGENT, "user_id": None, "company_id": "c1"}


def test_a_note_of_another_primary_scope_record_is_not_reinforced(svc, agent):
    mine = svc.add_note(
        "Account uses SSO.", type="Context", agent_id=AGENT, primary_scope_record_id="t1"
    )
    theirs = svc.add_note(
        "Account uses SAML.", type="Context", agent_id=AGENT, primary_scope_record_id="t2"
    )
    c = ctx(user_id=None, company_id=None, primary_scope_record_id="t1")
    results = svc.write(c, [w("Account uses SSO.", "Context"), w("Account uses SAML.", "Context")])
    assert dispositions(results) == ["deduped", "written"]
    assert results[0].note_id == mine.id
    assert svc.get_note(theirs.id).access_count == 0


# --------------------------------------------------------------------------- cap


def test_the_cap_counts_new_notes_only_and_uses_the_configured_number(svc, agent):
    results = svc.write(ctx(), [w(f"User fact {i} is {chr(97 + i) * 3}.") for i in range(7)])
    assert dispositions(results) == ["written"] * 5 + ["skipped-cap"] * 2
    assert results[5].reason == CAP_REASON_5
    assert results[5].note_id is None
    assert len(svc.notes()) == 5
    assert cap_reason(2) == CAP_REASON_5.replace("(5)", "(2)")


def test_the_cap_does_not_stop_dedupe_or_supersede(svc, agent):
    """Reference §6.2 item 14: at the cap only writes that would create a note are skipped."""
    existing = svc.add_note("User owns a bicycle.", agent_id=AGENT, user_id="u1", company_id="c1")
    first = svc.write(ctx(), [w(f"User fact {i} is {chr(97 + i) * 3}.") for i in range(5)])
    assert dispositions(first) == ["written"] * 5
    results = svc.write(
        ctx(),
        [
            w("User owns a bicycle."),  # exact restatement of a pre-existing note
            w("User fact 0 is aaa!"),  # rewrite of the run's own note
            w("User fact 9 is zzz."),  # would create a note
            w("User owns a bicycle."),  # repeat: idempotency comes before the cap
        ],
    )
    assert dispositions(results) == [
        "deduped",
        "superseded-own",
        "skipped-cap",
        "skipped-duplicate",
    ]
    assert svc.get_note(existing.id).access_count == 1
    assert svc.get_note(first[0].note_id).note == "User fact 0 is aaa!"


def test_a_zero_cap_still_dedupes(open_service):
    with open_service(write_config=WriteConfig(max_writes_per_run=0)) as s:
        s.configure_agent(AGENT)
        s.add_note("User likes figs.", agent_id=AGENT, user_id="u1", company_id="c1")
        results = s.write(ctx(), [w("User likes figs."), w("User likes dates.")])
        assert dispositions(results) == ["deduped", "skipped-cap"]
        assert results[1].reason == cap_reason(0)


# --------------------------------------------------------------------------- order


def test_guard_order(svc, agent):
    """validation → clamp → idempotency → cap → near-dup → save."""
    svc.add_note("User has a dog.", agent_id=AGENT, user_id="u1", company_id="c1")
    results = svc.write(
        ctx(),
        [
            w("User has a dog.", "Constraint"),  # validation first: never reaches dedupe
            w("User has a dog.", "Constraint"),  # rejected twice: not registered
            w("User has a dog."),  # dedupe of the existing note
            w("User has a dog.", hint="agent"),  # clamp before the key: a different key
        ]
        + [w(f"User fact {i} is {chr(97 + i) * 3}.") for i in range(5)]
        + [w("User fact 0 is aaa."), w("User fact 7 is hhh.")],
    )
    assert dispositions(results) == (
        ["rejected-type", "rejected-type", "deduped", "written"]
        + ["written"] * 4
        + ["skipped-cap", "skipped-duplicate", "skipped-cap"]
    )


# --------------------------------------------------------------------------- scope clamp


@pytest.mark.parametrize("hint", [None, "user", "agent"])
@pytest.mark.parametrize("user_id", ["u1", None])
@pytest.mark.parametrize("company_id", ["c1", None])
def test_scope_clamp_matrix(svc, agent, hint, user_id, company_id):
    c = ctx(user_id=user_id, company_id=company_id)
    [r] = svc.write(c, [w("User prefers oat milk.", hint=hint)])
    expected_user = None if hint == "agent" else user_id
    expected = {"agent_id": AGENT, "user_id": expected_user, "company_id": company_id}
    assert r.disposition == "written"
    assert r.final_scope == expected
    n = svc.get_note(r.note_id)
    assert {"agent_id": n.agent_id, "user_id": n.user_id, "company_id": n.company_id} == expected
    assert clamp_scope(c, hint).as_dict() == expected


def _multi_company_agent(svc, **scope_config):
    """An agent that has served company c1 (a run of it), with ``scope_config``."""
    svc.configure_agent(AGENT, scope_config=scope_config or None)
    svc.add_agent_run("run-c1", AGENT, user_id="u9", company_id="c1")


@pytest.mark.parametrize("setting", [None, "company"])
def test_agent_wide_write_from_a_companyless_run_of_a_multi_company_agent_is_clamped(svc, setting):
    """The default for an agent that serves companies (and agentWideWrites='company'):
    an agent-wide hint from a run without a company lands at the user's scope, or is
    rejected without a user, so no company ever sees it."""
    _multi_company_agent(svc, **({"agentWideWrites": setting} if setting else {}))
    [r] = svc.write(ctx(company_id=None), [w("The team deploys on Fridays.", "Context", "agent")])
    assert r.disposition == "written"
    assert r.final_scope == {"agent_id": AGENT, "user_id": "u1", "company_id": None}
    assert "current user only" in r.reason
    assert svc.get_note(r.note_id).user_id == "u1"
    # no user either: any write would reach every company of the agent, so none is saved
    anonymous = ctx("run-anon", user_id=None, company_id=None)
    results = svc.write(anonymous, [w("Deploys are on Fridays.", "Context", "agent"), w("X y z.")])
    assert dispositions(results) == ["rejected-type", "rejected-type"]
    assert "without a company" in results[0].reason and "Nothing was saved" in results[0].reason
    # with a company the agent-wide hint is honoured within that company
    [c1] = svc.write(ctx(run_id="r2"), [w("The team deploys on Mondays.", "Context", "agent")])
    assert c1.final_scope == {"agent_id": AGENT, "user_id": None, "company_id": "c1"}
    # the other company does not see the companyless user's write
    seen = svc.inject({"agent_id": AGENT, "user_id": "u2", "company_id": "c2"}).message
    assert "Fridays" not in seen
    assert len(svc.notes()) == 2


def test_agent_wide_writes_allow_keeps_the_guides_behaviour(svc):
    _multi_company_agent(svc, agentWideWrites="allow")
    [r] = svc.write(ctx(company_id=None), [w("The team deploys on Fridays.", "Context", "agent")])
    assert r.final_scope == {"agent_id": AGENT, "user_id": None, "company_id": None}
    assert r.reason == REASON_WRITTEN


def test_agent_wide_writes_deny_keeps_every_write_at_the_user(svc):
    svc.configure_agent(AGENT, scope_config={"agentWideWrites": "deny"})
    [r] = svc.write(ctx(), [w("The team deploys on Fridays.", "Context", "agent")])
    assert r.final_scope == {"agent_id": AGENT, "user_id": "u1", "company_id": "c1"}
    [none] = svc.write(ctx("run-2", user_id=None), [w("Deploys are on Fridays.", "Context", "agent")])
    assert none.disposition == "rejected-type"


def test_an_agent_with_no_company_keeps_agent_wide_writes(svc, agent):
    """The guide's single-tenant behaviour: nothing names a company for this agent."""
    svc.add_agent_run("run-0", AGENT, user_id="u1")
    [r] = svc.write(ctx(company_id=None), [w("The team deploys on Fridays.", "Context", "agent")])
    assert r.final_scope == {"agent_id": AGENT, "user_id": None, "company_id": None}


def test_agent_wide_writes_setting_is_validated():
    assert SecondaryScopeConfig.from_value({"agentWideWrites": "deny"}).agent_wide_writes == "deny"
    assert SecondaryScopeConfig.from_value({}).agent_wide_writes is None
    with pytest.raises(ConfigError, match="agentWideWrites"):
        SecondaryScopeConfig.from_value({"agentWideWrites": "sometimes"})


# --------------------------------------------------------------------------- failures


class SwitchEmbedder:
    """HashEmbedder that raises while ``broken`` is set."""

    def __init__(self):
        self.inner = HashEmbedder(dim=64)
        self.model_id = "switch-hash-64"
        self.dim = 64
        self.broken = False

    def embed(self, texts):
        if self.broken:
            raise RuntimeError("embedding service down")
        return self.inner.embed(texts)


def test_search_failure_fails_open_and_writes(svc, agent, monkeypatch, caplog):
    svc.add_note("User likes pears.", agent_id=AGENT, user_id="u1", company_id="c1")

    def broken(*a, **k):
        raise RuntimeError("vector index unavailable")

    monkeypatch.setattr(svc.store.notes, "vector_search", broken)  # the per-write path
    monkeypatch.setattr(svc.store.notes, "scan_with_vectors", broken)  # the batched path
    monkeypatch.setattr(svc.store.notes, "scan_arrow", broken)  # ... through the read cache
    monkeypatch.setattr(svc.store.notes, "scan_with_row_ids", broken)  # ... its ranking read
    svc.store.notes.journal.clear()  # read from the table, not from this process's own writes
    with caplog.at_level(logging.WARNING, logger="memory_pipelines.writes"):
        [r] = svc.write(ctx(), [w("User likes pears.")])
    assert r.disposition == "written"  # no dedupe possible: a new note (fail-open)
    assert "near-dup check failed — proceeding fail-open with the write" in caplog.text
    assert "vector index unavailable" in caplog.text
    assert len(svc.notes()) == 2


def test_embedding_failure_is_an_error_that_an_identical_retry_can_fix(home, clock, caplog):
    emb = SwitchEmbedder()
    with MemoryService.open(home, embedder=emb, clock=clock) as s:
        s.configure_agent(AGENT)
        emb.broken = True
        with caplog.at_level(logging.WARNING, logger="memory_pipelines.writes"):
            [r] = s.write(ctx(), [w("User likes plums.")])
        assert r.disposition == "error"
        assert r.reason == "Failed to save memory: embedding service down"
        assert "fail-open" in caplog.text
        assert len(s.notes()) == 0
        step = s.sources.steps("run-1", "Memory Write")[0]
        assert (step["status"], step["error_message"]) == ("Failed", r.reason)
        emb.broken = False
        [again] = s.write(ctx(), [w("User likes plums.")])
        assert again.disposition == "written"


def test_save_failures_are_errors_and_are_not_registered(svc, agent, monkeypatch):
    real_save = svc.notebook.save_notes
    real_upsert = svc.store.notes.upsert

    def failing_save(*a, **k):
        raise RuntimeError("disk full")

    def failing_upsert(*a, **k):
        raise RuntimeError("disk full")

    existing = svc.add_note("User likes kiwis.", agent_id=AGENT, user_id="u1", company_id="c1")
    [own] = svc.write(ctx(), [w("User likes figs.")])

    monkeypatch.setattr(svc.notebook, "save_notes", failing_save)
    results = svc.write(ctx(), [w("User likes dates."), w("User likes figs!")])
    assert [(r.disposition, r.reason) for r in results] == [
        ("error", "Failed to save memory: disk full"),
        ("error", "Failed to supersede own note: disk full"),
    ]
    monkeypatch.setattr(svc.notebook, "save_notes", real_save)
    monkeypatch.setattr(svc.store.notes, "upsert", failing_upsert)
    [r] = svc.write(ctx(), [w("User likes kiwis.")])
    assert (r.disposition, r.reason) == ("error", "Failed to update existing note: disk full")
    monkeypatch.setattr(svc.store.notes, "upsert", real_upsert)

    retry = svc.write(
        ctx(), [w("User likes dates."), w("User likes figs!"), w("User likes kiwis.")]
    )
    assert dispositions(retry) == ["written", "superseded-own", "deduped"]
    assert retry[1].note_id == own.note_id
    assert svc.get_note(existing.id).access_count == 1


def test_notes_that_cannot_be_loaded_are_errors(svc, agent, monkeypatch):
    existing = svc.add_note("User likes limes.", agent_id=AGENT, user_id="u1", company_id="c1")
    [own] = svc.write(ctx(), [w("User likes lemons.")])
    monkeypatch.setattr(svc.store.notes, "get", lambda note_id: None)
    results = svc.write(ctx(), [w("User likes lemons!"), w("User likes limes.")])
    assert [(r.disposition, r.reason) for r in results] == [
        ("error", f"Could not load own note {own.note_id} to supersede."),
        ("error", f"Could not load existing note {existing.id} to dedupe against."),
    ]


def test_a_crash_between_saving_and_committing_cannot_duplicate(svc, agent, monkeypatch):
    real_claim = svc.sources.ledger_claim

    def crash(rows):
        raise SourceError("connection lost")

    monkeypatch.setattr(svc.sources, "ledger_claim", crash)
    with pytest.raises(SourceError):
        svc.write(ctx(), [w("User studies Finnish.")])
    assert len(svc.notes()) == 1  # saved, not yet committed to the ledger
    monkeypatch.setattr(svc.sources, "ledger_claim", real_claim)
    [r] = svc.write(ctx(), [w("User studies Finnish.")])
    assert r.disposition == "written"  # not mistaken for a pre-existing note
    notes = svc.notes()
    assert list(notes["id"]) == [r.note_id]


# --------------------------------------------------------------------------- gate


def test_the_gate_skips_everything_and_records_one_step(svc, clock):
    svc.configure_agent(AGENT, allow_memory_write=False)
    batch = [w("User likes tea."), "junk", w("Obey.", "Constraint")]
    results = svc.write(ctx(), batch)
    assert dispositions(results) == ["skipped-disabled"] * 3
    assert all(r.reason == REASON_DISABLED and r.note_id is None for r in results)
    assert [r.request for r in results] == batch
    assert len(svc.notes()) == 0
    steps = svc.sources.steps("run-1")
    assert len(steps) == 1
    step = steps[0]
    assert (step["step_type"], step["step_name"], step["status"]) == (
        "Tool",
        GATE_STEP_NAME,
        "Completed",
    )
    assert step["step_name"] == "Memory Writes: skipped (AllowMemoryWrite=false)"
    assert step["input_json"] == {"requestedWriteCount": 3}
    assert step["output_json"] == {"skipped": True, "reason": "AllowMemoryWrite=false"}
    assert (step["agent_id"], step["user_id"]) == (AGENT, "u1")
    assert svc.format_write_feedback(results) == GATE_FEEDBACK
    assert "NOT saved" in GATE_FEEDBACK
    assert svc.write_instructions(AGENT) == ""


# --------------------------------------------------------------------------- audit


def test_one_audit_step_per_write_with_the_reference_fields(svc, agent):
    results = svc.write(
        ctx(),
        [
            w("User likes tea.", hint="agent"),
            w("User likes tea.", hint="agent"),
            w("Obey.", "Constraint"),
        ],
    )
    steps = svc.sources.steps("run-1")
    assert [s["step_name"] for s in steps] == ["Memory Write"] * 3
    assert all(s["step_type"] == "Tool" for s in steps)
    assert all((s["agent_id"], s["user_id"]) == (AGENT, "u1") for s in steps)
    assert [s["status"] for s in steps] == ["Completed", "Completed", "Failed"]
    assert steps[0]["input_json"] == {
        "note": "User likes tea.",
        "type": "Preference",
        "scopeHint": "agent",
    }
    assert steps[2]["input_json"] == {"note": "Obey.", "type": "Constraint", "scopeHint": None}
    for step, r in zip(steps, results, strict=True):
        out = step["output_json"]
        assert set(out) == {"disposition", "noteId", "finalScope", "reason", "durationMs"}
        assert (out["disposition"], out["noteId"], out["finalScope"], out["reason"]) == (
            r.disposition,
            r.note_id,
            r.final_scope,
            r.reason,
        )
        assert out["durationMs"] == pytest.approx(r.duration_ms, abs=0.001)
    assert steps[0]["error_message"] is None
    assert steps[2]["error_message"] == results[2].reason


# --------------------------------------------------------------------------- feedback


def test_feedback_text_is_byte_exact():
    one = [WriteResult(disposition="written", reason=REASON_WRITTEN, request=w("User likes tea."))]
    assert format_write_feedback(one) == (
        "Memory write result:\n"
        '1. "User likes tea." — **written**: Memory recorded. It is active immediately and will be'
        " reviewed by the Memory Manager."
    )
    long_text = "x" * 130
    many = [
        WriteResult(disposition="deduped", reason=REASON_DEDUPED, request=MemoryWrite(note="A b.")),
        WriteResult(disposition="skipped-cap", reason=CAP_REASON_5, request=w(long_text)),
        WriteResult(disposition="rejected-type", reason="r", request="junk"),
        WriteResult(disposition="written", reason="ok", request=w("y" * 120)),
    ]
    assert format_write_feedback(many) == "\n".join(
        [
            "Memory write results (4 writes):",
            '1. "A b." — **deduped**: This memory already exists verbatim — its relevance was'
            " reinforced instead of duplicating it.",
            f'2. "{"x" * 120}…" — **skipped-cap**: {CAP_REASON_5}',
            '3. "" — **rejected-type**: r',
            f'4. "{"y" * 120}" — **written**: ok',
        ]
    )
    assert format_write_feedback([]) == ""


def test_feedback_keeps_one_line_per_write(svc, agent):
    results = svc.write(ctx(), [w("User likes\ntea."), w("User likes coffee.")])
    text = svc.format_write_feedback(results)
    assert text.splitlines()[0] == "Memory write results (2 writes):"
    assert text.splitlines()[1].startswith('1. "User likes tea." — **written**: ')
    assert len(text.splitlines()) == 3


def test_every_disposition_is_known():
    assert DISPOSITIONS == (
        "written",
        "superseded-own",
        "deduped",
        "skipped-duplicate",
        "skipped-cap",
        "rejected-type",
        "skipped-disabled",
        "error",
    )


# --------------------------------------------------------------------------- instructions


def test_write_instructions_document_the_field_and_follow_the_config(open_service):
    with open_service(write_config=WriteConfig(max_writes_per_run=3)) as s:
        s.configure_agent(AGENT)
        text = s.write_instructions(AGENT)
        assert text.startswith("## Durable Memory")
        for needle in (
            "memoryWrites",
            '"note"',
            '"type": "Preference"',
            '"Preference" or "Context" only',
            "scopeHint",
            '"agent"',
            "At most 3 new memories",
            "NEXT turn",
            "Never claim a memory was saved",
            "NOT saved",
            "Memory Manager",
        ):
            assert needle in text, needle
        s.configure_agent(AGENT, allow_memory_write=False)
        assert s.write_instructions(AGENT) == ""
        with pytest.raises(UnknownAgentError):
            s.write_instructions("nobody")


# --------------------------------------------------------------------------- continuity


def test_within_run_state_survives_a_restart(open_service):
    with open_service() as s1:
        s1.configure_agent(AGENT)
        pre = s1.add_note("User owns a kayak.", agent_id=AGENT, user_id="u1", company_id="c1")
        first = s1.write(
            ctx(),
            [
                w("User fact alpha."),
                w("User fact bravo."),
                w("User fact charlie."),
                w("User owns a kayak."),
            ],
        )
        assert dispositions(first) == ["written"] * 3 + ["deduped"]
    with open_service() as s2:
        results = s2.write(
            ctx(),
            [
                w("User fact alpha."),  # idempotency survives
                w("User owns a kayak."),  # the dedupe was registered
                w("User fact bravo!"),  # own-note map survives
                w("User fact delta."),
                w("User fact echo."),
                w("User fact foxtrot."),  # cap count survives
            ],
        )
        assert dispositions(results) == [
            "skipped-duplicate",
            "skipped-duplicate",
            "superseded-own",
            "written",
            "written",
            "skipped-cap",
        ]
        assert results[2].note_id == first[1].note_id
        assert s2.get_note(pre.id).access_count == 1
        assert len(s2.notes()) == 6


_WORKER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from memory_pipelines import MemoryService, RunContext
    from memory_pipelines.embeddings import HashEmbedder
    from memory_pipelines.clock import FakeClock

    home, tag, n_runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    svc = MemoryService.open(home, embedder=HashEmbedder(dim=64), clock=FakeClock())
    Path(home, f"ready-{tag}").touch()
    while not Path(home, "go").exists():
        time.sleep(0.01)
    out = []
    for i in range(n_runs):
        c = RunContext(agent_id="agent-1", run_id=f"{tag}-run-{i}", user_id=f"user-{tag}-{i}")
        batch = [{"note": f"Process {tag} run {i} fact {j} {'x' * j}.", "type": "Context"} for j in range(5)]
        out += [r.disposition for r in svc.write(c, batch)]
        # Both processes also write the SAME run with the same batch, past the cap.
        c = RunContext(agent_id="agent-1", run_id=f"shared-{i}", user_id="shared-user")
        shared = [{"note": f"Shared run {i} fact {word}.", "type": "Context"}
                  for word in ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf")]
        out += ["shared:" + r.disposition for r in svc.write(c, shared)]
    svc.close()
    print(json.dumps(out))
    """
)


def test_two_processes_write_to_the_same_home_at_once(svc, agent, home):
    n_runs = 4
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(home), tag, str(n_runs)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for tag in ("A", "B")
    ]
    deadline = time.monotonic() + 120
    while not all((home / f"ready-{t}").exists() for t in ("A", "B")):
        assert time.monotonic() < deadline, "workers did not start"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.05)
    (home / "go").touch()
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=240)
        assert p.returncode == 0, stderr
        outs.append(json.loads(stdout.strip().splitlines()[-1]))

    own = [d for out in outs for d in out if not d.startswith("shared:")]
    assert own == ["written"] * (2 * n_runs * 5)  # no lost write
    notes = svc.notes()
    assert notes["id"].is_unique  # no duplicate rows
    assert len(notes) == len(set(notes["note"]))  # no duplicate notes
    for tag in ("A", "B"):
        for i in range(n_runs):
            assert (notes["source_run_id"] == f"{tag}-run-{i}").sum() == 5

    shared = [d.split(":", 1)[1] for out in outs for d in out if d.startswith("shared:")]
    assert set(shared) <= {"written", "skipped-duplicate", "skipped-cap", "superseded-own"}
    for i in range(n_runs):
        run_notes = notes[notes["source_run_id"] == f"shared-{i}"]
        assert 1 <= len(run_notes) <= 5  # the cap holds across the two writers
        rows = svc.sources.ledger_rows(f"shared-{i}")
        written = {r["note_id"] for r in rows if r["disposition"] == "written"}
        assert written == set(run_notes["id"])
        assert len(written) == sum(r["disposition"] == "written" for r in rows)
    assert shared.count("written") == len(notes[notes["source_run_id"].str.startswith("shared-")])


def _claim_as_other_writer(svc, key: str, note_id: str, slot: int) -> None:
    scope = "agent-1|u1|c1"
    assert svc.sources.ledger_claim(
        [
            {
                "run_id": "run-1",
                "key": ledger_key(scope, key),
                "note_id": note_id,
                "scope_key": scope,
                "disposition": "written",
            },
            {
                "run_id": "run-1",
                "key": f"{SLOT_KEY_PREFIX}{slot}",
                "note_id": note_id,
                "scope_key": scope,
                "disposition": SLOT_DISPOSITION,
            },
        ]
    )


def test_losing_the_commit_to_another_writer_of_the_same_write(svc, agent, monkeypatch):
    """The other writer saved the same deterministic id at the same time (LanceDB can keep
    both rows) and committed first: we report a repeat and leave one row."""
    real_save = svc.notebook.save_notes

    def racing_save(notes, vectors=None):
        saved = real_save(notes, vectors)
        svc.store.notes.add(saved, vectors)  # the other writer's concurrent insert
        _claim_as_other_writer(svc, "user speaks welsh.", saved[0].id, slot=1)
        return saved

    monkeypatch.setattr(svc.notebook, "save_notes", racing_save)
    [r] = svc.write(ctx(), [w("User speaks Welsh.")])
    assert (r.disposition, r.reason) == ("skipped-duplicate", REASON_DUPLICATE)
    assert list(svc.notes()["id"]) == [r.note_id]


def test_a_cap_filled_by_another_writer_removes_the_note_we_saved(monkeypatch, open_service):
    with open_service(write_config=WriteConfig(max_writes_per_run=1)) as s:
        s.configure_agent(AGENT)
        real_save = s.notebook.save_notes

        def racing_save(notes, vectors=None):
            saved = real_save(notes, vectors)
            _claim_as_other_writer(s, "user speaks basque.", "other-note", slot=1)
            return saved

        monkeypatch.setattr(s.notebook, "save_notes", racing_save)
        [r] = s.write(ctx(), [w("User speaks Welsh.")])
        assert (r.disposition, r.reason) == ("skipped-cap", cap_reason(1))
        assert len(s.notes()) == 0
        rows = s.sources.ledger_rows("run-1")
        assert {row["note_id"] for row in rows} == {"other-note"}


@pytest.mark.parametrize("kind", ["supersede", "dedupe"])
def test_losing_a_supersede_or_dedupe_commit_reports_a_repeat(svc, agent, monkeypatch, kind):
    existing = svc.add_note("User likes okra.", agent_id=AGENT, user_id="u1", company_id="c1")
    [own] = svc.write(ctx(), [w("User likes yams.")])
    real_claim = svc.sources.ledger_claim

    def racing_claim(rows):
        assert real_claim(rows)  # another writer of the run commits the same key first
        return real_claim(rows)

    monkeypatch.setattr(svc.sources, "ledger_claim", racing_claim)
    text = "User likes yams!" if kind == "supersede" else "User likes okra."
    [r] = svc.write(ctx(), [w(text)])
    assert (r.disposition, r.reason) == ("skipped-duplicate", REASON_DUPLICATE)
    assert r.note_id == (own.note_id if kind == "supersede" else existing.id)
    assert svc.get_note(own.note_id).note == "User likes yams."
    assert svc.get_note(existing.id).access_count == 0


def test_long_non_ascii_notes_have_short_ledger_keys(svc, agent):
    text = "用户喜欢喝绿茶" * 285  # 1995 characters, about 6 kB of UTF-8
    results = svc.write(ctx(), [w(text), w(f"  {text}  ")])
    assert dispositions(results) == ["written", "skipped-duplicate"]
    [row] = [r for r in svc.sources.ledger_rows("run-1") if r["disposition"] == "written"]
    assert row["key"] == ledger_key("agent-1|u1|c1", normalize(text))
    assert len(row["key"]) < 100


def test_the_write_benchmark_runs_and_exercises_every_path(tmp_path, capsys):
    from memory_pipelines.bench.writes import main

    argv = ["--sizes", "300", "--runs", "2", "--embedder", "hash", "--prefill", "hash"]
    assert main([*argv, "--home", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "writes/s" in out and "bare add 1 row" in out
    assert "300: deduped 2, superseded-own 2, written 6" in out


def test_the_write_benchmark_measures_agents_writing_at_once(tmp_path, capsys):
    from memory_pipelines.bench.writes import main

    argv = ["--sizes", "300", "--runs", "4", "--embedder", "hash", "--prefill", "hash"]
    assert main([*argv, "--agents", "2", "--home", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| 2 agents, grouped " in out and "| 2 agents, alone " in out
    # 2 agents x 2 runs x 5 writes per mode (4 runs, as --runs), each run shaped as above
    assert "300 2 agents, grouped: deduped 4, superseded-own 4, written 12" in out
    assert "300 2 agents, alone: deduped 4, superseded-own 4, written 12" in out
    with pytest.raises(SystemExit):
        main([*argv, "--agents", "0"])


def test_the_write_benchmark_reports_medians_of_repeats(tmp_path, capsys):
    from memory_pipelines.bench.writes import PARTS, _ModeStats, _Repeat, combine, main

    def repeat(run_ms: float) -> _Repeat:
        st = _ModeStats(runs_ms=[run_ms] * 4)
        for k in PARTS:
            st.parts[k] = [run_ms / 10] * 4
        return _Repeat({"batched": st}, [1.0, 2.0, run_ms], 0.5)

    rows, base = combine(1000, "random", [repeat(100.0), repeat(50.0), repeat(250.0)])
    # 20 writes in 0.4 / 0.2 / 1.0 s: 50, 100 and 20 writes/s; the median run is 100 ms
    assert rows[0][:7] == ["1,000", "batched", "random", 60, "50.0 (20.0-100.0)", "100.0", "100.0"]
    assert base == ["1,000", "1.0", "2.0", "100.0"]

    argv = ["--sizes", "300", "--runs", "2", "--embedder", "hash", "--prefill", "hash"]
    assert main([*argv, "--repeats", "2", "--home", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "medians of 2 repeats" in out
    assert "300: deduped 4, superseded-own 4, written 12" in out  # both repeats' runs
    with pytest.raises(SystemExit):
        main([*argv, "--repeats", "0"])


# --------------------------------------------------------------------------- runs per agent


def test_a_run_id_used_by_another_agent_never_consumes_this_agents_cap(open_service):
    """CONTRACT §2.8: within-run state belongs to one run of one agent."""
    with open_service(write_config=WriteConfig(max_writes_per_run=2)) as s:
        s.configure_agent("agent-a")
        s.configure_agent("agent-b")
        a = ctx("r1", agent_id="agent-a")
        b = ctx("r1", agent_id="agent-b")
        first = s.write(a, [w("User speaks Welsh."), w("User likes okra."), w("User owns a cat.")])
        assert dispositions(first) == ["written", "written", "skipped-cap"]
        # the same text in the same run id by another agent: its own key, its own cap
        second = s.write(
            b, [w("User speaks Welsh."), w("User speaks Welsh."), w("User has a dog.")]
        )
        assert dispositions(second) == ["written", "skipped-duplicate", "written"]
        assert dispositions(s.write(b, [w("User rides bikes.")])) == ["skipped-cap"]
        assert dispositions(s.write(a, [w("User speaks Welsh.")])) == ["skipped-duplicate"]
        rows_b = s.sources.ledger_rows("r1", agent_id="agent-b")
        assert {r["agent_id"] for r in rows_b} == {"agent-b"}
        assert sum(r["disposition"] == "written" for r in rows_b) == 2
        assert len(s.sources.ledger_rows("r1")) == 2 * len(rows_b)


def test_an_old_home_write_ledger_gains_the_agent_column(home, open_service):
    """A home whose write_ledger predates the agent column (keyed by run id alone) is
    migrated on open: its rows keep their state, attributed to the agent of their scope."""
    import sqlite3

    # a whole home (note store included) whose ledger table then takes the old shape
    open_service().close()
    db = sqlite3.connect(home / "memory.sqlite3")
    db.executescript(
        """
        DROP TABLE alembic_version;
        DROP TABLE write_ledger;
        CREATE TABLE write_ledger (
            run_id VARCHAR(200) NOT NULL, key TEXT NOT NULL, note_id VARCHAR(200) NOT NULL,
            scope_key TEXT NOT NULL, disposition VARCHAR(30) NOT NULL,
            created_at DATETIME NOT NULL, PRIMARY KEY (run_id, key));
        INSERT INTO write_ledger VALUES
            ('r1', 'agent-a|u1|c1|k1', 'n1', 'agent-a|u1|c1', 'written', '2026-01-01 00:00:00'),
            ('r1', '#slot:1', 'n1', 'agent-a|u1|c1', 'cap-slot', '2026-01-01 00:00:00');
        """
    )
    db.commit()
    db.close()
    with open_service(write_config=WriteConfig(max_writes_per_run=1)) as s:
        rows = s.sources.ledger_rows("r1", agent_id="agent-a")
        assert {(r["key"], r["agent_id"]) for r in rows} == {
            ("agent-a|u1|c1|k1", "agent-a"),
            ("#slot:1", "agent-a"),
        }
        s.configure_agent("agent-a")
        s.configure_agent("agent-b")
        # the old run's state still counts for its agent, and only for it
        assert dispositions(s.write(ctx("r1", agent_id="agent-a"), [w("User x.")])) == [
            "skipped-cap"
        ]
        assert dispositions(s.write(ctx("r1", agent_id="agent-b"), [w("User x.")])) == ["written"]
    # opening the migrated home again is a no-op
    with open_service() as s:
        assert len(s.sources.ledger_rows("r1")) == 4


def test_a_run_row_of_one_agent_is_not_taken_over_by_another(svc):
    svc.add_agent_run("r1", "agent-a", user_id="u1")
    svc.add_agent_run("r1", "agent-a", user_id="u1", summary="updated by its own agent")
    with pytest.raises(ValidationError, match="another agent"):
        svc.add_agent_run("r1", "agent-b", user_id="u2")
    run = svc.sources.get_agent_run("r1")
    assert (run["agent_id"], run["user_id"]) == ("agent-a", "u1")
    assert run["summary"] == "updated by its own agent"
