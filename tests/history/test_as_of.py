"""Time travel: ``svc.inject(..., as_of=...)`` answers what the service would have injected
then, from the events and the present rows (CONTRACT §2.7), with no side effect."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from memory_pipelines.config import MaintenanceConfig
from memory_pipelines.errors import ValidationError

AGENT = "agent-1"
CTX = {"agent_id": AGENT, "user_id": "u1", "company_id": "c1"}
SCOPE = {"agent_id": AGENT, "user_id": "u1", "company_id": "c1"}


@pytest.fixture(params=["Recent", "Relevant"])
def world(svc, clock, request):
    """Notes written over a day; ``t0`` is the instant in between."""
    svc.configure_agent(AGENT, note_injection_strategy=request.param, max_notes_to_inject=10)
    kept = svc.add_note("User drinks green tea every morning", **SCOPE)
    edited = svc.add_note("User lives in Oslo", **SCOPE)
    revoked = svc.add_note("User is allergic to peanuts", **SCOPE)
    archived = svc.add_note("User prefers tea over coffee", **SCOPE)
    other = svc.add_note("User u2 has a secret tea recipe", agent_id=AGENT, user_id="u2", company_id="c1")
    clock.advance(hours=1)
    t0 = clock()
    before = svc.inject(CTX, "tea Oslo peanuts")
    clock.advance(hours=1)
    svc.update_notes([(edited, {"note": "User lives in Bergen"})])
    svc.set_note_status(revoked.id, "Revoked")
    svc.set_note_status(archived.id, "Archived")
    later = svc.add_note("User started drinking coffee", **SCOPE)
    clock.advance(hours=1)
    return {
        "t0": t0,
        "before": before,
        "kept": kept,
        "edited": edited,
        "revoked": revoked,
        "archived": archived,
        "later": later,
        "other": other,
    }


def texts(injection) -> list[str]:
    return [n.note for n in injection.notes]


def test_as_of_gives_the_past_injection(svc, world):
    past = svc.inject(CTX, "tea Oslo peanuts", as_of=world["t0"])
    assert set(texts(past)) == set(texts(world["before"]))
    assert "User lives in Oslo" in texts(past) and "User lives in Bergen" not in texts(past)
    assert "User is allergic to peanuts" in texts(past)  # revoked after t0
    assert "User prefers tea over coffee" in texts(past)  # archived after t0
    assert "User started drinking coffee" not in texts(past)  # created after t0
    assert "secret" not in past.message  # another user's note, then as now
    assert past.message == world["before"].message
    now = svc.inject(CTX, "tea Oslo peanuts")
    assert "User lives in Oslo" not in texts(now) and "User is allergic to peanuts" not in texts(now)


def test_as_of_before_anything_is_empty(svc, world):
    past = svc.inject(CTX, "tea", as_of=world["t0"] - timedelta(days=1))
    assert past.notes == [] and past.message == ""


def test_as_of_survives_compaction_of_old_versions(svc, world, clock):
    svc.maintenance_config = MaintenanceConfig(cleanup_older_than=timedelta(0))
    versions_before = len(svc.store.notes.list_versions())
    with pytest.warns(UserWarning):  # LanceDB warns that a zero age drops every old version
        svc.compact()
    assert len(svc.store.notes.list_versions()) < versions_before
    past = svc.inject(CTX, "tea Oslo peanuts", as_of=world["t0"])
    assert past.message == world["before"].message


def test_as_of_has_no_side_effects(svc, world):
    svc.inject({**CTX, "run_id": "r-now"}, "tea")
    events = len(svc.sources.injection_events_of())
    steps = len(svc.sources.steps())
    notes = svc.notes()[["id", "access_count", "last_accessed_at", "updated_at"]].to_dict("records")
    history = {n["id"]: len(svc.history(n["id"])) for n in notes}
    version = svc.store.notes.version
    for _ in range(2):
        svc.inject({**CTX, "run_id": "r-past"}, "tea", as_of=world["t0"])
    assert len(svc.sources.injection_events_of()) == events
    assert len(svc.sources.steps()) == steps
    assert svc.notes()[["id", "access_count", "last_accessed_at", "updated_at"]].to_dict(
        "records"
    ) == notes
    assert {n["id"]: len(svc.history(n["id"])) for n in notes} == history
    assert svc.store.notes.version == version
    # and the present injection is the same as before the as_of calls
    assert texts(svc.inject(CTX, "tea")) == texts(svc.inject(CTX, "tea"))


def test_as_of_now_matches_the_present_injection(svc, world, clock):
    for query in ("tea", "Bergen", "coffee", None):
        assert svc.inject(CTX, query, as_of=clock()).message == svc.inject(CTX, query).message


def test_a_naive_or_malformed_as_of_is_rejected(svc, world):
    with pytest.raises(ValidationError, match="timezone"):
        svc.inject(CTX, "tea", as_of=datetime(2026, 6, 1, 12))
    with pytest.raises(ValidationError, match="as_of"):
        svc.inject(CTX, "tea", as_of=12345)


def test_explain_as_of_shows_the_notes_as_they_were(svc, world):
    edited, revoked, later = world["edited"], world["revoked"], world["later"]
    expl = svc.explain(CTX, "Oslo", as_of=world["t0"])
    (oslo,) = [n for n in expl.notes if n.note_id == edited.id]
    assert oslo.note == "User lives in Oslo" and oslo.verdict.startswith("injected")
    assert [e.kind for e in oslo.provenance.events] == ["created"]
    assert expl.generated_at == world["t0"]
    peanuts = svc.explain(CTX, "peanuts", as_of=world["t0"])
    (gone,) = [n for n in peanuts.notes if n.note_id == revoked.id]
    assert gone.status == "Active" and gone.verdict.startswith("injected")
    assert revoked.id in peanuts.injected_note_ids
    coffee = svc.explain(CTX, "coffee", as_of=world["t0"])
    assert later.id not in [n.note_id for n in coffee.notes]
    now = svc.explain(CTX, "peanuts")
    assert [n.status for n in now.notes if n.note_id == revoked.id] == ["Revoked"]


def test_why_as_of_cli_and_http(svc, world, home, capsys, monkeypatch):
    from fastapi.testclient import TestClient

    from memory_pipelines.apps.cli import why_command
    from memory_pipelines.apps.http import create_app

    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    t0 = world["t0"].isoformat()
    base = ["--agent", AGENT, "--user", "u1", "--company", "c1", "--home", str(home), "--json"]
    assert why_command([*base, "--as-of", t0, "Oslo"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "User lives in Oslo" in [n["note"] for n in data["notes"]]
    assert why_command([*base, "--as-of", "2026-06-01T12:00:00", "Oslo"]) == 1
    assert "timezone" in capsys.readouterr().err
    with TestClient(create_app(svc, write_queue=False)) as client:
        r = client.post("/v1/inject", json={"context": CTX, "current_input": "tea", "as_of": t0})
        assert r.status_code == 200, r.text
        assert r.json()["message"] == svc.inject(CTX, "tea", as_of=world["t0"]).message
        naive = client.post(
            "/v1/inject", json={"context": CTX, "as_of": "2026-06-01T12:00:00"}
        )
        assert naive.status_code == 422 and "timezone" in naive.json()["detail"]
        r = client.post("/v1/explain", json={"context": CTX, "topic": "Oslo", "as_of": t0})
        assert r.status_code == 200 and "User lives in Oslo" in r.text
