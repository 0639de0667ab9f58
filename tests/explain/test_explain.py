"""``svc.explain``: one verdict per reason a note is (not) injected, the lineage, the
write disposition, TTL/decay retirement, and the JSON, HTTP and CLI forms."""

from __future__ import annotations

import json
from datetime import timedelta

import httpx
import pytest
from reliability_helpers import running

from memory_pipelines.apps.cli import main as cli_main
from memory_pipelines.apps.cli import why_command as main
from memory_pipelines.apps.http import create_app
from memory_pipelines.config import DecayConfig
from memory_pipelines.errors import UnknownAgentError, ValidationError
from memory_pipelines.explain import Explanation, days_to_floor
from memory_pipelines.note_events import Actor, EventKind, note_event
from memory_pipelines.notes import Note
from memory_pipelines.phases.contradiction_rules import resolved_comment
from memory_pipelines.phases.ebbinghaus import decay_note, expiry_comment

AGENT = "agent-1"
CTX = {"agent_id": AGENT, "user_id": "u1", "company_id": "c1"}


def retire(svc, note, changes, kind, *, phase=None, related=(), **details):
    """Change a note as a Memory Manager phase does: the save and its event together."""
    after = Note.model_validate({**note.model_dump(), **changes})
    actor = Actor.ANALYST if kind == EventKind.RESTORED else Actor.MANAGER
    event = note_event(kind, after, before=note, actor=actor, phase=phase, related=related, **details)
    return svc.notebook.save_notes([after], events=[event])


def by_text(expl: Explanation, text: str):
    (found,) = [n for n in expl.notes if n.note == text]
    return found


@pytest.fixture
def agent(svc):
    return svc.configure_agent(AGENT, note_injection_strategy="Recent", max_notes_to_inject=2)


# --------------------------------------------------------------------------- verdicts


def test_not_injectable_status(svc, agent):
    svc.add_note("User likes kayaking", agent_id=AGENT, status="Archived")
    svc.add_note("User kayaking trip pending", agent_id=AGENT, status="Pending")
    expl = svc.explain(CTX, "kayaking")
    archived = by_text(expl, "User likes kayaking")
    assert archived.verdict == "not injectable: Archived"
    assert archived.code == "not-injectable" and archived.injectable is False
    assert archived.scope.in_scope and archived.scope.level == 5
    assert archived.scope.label == "Agent-specific"
    assert archived.rank.rank is None and "filtered out" in archived.rank.detail
    assert by_text(expl, "User kayaking trip pending").verdict == "not injectable: Pending"
    assert expl.injected_note_ids == []


def test_out_of_scope_names_the_rule(svc, agent):
    svc.add_note("User u2 drinks coffee", agent_id=AGENT, user_id="u2")
    svc.add_note("Company c2 coffee policy", agent_id=AGENT, company_id="c2")
    svc.add_note("Other agent coffee note", agent_id="agent-2")
    svc.add_note("User u1 drinks coffee", agent_id=AGENT, user_id="u1", company_id="c1")
    expl = svc.explain(CTX, "coffee", all_agents=True, all_scopes=True)
    u2 = by_text(expl, "User u2 drinks coffee")
    assert u2.verdict == "out of scope: belongs to user u2, context user is u1"
    assert u2.code == "out-of-scope" and u2.scope.level == 2
    assert by_text(expl, "Company c2 coffee policy").scope.rule == (
        "belongs to company c2, context company is c1"
    )
    assert by_text(expl, "Other agent coffee note").scope.rule.startswith("different agent")
    mine = by_text(expl, "User u1 drinks coffee")
    assert mine.scope.in_scope and mine.scope.level == 1
    assert mine.scope.label == "Agent + User + Company specific"
    assert mine.verdict == "injected (rank 1 of 1)"
    # without all_agents, another agent's notes are not searched at all
    assert "Other agent coffee note" not in [
        n.note for n in svc.explain(CTX, "coffee", all_scopes=True).notes
    ]
    # without all_scopes (the agent-facing view), out-of-scope notes are not shown
    assert [n.note for n in svc.explain(CTX, "coffee").notes] == ["User u1 drinks coffee"]
    # a context without a user never sees user-specific notes
    no_user = svc.explain({"agent_id": AGENT}, "coffee", all_scopes=True)
    assert by_text(no_user, "User u2 drinks coffee").scope.rule == (
        "user-specific note but the context has no user (the note belongs to user u2)"
    )


def test_out_of_scope_secondary_dimension_strict_mismatch(svc):
    svc.configure_agent(
        AGENT,
        scope_config={"dimensions": [{"name": "region", "inheritanceMode": "strict"}]},
    )
    svc.add_note(
        "Region pricing in dollars",
        agent_id=AGENT,
        primary_scope_record_id="org-1",
        secondary_scopes={"region": "us"},
    )
    svc.add_note(
        "Region pricing in euros",
        agent_id=AGENT,
        primary_scope_record_id="org-1",
        secondary_scopes={"region": "eu"},
    )
    ctx = {
        "agent_id": AGENT,
        "primary_scope_record_id": "org-1",
        "secondary_scopes": {"region": "eu"},
    }
    expl = svc.explain(ctx, "pricing", all_scopes=True)
    us = by_text(expl, "Region pricing in dollars")
    assert us.verdict.startswith("out of scope: secondary scope dimension region strict mismatch")
    assert "region=us" in us.scope.rule and "eu" in us.scope.rule
    eu = by_text(expl, "Region pricing in euros")
    assert eu.scope.in_scope and eu.scope.label == "User-specific (most specific)"
    assert eu.verdict.startswith("injected")
    # the agent-facing view shows only the note of the context's region
    assert [n.note for n in svc.explain(ctx, "pricing").notes] == ["Region pricing in euros"]
    # a context without the primary scope sees neither
    assert svc.explain({"agent_id": AGENT}, "pricing").notes == []
    bare = svc.explain({"agent_id": AGENT}, "pricing", all_scopes=True)
    assert by_text(bare, "Region pricing in euros").scope.rule == (
        "note has primary scope org-1 but the context has no primary scope"
    )


def test_below_the_cut_matches_injection(svc, agent, clock):
    base = clock() - timedelta(days=10)
    for i in range(4):
        svc.add_note(f"Budget fact {i}", agent_id=AGENT, created_at=base + timedelta(days=i))
    expl = svc.explain(CTX, "budget")
    assert by_text(expl, "Budget fact 3").verdict == "injected (rank 1 of 2)"
    assert by_text(expl, "Budget fact 2").verdict == "injected (rank 2 of 2)"
    oldest = by_text(expl, "Budget fact 0")
    assert oldest.verdict == "below the cut: rank 4 > max 2" and oldest.code == "below-cut"
    assert oldest.rank.rank == 4 and not oldest.rank.within_limit
    injection = svc.inject(CTX, "budget")
    assert expl.injected_note_ids == [n.id for n in injection.notes]
    seen = {n.note: n.provenance for n in svc.explain(CTX, "budget").notes}
    assert seen["Budget fact 3"].times_injected == 1
    assert seen["Budget fact 3"].last_injected_at == clock()
    assert seen["Budget fact 0"].times_injected == 0
    svc.configure_agent(AGENT, inject_notes=False)
    off = svc.explain(CTX, "budget")
    assert {n.code for n in off.notes} == {"injection-off"}
    assert "inject_notes is off" in off.notes[0].rank.detail


def test_explain_writes_nothing(svc, agent):
    svc.add_note("Budget fact", agent_id=AGENT)

    def state():
        notes = sorted((n.model_dump() for n in svc.store.notes.all()), key=lambda d: d["id"])
        return notes, len(svc.sources.injection_events_of()), len(svc.sources.steps())

    before = state()
    svc.explain({**CTX, "run_id": "r-explain"}, "budget")
    assert state() == before


def test_expired(svc, agent, clock):
    now = clock()
    svc.add_note(
        "Trip to Oslo", agent_id=AGENT, status="Provisional", expires_at=now - timedelta(days=1)
    )
    rome_note = svc.add_note("Trip to Rome", agent_id=AGENT, expires_at=now - timedelta(days=3))
    retire(
        svc,
        rome_note,
        {"status": "Archived", "comments": expiry_comment(now - timedelta(days=3)).strip()},
        EventKind.ARCHIVED,
        phase="decay",
        rule="ttl",
    )
    svc.add_note("Trip to Lima", agent_id=AGENT, expires_at=now + timedelta(days=3))
    expl = svc.explain(CTX, "trip")
    oslo = by_text(expl, "Trip to Oslo")
    assert oslo.verdict.startswith("expired on ") and oslo.code == "expired"
    assert oslo.retirement.expired and "next maintenance run archives it" in oslo.retirement.ttl
    rome = by_text(expl, "Trip to Rome")
    assert rome.verdict.startswith("expired: archived by TTL") and rome.code == "expired"
    assert [e.kind for e in rome.provenance.events] == ["created", "archived"]
    archived = rome.provenance.events[-1]
    assert archived.rule == "ttl" and archived.actor == "memory-manager"
    assert archived.status_before == "Active" and archived.status_after == "Archived"
    assert archived.at == clock()
    lima = by_text(expl, "Trip to Lima")
    assert lima.verdict.startswith("injected")
    assert "(in 3.0 days)" in lima.retirement.ttl


def test_merged_into_another_note_follows_the_lineage(svc, agent):
    survivor = svc.add_note(
        "User prefers window seats on flights",
        agent_id=AGENT,
        author_type="MemoryManager",
        is_auto_generated=True,
        derived_from_note_ids=["mid-1", "x-1"],
        consolidation_count=2,
        comments="Consolidated from 2 notes: same preference",
    )
    middle = svc.add_note(
        "User likes window seats on flights",
        id="mid-1",
        agent_id=AGENT,
        status="Revoked",
        author_type="MemoryManager",
        is_auto_generated=True,
        consolidated_into_note_id=survivor.id,
        comments=f"Consolidated into note {survivor.id}: same preference",
    )
    original = svc.add_note(
        "Window seats on flights please",
        agent_id=AGENT,
        status="Provisional",
        author_type="Agent",
        is_auto_generated=True,
    )
    (original,) = retire(
        svc,
        original,
        {
            "status": "Archived",
            "consolidated_into_note_id": middle.id,
            "comments": f"[Hardening: duplicate of {middle.id} — same meaning]",
        },
        EventKind.DEDUPED,
        phase="hardening",
        related=[middle.id],
        rule="hardening-dedupe",
        reason="same meaning",
    )
    svc.add_note("Window seats always", id="x-1", agent_id=AGENT, status="Revoked")
    expl = svc.explain(CTX, "window seats")
    orig = by_text(expl, original.note)
    assert orig.verdict == f"merged into {middle.id} (survivor {survivor.id}, Active)"
    assert orig.code == "merged"
    assert orig.lineage.merged_into == [middle.id, survivor.id]
    created, event = orig.provenance.events
    assert created.kind == "created" and created.status_after == "Provisional"
    assert event.kind == "deduped" and event.related_note_id == middle.id
    assert event.detail == "same meaning" and event.rule == "hardening-dedupe"
    assert event.at == original.updated_at
    mid = by_text(expl, middle.note)
    assert mid.verdict == f"merged into {survivor.id} (Active)"
    assert mid.lineage.absorbed == [original.id]
    top = by_text(expl, survivor.note)
    assert top.provenance.origin.startswith("consolidated by the Memory Manager from 2 notes")
    assert top.lineage.derived_from == ["mid-1", "x-1"]
    assert set(top.lineage.all_sources) == {"mid-1", "x-1", original.id}
    assert top.verdict.startswith("injected")


def test_revoked_by_contradiction(svc, agent):
    keep = svc.add_note("User is vegetarian", agent_id=AGENT)
    lost = svc.add_note("User is not vegetarian", agent_id=AGENT)
    retire(
        svc,
        lost,
        {
            "status": "Revoked",
            "consolidated_into_note_id": keep.id,
            "comments": resolved_comment(keep.id, "newer by 7 days"),
        },
        EventKind.REVOKED,
        phase="contradictions",
        related=[keep.id],
        rule="contradiction",
        reason="newer by 7 days",
    )
    expl = svc.explain(CTX, "vegetarian")
    revoked = by_text(expl, lost.note)
    assert revoked.verdict == f"revoked by contradiction with {keep.id}"
    assert revoked.code == "revoked-contradiction"
    event = revoked.provenance.events[-1]
    assert event.kind == "revoked" and event.detail == "newer by 7 days"
    assert event.related_note_ids == [keep.id] and event.phase == "contradictions"


def test_a_comment_marker_alone_is_not_an_event(svc, agent):
    """The verdict follows the events: a note whose comments say it lost a contradiction
    but whose events do not is explained from its fields (merged), not from the text."""
    keep = svc.add_note("User is vegetarian", agent_id=AGENT)
    lost = svc.add_note(
        "User is not vegetarian",
        agent_id=AGENT,
        status="Revoked",
        consolidated_into_note_id=keep.id,
        comments=resolved_comment(keep.id, "newer by 7 days"),
    )
    revoked = by_text(svc.explain(CTX, "vegetarian"), lost.note)
    assert revoked.code == "merged"
    assert [e.kind for e in revoked.provenance.events] == ["created"]


def test_a_note_without_events_explains_from_its_fields(svc, agent):
    """A note stored before events existed (no ``created`` row) still gets its verdict,
    lineage and origin from its columns."""
    keep = svc.add_note("User is vegetarian", agent_id=AGENT)
    old = svc.add_note(
        "User eats no meat", agent_id=AGENT, status="Archived", consolidated_into_note_id=keep.id
    )
    svc.sources.delete_note_events(note_ids=[old.id])
    gone = by_text(svc.explain(CTX, "meat"), old.note)
    assert gone.provenance.events == []
    assert gone.verdict == f"merged into {keep.id} (Active)" and gone.code == "merged"
    assert gone.provenance.origin == "added manually (author User)"


def test_restored_note_is_not_explained_as_retired(svc, agent):
    note = svc.add_note("User likes tea", agent_id=AGENT)
    (note,) = retire(svc, note, {"status": "Archived"}, EventKind.ARCHIVED, phase="decay", rule="decay")
    assert by_text(svc.explain(CTX, "tea"), note.note).verdict == (
        "not injectable: Archived (importance decayed below the floor)"
    )
    (note,) = retire(svc, note, {"status": "Active"}, EventKind.RESTORED, rule="restore")
    retire(svc, note, {"status": "Archived"}, EventKind.STATUS_CHANGED)
    assert by_text(svc.explain(CTX, "tea"), note.note).verdict == "not injectable: Archived"


def test_in_flight_write_shows_its_disposition(svc, agent):
    ctx = {**CTX, "run_id": "run-1", "conversation_id": "conv-1"}
    (result,) = svc.write(ctx, [{"note": "User prefers aisle seats", "type": "Preference"}])
    assert result.disposition == "written"
    (again,) = svc.write({**ctx, "run_id": "run-2"}, [{"note": "User prefers aisle seats"}])
    assert again.disposition == "deduped" and again.note_id == result.note_id
    expl = svc.explain(CTX, "aisle seats")
    note = by_text(expl, "User prefers aisle seats")
    assert [(w.run_id, w.disposition) for w in note.provenance.writes] == [
        ("run-1", "written"),
        ("run-2", "deduped"),
    ]
    assert note.provenance.writes[0].final_scope == {
        "agent_id": AGENT,
        "user_id": "u1",
        "company_id": "c1",
    }
    assert (
        note.provenance.origin
        == "written in flight by the agent in run run-1 (disposition written)"
    )
    assert note.provenance.source_conversation_id == "conv-1"
    assert note.status == "Provisional" and note.verdict.startswith("injected")
    assert "unless hardening promotes it first" in note.retirement.ttl


def test_decay_retirement_matches_the_decay_rule(svc, agent, clock):
    now = clock()
    note = svc.add_note(
        "Decaying fact about gardens",
        agent_id=AGENT,
        author_type="MemoryManager",
        is_auto_generated=True,
        importance_score=5.0,
        access_count=1,
    )
    expl = svc.explain(CTX, "gardens")
    ret = by_text(expl, note.note).retirement
    assert ret.decay_applies and ret.retires_at is not None
    cfg = DecayConfig()
    assert ret.retires_at == now + timedelta(days=days_to_floor(5.0, 1, "Standard", cfg))
    before = decay_note(note, ret.retires_at - timedelta(hours=1), cfg)
    after = decay_note(note, ret.retires_at + timedelta(minutes=1), cfg)
    assert before.outcome != "archive" and after.outcome == "archive"
    assert 15 < ret.days_left < 30

    protected = svc.add_note(
        "Protected fact about gardens",
        agent_id=AGENT,
        author_type="MemoryManager",
        is_auto_generated=True,
        importance_score=9.0,
        protection_tier="Protected",
    )
    immutable = svc.add_note(
        "Immutable fact about gardens",
        agent_id=AGENT,
        protection_tier="Immutable",
        is_auto_generated=True,
        importance_score=1.0,
    )
    human = svc.add_note("Human fact about gardens", agent_id=AGENT, importance_score=1.0)
    expl = svc.explain(CTX, "gardens")
    prot = by_text(expl, protected.note).retirement
    assert prot.decay.startswith("exempt until 2027-06-01")
    assert prot.retires_at == now + timedelta(days=365)
    assert by_text(expl, immutable.note).retirement.decay == "never decays (Immutable)"
    assert by_text(expl, human.note).retirement.decay.startswith("not decayed: not auto-generated")
    svc.configure_agent(AGENT, auto_archive_enabled=False)
    off = svc.explain(CTX, "gardens")
    assert "auto-archive is off" in by_text(off, note.note).retirement.decay


def test_days_to_floor_reference_numbers():
    cfg = DecayConfig()
    # importance 2 untouched: archived well before 30 days (reference acceptance US4.2)
    assert days_to_floor(2.0, 0, "Standard", cfg) < 30
    # Ephemeral doubles the rate; more accesses slow it down
    assert days_to_floor(5.0, 0, "Ephemeral", cfg) < days_to_floor(5.0, 0, "Standard", cfg)
    assert days_to_floor(5.0, 3, "Standard", cfg) > days_to_floor(5.0, 0, "Standard", cfg)
    assert days_to_floor(0.4, 0, "Standard", cfg) == 0.0


def test_substring_scan_finds_what_search_misses(svc, agent):
    svc.add_note("Prefers the XYZ-123 widget model", agent_id=AGENT)
    expl = svc.explain(CTX, "z-12")
    (only,) = expl.notes
    assert only.match.substring and only.match.score >= 1.0
    assert only.verdict == "injected (rank 1 of 1)"
    # under Relevant, an input the note shares nothing with does not retrieve it
    svc.configure_agent(AGENT, note_injection_strategy="Relevant")
    (missed,) = svc.explain(CTX, "z-12", current_input="quarterly revenue forecast").notes
    assert missed.code == "not-retrieved" and missed.rank.rank is None
    assert missed.verdict.startswith("not retrieved for this input under Relevant: cosine")
    (hit,) = svc.explain(CTX, "z-12", current_input="which widget model?").notes
    assert hit.verdict == "injected (rank 1 of 1)"


def test_invalid_arguments(svc, agent):
    with pytest.raises(ValidationError):
        svc.explain(CTX, "   ")
    with pytest.raises(ValidationError):
        svc.explain(CTX, "x", limit=0)
    with pytest.raises(UnknownAgentError):
        svc.explain({"agent_id": "nobody"}, "x")


def test_limit_and_json_round_trip(svc, agent):
    for i in range(12):
        svc.add_note(f"Hiking note {i}", agent_id=AGENT)
    expl = svc.explain(CTX, "hiking", limit=5)
    assert len(expl.notes) == 5
    data = json.loads(expl.model_dump_json())
    assert Explanation.model_validate(data) == expl
    assert data["agent"]["note_injection_strategy"] == "Recent"


# --------------------------------------------------------------------------- tenancy

X_CTX = {"agent_id": AGENT, "user_id": "usr-alpha", "company_id": "co-xray"}
Y_CTX = {"agent_id": AGENT, "user_id": "usr-bravo", "company_id": "co-yankee"}
HOSTILE_USERS = ["x' OR 1=1 --", "%", "*", "", None]


def tenant_notes(svc):
    """Company X's notes about a codeword, and one agent-wide note every context sees."""
    secret = svc.add_note(
        "The codeword is falcon", agent_id=AGENT, user_id="usr-alpha", company_id="co-xray"
    )
    company = svc.add_note("Company codeword policy: rotate", agent_id=AGENT, company_id="co-xray")
    shared = svc.add_note("Never say a codeword aloud", agent_id=AGENT)
    return secret, company, shared


def seen(data) -> str:
    """Everything an explanation says, as one text (notes, ids, verdicts, rules)."""
    return json.dumps(data if isinstance(data, dict) else data.model_dump(mode="json"))


def test_explain_never_shows_another_company_note(svc, agent):
    secret, company, shared = tenant_notes(svc)
    expl = svc.explain(Y_CTX, "codeword")
    assert [n.note_id for n in expl.notes] == [shared.id]
    assert expl.notes[0].verdict == "injected (rank 1 of 1)"
    for leaked in (secret.id, company.id, "falcon", "rotate", "usr-alpha", "co-xray"):
        assert leaked not in seen(expl)
    # the owning context still sees its notes, with why each is (not) injected
    mine = svc.explain(X_CTX, "codeword")
    assert {n.note_id for n in mine.notes} == {secret.id, company.id, shared.id}
    assert all(n.scope.in_scope for n in mine.notes)
    assert {n.code for n in mine.notes} == {"injected", "below-cut"}


@pytest.mark.parametrize("user", HOSTILE_USERS)
@pytest.mark.parametrize("company", [None, "co-yankee", "%", "x' OR 1=1 --"])
def test_explain_hostile_user_ids_see_nothing_of_other_tenants(svc, agent, user, company):
    secret, company_note, shared = tenant_notes(svc)
    expl = svc.explain({"agent_id": AGENT, "user_id": user, "company_id": company}, "codeword")
    assert [n.note_id for n in expl.notes] == [shared.id]
    assert "falcon" not in seen(expl) and "rotate" not in seen(expl)


def test_explain_all_scopes_is_the_operator_view(svc, agent):
    secret, company, shared = tenant_notes(svc)
    expl = svc.explain(Y_CTX, "codeword", all_scopes=True)
    assert expl.all_scopes
    assert {n.note_id for n in expl.notes} == {secret.id, company.id, shared.id}
    assert by_text(expl, "The codeword is falcon").verdict == (
        "out of scope: belongs to user usr-alpha, context user is usr-bravo"
    )


# --------------------------------------------------------------------------- HTTP


def test_http_explain(svc, agent):
    svc.add_note("User u2 drinks coffee", agent_id=AGENT, user_id="u2")
    svc.add_note("User u1 drinks coffee", agent_id=AGENT, user_id="u1")
    with running(create_app(svc)) as url, httpx.Client(base_url=url, timeout=60) as c:
        r = c.post("/v1/explain", json={"context": CTX, "topic": "coffee", "current_input": None})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body == svc.explain(CTX, "coffee").model_dump(mode="json") | {
            "generated_at": body["generated_at"]
        }
        verdicts = {n["note"]: n["verdict"] for n in body["notes"]}
        # another user's note is not shown to an agent-facing caller at all
        assert verdicts == {"User u1 drinks coffee": "injected (rank 1 of 1)"}
        missing = c.post("/v1/explain", json={"context": {"agent_id": "nobody"}, "topic": "coffee"})
        assert missing.status_code == 404 and "nobody" in missing.json()["detail"]
        empty = c.post("/v1/explain", json={"context": CTX, "topic": ""})
        assert empty.status_code == 422 and "topic" in empty.json()["detail"]
        blank = c.post("/v1/explain", json={"context": CTX, "topic": "   "})
        assert blank.status_code == 422 and "topic" in blank.json()["detail"]
        assert "/v1/explain" in c.get("/openapi.json").json()["paths"]


def test_http_explain_never_shows_another_tenant(svc, agent):
    secret, company, shared = tenant_notes(svc)
    with running(create_app(svc)) as url, httpx.Client(base_url=url, timeout=60) as c:
        for ctx in [Y_CTX, *({"agent_id": AGENT, "user_id": u} for u in HOSTILE_USERS)]:
            r = c.post("/v1/explain", json={"context": ctx, "topic": "codeword"})
            assert r.status_code == 200, r.text
            assert [n["note_id"] for n in r.json()["notes"]] == [shared.id]
            assert "falcon" not in r.text and secret.id not in r.text and company.id not in r.text
            # the body cannot ask for the operator view
            wide = c.post(
                "/v1/explain", json={"context": ctx, "topic": "codeword", "all_scopes": True}
            )
            assert wide.status_code == 422 and "falcon" not in wide.text


# --------------------------------------------------------------------------- CLI


def test_cli_table_and_json(svc, agent, home, capsys, monkeypatch):
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")  # the fixture's 64-d hashing model
    svc.add_note("User u2 drinks coffee", agent_id=AGENT, user_id="u2")
    kept = svc.add_note("User u1 drinks coffee", agent_id=AGENT, user_id="u1")
    argv = [
        "why",
        "--agent",
        AGENT,
        "--user",
        "u1",
        "--company",
        "c1",
        "--home",
        str(home),
        "coffee",
    ]
    assert cli_main(argv) == 0
    out = capsys.readouterr().out
    assert 'Why does agent agent-1 (not) remember "coffee"?' in out
    assert "verdict" in out.splitlines()[3] and "scope" in out.splitlines()[3]
    assert "injected (rank 1 of 1)" in out
    # scoped like the API: another user's note is not shown without --all-scopes
    assert "User u2 drinks coffee" not in out and "u2" not in out
    assert kept.id in out and "2 scope: in scope at lattice level 2 (Agent + User specific)" in out
    assert main([*argv[1:], "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [n["verdict"] for n in data["notes"] if n["note_id"] == kept.id] == [
        "injected (rank 1 of 1)"
    ]
    assert main(["--agent", "nobody", "--home", str(home), "coffee"]) == 1
    assert "unknown agent 'nobody'" in capsys.readouterr().err
    assert main([*argv[1:], "--all-scopes"]) == 0
    assert "out of scope: belongs to user u2, context user is u1" in capsys.readouterr().out


def test_cli_why_is_scoped_unless_all_scopes(svc, agent, home, capsys, monkeypatch):
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")  # the fixture's 64-d hashing model
    secret, company, shared = tenant_notes(svc)
    base = ["--agent", AGENT, "--home", str(home), "--json"]
    for extra in (
        ["--user", "usr-bravo", "--company", "co-yankee"],
        ["--user", "%"],
        ["--user", "*"],
        [],
    ):
        assert main([*base, *extra, "codeword"]) == 0
        out = capsys.readouterr().out
        assert [n["note_id"] for n in json.loads(out)["notes"]] == [shared.id]
        assert "falcon" not in out and secret.id not in out and company.id not in out
    assert (
        main([*base, "--user", "usr-bravo", "--company", "co-yankee", "--all-scopes", "codeword"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert {n["note_id"] for n in data["notes"]} == {secret.id, company.id, shared.id}
    assert data["all_scopes"] is True


def test_real_hardening_dedupe_is_explained(svc, agent):
    """The markers the Memory Manager really writes are parsed (not only hand-made ones)."""
    active = svc.add_note(
        "User prefers decaf espresso after lunch", agent_id=AGENT, user_id="u1", company_id="c1"
    )
    ctx = {**CTX, "run_id": "run-9"}
    (result,) = svc.write(
        ctx, [{"note": "User prefers decaf espresso after lunch!", "type": "Preference"}]
    )
    assert result.disposition == "written"  # near, not identical: left for hardening
    report = svc.manager.harden()
    assert report["deduped"] == 1
    expl = svc.explain(CTX, "decaf espresso")
    dup = next(n for n in expl.notes if n.note_id == result.note_id)
    assert dup.verdict == f"merged into {active.id} (Active)"
    # the explanation's lifecycle is the note's history (events, not comment markers)
    assert [(e.kind, e.related_note_ids, e.at) for e in dup.provenance.events] == [
        (e.event, e.related_note_ids, e.at) for e in svc.history(result.note_id)
    ]
    assert [w.disposition for w in dup.provenance.writes] == ["written"]
    kept = next(n for n in expl.notes if n.note_id == active.id)
    assert kept.lineage.absorbed == [result.note_id]
