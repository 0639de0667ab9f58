"""Bulk notes: ``svc.add_notes`` and ``svc.set_notes_status``, over Python, HTTP and the CLI."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from reliability_helpers import running

from memory_pipelines.apps.cli import main as cli_main
from memory_pipelines.apps.http import create_app
from memory_pipelines.errors import NotFoundError, PermissionDeniedError, ValidationError
from memory_pipelines.keys import Authenticator
from memory_pipelines.service import MemoryService


def _version(svc) -> int:
    return svc.store.notes._t.version


def test_add_notes_saves_what_add_note_would_in_few_versions(svc, clock):
    items = [
        {
            "note": f"  The user prefers tool {i}.  ",
            "agent_id": "a1",
            "user_id": f"u{i % 3}",
            "company_id": "acme",
            "type": "Constraint" if i % 2 else "Preference",
        }
        for i in range(40)
    ]
    items.append(
        {
            "note": "Named note.",
            "id": "my-id",
            "status": "Provisional",
            "importance_score": 0.5,
            "secondary_scopes": {"project": "p1"},
        }
    )
    before = _version(svc)
    saved = svc.add_notes(items)
    assert _version(svc) - before <= 2  # one append and one merge on id, not 41 commits
    assert [n.note for n in saved[:2]] == ["The user prefers tool 0.", "The user prefers tool 1."]
    assert saved[1].type == "Constraint" and saved[0].author_type == "User"
    assert saved[-1].id == "my-id" and saved[-1].status == "Provisional"
    assert saved[-1].secondary_scopes == {"project": "p1"}
    assert len(svc.notes()) == 41
    stored = svc.get_note(saved[3].id)
    assert stored.note == saved[3].note and stored.created_at == clock()
    # the same vector as add_note would give the same text
    single = svc.add_note("The user prefers tool 3.")
    vecs = svc.store.notes.vectors([single.id, saved[3].id])
    assert np.allclose(vecs[single.id], vecs[saved[3].id])
    # one created event each, as add_note records it
    assert [e.event for e in svc.history(saved[0].id)] == ["created"]
    assert [e.event for e in svc.history("my-id")] == ["created"]
    # users and companies are registered like add_note's
    assert svc.sources.existing_ids("user", ["u0", "u1", "u2"]) == {"u0", "u1", "u2"}


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"note": "x", "type": "Nope"}, "notes[2].type"),
        ({"note": "   "}, "notes[2].note"),
        ({"type": "Preference"}, "notes[2].note"),
        ({"note": "x", "colour": "red"}, "notes[2].colour"),
        ({"note": "bad \ud800 text"}, "notes[2].note"),
        ({"note": "x", "user_id": "u\x00"}, "notes[2]"),
        ({"note": "x", "created_at": "2024-01-01T00:00:00"}, "notes[2].created_at"),
        ({"note": "x", "importance_score": "high"}, "notes[2].importance_score"),
        ({"note": "x", "id": "a"}, "notes[2].id"),  # notes[0] has that id too
        ("just a string", "notes[2]"),
    ],
)
def test_a_bad_item_names_its_index_and_field_and_nothing_is_saved(svc, bad, message):
    before = _version(svc)
    with pytest.raises(ValidationError, match=message.replace("[", r"\[").replace("]", r"\]")):
        svc.add_notes([{"note": "fine", "id": "a"}, {"note": "fine too"}, bad])
    assert _version(svc) == before and len(svc.notes()) == 0


@pytest.mark.parametrize("notes", ["a string", {"note": "x"}, None, 5])
def test_add_notes_wants_a_list(svc, notes):
    with pytest.raises(ValidationError, match="list"):
        svc.add_notes(notes)


def test_add_notes_of_an_empty_list_saves_nothing(svc):
    before = _version(svc)
    assert svc.add_notes([]) == [] and _version(svc) == before


def test_a_named_id_replaces_the_stored_note_like_add_note(svc):
    svc.add_note("old text", id="n1")
    svc.add_notes([{"note": "new text", "id": "n1"}])
    assert svc.get_note("n1").note == "new text" and len(svc.notes()) == 1


def test_set_notes_status_changes_all_or_nothing(svc):
    notes = svc.add_notes([{"note": f"n{i}", "agent_id": "a1"} for i in range(4)])
    ids = [n.id for n in notes]
    before = _version(svc)
    with pytest.raises(NotFoundError, match=r"ids\[2\]"):
        svc.set_notes_status([ids[0], ids[1], "nope"], "Archived")
    assert _version(svc) == before
    assert {n.status for n in map(svc.get_note, ids)} == {"Active"}
    with pytest.raises(ValidationError, match="status"):
        svc.set_notes_status(ids, "Gone")
    svc.set_note_status(ids[3], "Archived")
    out = svc.set_notes_status(ids + [ids[0]], "Archived", comment="cleanup")
    assert [n.status for n in out] == ["Archived"] * 5
    assert "cleanup" in out[0].comments and "cleanup" not in (out[3].comments or "")
    assert [e.event for e in svc.history(ids[0])] == ["created", "archived"]
    assert [e.event for e in svc.history(ids[3])] == ["created", "archived"]  # unchanged again
    back = svc.set_notes_status(ids[:2], "Active")
    assert [n.status for n in back] == ["Active", "Active"]
    assert svc.history(ids[0])[-1].event != "archived"


def test_a_bound_key_adds_only_inside_its_binding(svc):
    secret = svc.create_api_key(company_id="acme", role="analyst")
    acme = Authenticator(svc.sources).authenticate(f"Bearer {secret}")
    svc.add_note("globex secret", id="g1", company_id="globex")
    with pytest.raises(PermissionDeniedError, match=r"notes\[1\]"):
        svc.add_notes(
            [{"note": "ok", "company_id": "acme"}, {"note": "x", "company_id": "globex"}], key=acme
        )
    with pytest.raises(PermissionDeniedError, match=r"notes\[0\]\.id"):
        svc.add_notes([{"note": "overwrite", "id": "g1", "company_id": "acme"}], key=acme)
    assert svc.get_note("g1").note == "globex secret"
    with pytest.raises(NotFoundError, match=r"ids\[0\]"):
        svc.set_notes_status(["g1"], "Archived", key=acme)
    assert svc.get_note("g1").status == "Active"


@pytest.fixture
def client(svc):
    with running(create_app(svc)) as url, httpx.Client(base_url=url, timeout=60) as c:
        yield c


def test_http_bulk_routes(svc, client):
    r = client.post(
        "/v1/notes/bulk", json={"notes": [{"note": f"n{i}", "agent_id": "a1"} for i in range(3)]}
    )
    assert r.status_code == 200, r.text
    ids = [n["id"] for n in r.json()["notes"]]
    assert len(ids) == 3 and len(svc.notes()) == 3
    r = client.post(
        "/v1/notes/bulk", json={"notes": [{"note": "ok"}, {"note": "x", "status": "Nope"}]}
    )
    assert r.status_code == 422 and "notes[1].status" in r.text and len(svc.notes()) == 3
    assert client.post("/v1/notes/bulk", json={"notes": []}).status_code == 422
    assert client.post("/v1/notes/bulk", json={"notes": [{"note": "x"}] * 1001}).status_code in (
        413,
        422,
    )
    assert len(svc.notes()) == 3
    r = client.post("/v1/notes/bulk/status", json={"ids": ids[:2], "status": "Archived"})
    assert r.status_code == 200 and [n["status"] for n in r.json()["notes"]] == ["Archived"] * 2
    r = client.post("/v1/notes/bulk/status", json={"ids": [ids[2], "nope"], "status": "Archived"})
    assert r.status_code == 404 and svc.get_note(ids[2]).status == "Active"


def test_http_bulk_routes_check_role_and_binding(svc):
    agent = svc.create_api_key(company_id="acme", role="agent")
    acme = svc.create_api_key(company_id="acme", role="analyst")
    other = svc.add_note("globex", company_id="globex")
    with running(create_app(svc)) as url, httpx.Client(base_url=url, timeout=60) as c:

        def post(path, secret, body):
            return c.post(path, json=body, headers={"Authorization": f"Bearer {secret}"})

        one = {"notes": [{"note": "mine", "company_id": "acme"}]}
        assert post("/v1/notes/bulk", agent, one).status_code == 403
        assert post("/v1/notes/bulk", acme, one).status_code == 200
        assert (
            post(
                "/v1/notes/bulk", acme, {"notes": [{"note": "x", "company_id": "globex"}]}
            ).status_code
            == 403
        )
        assert (
            post("/v1/notes/bulk", acme, {"notes": [{"note": "x"}]}).status_code == 403
        )  # companyless
        r = post(
            "/v1/notes/bulk", acme, {"notes": [{"note": "x", "id": other.id, "company_id": "acme"}]}
        )
        assert r.status_code == 403 and svc.get_note(other.id).note == "globex"
        r = post("/v1/notes/bulk/status", acme, {"ids": [other.id], "status": "Archived"})
        assert r.status_code == 404 and "globex" not in r.text
    assert svc.get_note(other.id).status == "Active"
    assert len(svc.notes()) == 2


def test_cli_notes_add_many(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    home = tmp_path / "home"
    MemoryService.from_env(home).close()
    good = tmp_path / "notes.jsonl"
    good.write_text(
        "\n".join(json.dumps({"note": f"line {i}", "agent_id": "a1"}) for i in range(5)) + "\n\n"
    )
    assert cli_main(["notes", "add-many", "--home", str(home), str(good)]) == 0
    assert "added 5 notes" in capsys.readouterr().out
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"note": "fine"}\n{"note": \n')
    assert cli_main(["notes", "add-many", "--home", str(home), str(bad)]) == 1
    assert "line 2" in capsys.readouterr().err
    bad.write_text('{"note": "fine"}\n{"note": "x", "type": "Nope"}\n')
    assert cli_main(["notes", "add-many", "--home", str(home), str(bad)]) == 1
    assert "line 2" in capsys.readouterr().err
    with MemoryService.from_env(home) as again:
        assert sorted(again.notes()["note"]) == [f"line {i}" for i in range(5)]
