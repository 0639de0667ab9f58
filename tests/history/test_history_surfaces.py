"""A note's history over the CLI (``memory-pipelines history``), HTTP
(``GET /v1/notes/{id}/history``) and MCP (``memory_history``), with the tenancy rule:
a caller never learns another tenant's note or text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from mcp import Client

from memory_pipelines.apps.cli import main
from memory_pipelines.apps.http import create_app
from memory_pipelines.apps.mcp_server import build_server

AGENT = "agent-1"
CTX = {"agent_id": AGENT, "user_id": "u1", "company_id": "c1"}
HOSTILE = ["nope", "x' OR '1'='1", "%", "*", "a" * 5000, "\\", '"']


@pytest.fixture
def notes(svc):
    """A note of u1/c1 with three events, and another tenant's note."""
    svc.configure_agent(AGENT)
    mine = svc.add_note("User u1 drinks green tea", agent_id=AGENT, user_id="u1", company_id="c1")
    svc.update_notes([(mine, {"note": "User u1 drinks jasmine tea"})])
    svc.set_note_status(mine.id, "Archived", comment="no longer true")
    other = svc.add_note(
        "Secret of u2: codeword falcon", agent_id=AGENT, user_id="u2", company_id="c2"
    )
    return mine, other


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def client(svc, notes) -> Iterator[TestClient]:
    with TestClient(create_app(svc, write_queue=False)) as c:
        yield c


def mcp_call(svc: Any, name: str, args: dict[str, Any]) -> Any:
    async def run() -> Any:
        with anyio.fail_after(60):
            async with Client(build_server(svc), mode="legacy") as client:
                return await client.call_tool(name, args)

    return anyio.run(run)


# --------------------------------------------------------------------------- CLI


def test_cli_history_table_and_json(svc, notes, home, capsys, monkeypatch):
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    mine, _ = notes
    assert main(["history", mine.id, "--home", str(home)]) == 0
    out = capsys.readouterr().out
    assert f"History of note {mine.id} (3 events)" in out
    header = next(line for line in out.splitlines() if line.startswith("at"))
    assert header.split() == ["at", "event", "actor", "phase", "status", "related", "reason"]
    assert "created" in out and "updated" in out and "archived" in out
    assert "Active -> Archived" in out and "no longer true" in out
    assert main(["history", mine.id, "--home", str(home), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["note_id"] == mine.id
    assert [e["event"] for e in data["events"]] == ["created", "updated", "archived"]
    assert data["events"] == [e.model_dump(mode="json") for e in svc.history(mine.id)]
    assert data["events"][1]["text_after"] == "User u1 drinks jasmine tea"


@pytest.mark.parametrize("bad", HOSTILE[:4])
def test_cli_history_of_an_unknown_note(svc, notes, home, capsys, monkeypatch, bad):
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    assert main(["history", bad, "--home", str(home), "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "does not exist" in captured.err
    assert "falcon" not in captured.err


# --------------------------------------------------------------------------- HTTP


def test_http_history(client, svc, notes):
    mine, other = notes
    r = client.get(f"/v1/notes/{mine.id}/history")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["note_id"] == mine.id
    assert [e["event"] for e in body["events"]] == ["created", "updated", "archived"]
    assert body["events"][2]["status_before"] == "Active"
    assert body["events"][2]["status_after"] == "Archived"
    # no keys in the home: the operator reads any note
    assert client.get(f"/v1/notes/{other.id}/history").status_code == 200


@pytest.mark.parametrize("bad", HOSTILE)
def test_http_history_of_an_unknown_id_is_404(client, bad):
    r = client.get("/v1/notes/" + bad.replace("%", "%25").replace("\\", "%5C") + "/history")
    assert r.status_code == 404, r.text
    assert "does not exist" in r.json()["detail"] and "falcon" not in r.text


def test_http_history_follows_the_key_binding(client, svc, notes):
    mine, other = notes
    company_key = svc.create_api_key(company_id="c1")
    user_key = svc.create_api_key(company_id="c1", agent_id=AGENT, user_id="u1", role="analyst")
    other_user_key = svc.create_api_key(company_id="c1", user_id="u3")
    admin_key = svc.create_api_key(admin=True)
    shared = svc.add_note("Global house rule", agent_id=None)
    assert client.get(f"/v1/notes/{mine.id}/history").status_code == 401
    for secret in (company_key, user_key):
        r = client.get(f"/v1/notes/{mine.id}/history", headers=bearer(secret))
        assert r.status_code == 200 and len(r.json()["events"]) == 3
    for secret in (company_key, user_key, other_user_key):
        r = client.get(f"/v1/notes/{other.id}/history", headers=bearer(secret))
        assert r.status_code == 404 and "falcon" not in r.text
        unknown = client.get("/v1/notes/nope/history", headers=bearer(secret))
        assert r.json()["detail"].replace(other.id, "nope") == unknown.json()["detail"]
        r = client.get(f"/v1/notes/{shared.id}/history", headers=bearer(secret))
        assert r.status_code == 404
    r = client.get(f"/v1/notes/{mine.id}/history", headers=bearer(other_user_key))
    assert r.status_code == 404
    for note in (mine, other, shared):
        r = client.get(f"/v1/notes/{note.id}/history", headers=bearer(admin_key))
        assert r.status_code == 200 and r.json()["events"]


def test_http_history_of_an_erased_note_with_events_left(client, svc, notes):
    """No row but events (e.g. an id that only ever had events) still answers for the
    operator; a note with neither is unknown."""
    mine, _ = notes
    svc.store.notes.delete(eq_id(mine.id))
    r = client.get(f"/v1/notes/{mine.id}/history")
    assert r.status_code == 200 and len(r.json()["events"]) == 3
    svc.sources.delete_note_events(note_ids=[mine.id])
    assert client.get(f"/v1/notes/{mine.id}/history").status_code == 404


def eq_id(note_id: str):
    from memory_pipelines.store import eq

    return eq("id", note_id)


# --------------------------------------------------------------------------- MCP


def test_mcp_history_answers_for_visible_notes_only(svc, notes):
    mine, other = notes
    res = mcp_call(svc, "memory_history", {"context": CTX, "note_id": mine.id})
    assert not res.is_error, res
    data = res.structured_content
    assert data["note_id"] == mine.id
    assert [e["event"] for e in data["events"]] == ["created", "updated", "archived"]
    for note_id in (other.id, "nope", "x' OR '1'='1", "%"):
        res = mcp_call(svc, "memory_history", {"context": CTX, "note_id": note_id})
        assert res.is_error
        text = res.content[0].text
        assert "does not exist" in text and "falcon" not in text
    # the other tenant's context sees its own note, not u1's
    ctx2 = {"agent_id": AGENT, "user_id": "u2", "company_id": "c2"}
    assert not mcp_call(svc, "memory_history", {"context": ctx2, "note_id": other.id}).is_error
    assert mcp_call(svc, "memory_history", {"context": ctx2, "note_id": mine.id}).is_error


def test_mcp_history_rejects_a_bad_context(svc, notes):
    mine, _ = notes
    res = mcp_call(svc, "memory_history", {"context": {"user_id": "u1"}, "note_id": mine.id})
    assert res.is_error and "invalid" in res.content[0].text
    res = mcp_call(svc, "memory_history", {"context": {**CTX, "agent_id": "ghost"}, "note_id": mine.id})
    assert res.is_error and "ghost" in res.content[0].text
