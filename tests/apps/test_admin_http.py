"""The administration routes (CONTRACT §2.9) over a real uvicorn server: notes listed,
searched, paged, read, patched, archived and erased; agents listed and set; keys."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from reliability_helpers import running

from memory_pipelines.apps.http import create_app


@pytest.fixture
def client(svc) -> Iterator[httpx.Client]:
    svc.configure_agent("a1")
    with running(create_app(svc)) as url, httpx.Client(base_url=url, timeout=60) as c:
        yield c


def _seed(svc, clock):
    notes = {}
    for name, fields in (
        ("tea", {"agent_id": "a1", "user_id": "u1", "company_id": "acme"}),
        ("coffee", {"agent_id": "a2", "user_id": "u2", "company_id": "acme"}),
        ("juice", {"agent_id": "a1", "user_id": "u9", "company_id": "globex"}),
    ):
        notes[name] = svc.add_note(f"The user likes {name}.", **fields)
        clock.advance(seconds=1)
    return notes


def test_list_filters_search_and_shape(client, svc, clock):
    notes = _seed(svc, clock)
    body = client.get("/v1/notes").json()
    assert set(body) == {"notes", "next_cursor"} and body["next_cursor"] is None
    assert [n["id"] for n in body["notes"]] == [notes[k].id for k in ("juice", "coffee", "tea")]
    assert [n["id"] for n in client.get("/v1/notes", params={"agent_id": "a2"}).json()["notes"]] == [
        notes["coffee"].id
    ]
    assert len(client.get("/v1/notes", params={"company_id": "acme"}).json()["notes"]) == 2
    assert len(client.get("/v1/notes", params={"user_id": "u9"}).json()["notes"]) == 1
    found = client.get("/v1/notes", params={"q": "LIKES Tea"}).json()["notes"]
    assert [n["id"] for n in found] == [notes["tea"].id]
    assert client.get("/v1/notes", params={"q": "%"}).json()["notes"] == []
    assert client.get("/v1/notes", params={"status": "Archived"}).json()["notes"] == []


def test_paging_under_concurrent_writes_has_no_gaps_or_repeats(client, svc, clock):
    before = {svc.add_note(f"note {i}", agent_id="a1").id for i in range(12)}
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 5, **({"cursor": cursor} if cursor else {})}
        body = client.get("/v1/notes", params=params).json()
        seen += [n["id"] for n in body["notes"]]
        clock.advance(seconds=1)
        client.post(
            "/v1/memory-writes",
            json={"context": {"agent_id": "a1", "run_id": f"r{len(seen)}"},
                  "writes": [{"note": f"Written while paging {len(seen)}.", "type": "Context"}]},
        ).raise_for_status()
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) and before <= set(seen)


@pytest.mark.parametrize(
    "params",
    [{"limit": 0}, {"limit": 501}, {"limit": "x"}, {"status": "Gone"}, {"cursor": "???"},
     {"q": "x" * 1001}],
)
def test_bad_listing_queries_are_422(client, params):
    r = client.get("/v1/notes", params=params)
    assert r.status_code == 422, r.text
    assert r.json()["detail"]


def test_get_patch_archive_erase(client, svc, clock):
    notes = _seed(svc, clock)
    tea = notes["tea"].id
    assert client.get(f"/v1/notes/{tea}").json()["note"] == "The user likes tea."
    assert client.get("/v1/notes/nope").status_code == 404
    r = client.patch(f"/v1/notes/{tea}", json={"note": "The user likes green tea.", "protection_tier": "Protected"})
    assert r.status_code == 200 and r.json()["note"] == "The user likes green tea."
    assert [e.event for e in svc.history(tea)] == ["created", "updated"]
    for bad in ({}, {"note": ""}, {"type": "Wish"}, {"status": "Gone"}, {"protection_tier": "X"},
                {"colour": "red"}):
        r = client.patch(f"/v1/notes/{tea}", json=bad)
        assert r.status_code == 422, (bad, r.text)
    lone = client.patch(
        f"/v1/notes/{tea}", content=b'{"note": "bad \\ud800"}',
        headers={"content-type": "application/json"},
    )
    assert lone.status_code == 422 and "note" in lone.json()["detail"], lone.text
    assert client.patch("/v1/notes/nope", json={"status": "Active"}).status_code == 404
    r = client.delete(f"/v1/notes/{tea}")
    assert r.status_code == 200 and r.json()["status"] == "Archived"
    assert svc.history(tea)[-1].event == "archived"
    assert client.delete("/v1/notes/nope").status_code == 404
    r = client.delete(f"/v1/notes/{tea}", params={"erase": "true"})
    assert r.status_code == 200 and r.json()["notes"] == 1
    assert client.get(f"/v1/notes/{tea}").status_code == 404
    assert [e.event for e in svc.history(tea)] == ["purged"]


def test_agents_list_and_set(client, svc):
    assert [a["agent_id"] for a in client.get("/v1/agents").json()["agents"]] == ["a1"]
    r = client.put("/v1/agents/a2", json={"max_notes_to_inject": 7, "note_injection_strategy": "Recent"})
    assert r.status_code == 200 and r.json()["max_notes_to_inject"] == 7
    assert svc.get_agent("a2").note_injection_strategy == "Recent"
    assert client.put("/v1/agents/a2", json={"max_notes_to_inject": 101}).status_code == 422
    assert client.put("/v1/agents/a2", json={"colour": "red"}).status_code == 422
    assert client.put("/v1/agents/a2", json={"note_injection_strategy": "Loud"}).status_code == 422
    assert svc.get_agent("a2").max_notes_to_inject == 7
    assert [a["agent_id"] for a in client.get("/v1/agents").json()["agents"]] == ["a1", "a2"]


def test_keys_bind_notes_and_agents(svc, clock):
    svc.configure_agent("a1")
    notes = _seed(svc, clock)
    admin = svc.create_api_key(admin=True)
    acme = svc.create_api_key(company_id="acme")
    acme_a1 = svc.create_api_key(company_id="acme", agent_id="a1", role="analyst")
    with running(create_app(svc)) as url, httpx.Client(base_url=url, timeout=60) as c:
        def get(path, secret, **kw):
            return c.get(path, headers={"Authorization": f"Bearer {secret}"}, **kw)

        assert c.get("/v1/notes").status_code == 401
        assert len(get("/v1/notes", admin).json()["notes"]) == 3
        listed = get("/v1/notes", acme).json()["notes"]
        assert {n["id"] for n in listed} == {notes["tea"].id, notes["coffee"].id}
        assert "juice" not in str(listed)
        assert [n["id"] for n in get("/v1/notes", acme_a1).json()["notes"]] == [notes["tea"].id]
        assert get("/v1/notes", acme, params={"company_id": "globex"}).status_code == 403
        assert get("/v1/notes", acme_a1, params={"agent_id": "a2"}).status_code == 403
        juice = notes["juice"].id
        hdr = {"Authorization": f"Bearer {acme}"}
        r = get(f"/v1/notes/{juice}", acme)
        assert r.status_code == 404 and "juice" not in r.text
        assert c.patch(f"/v1/notes/{juice}", json={"status": "Archived"}, headers=hdr).status_code == 404
        assert c.delete(f"/v1/notes/{juice}", headers=hdr).status_code == 404
        assert svc.get_note(juice).status == "Active"
        tea = notes["tea"].id
        assert c.delete(f"/v1/notes/{tea}", params={"erase": "true"}, headers=hdr).status_code == 403
        assert c.delete(f"/v1/notes/{tea}", headers=hdr).json()["status"] == "Archived"
        assert [a["agent_id"] for a in get("/v1/agents", acme_a1).json()["agents"]] == ["a1"]
        assert c.put("/v1/agents/a1", json={"max_notes_to_inject": 2}, headers=hdr).status_code == 403
        r = c.put("/v1/agents/a1", json={"max_notes_to_inject": 2},
                  headers={"Authorization": f"Bearer {admin}"})
        assert r.status_code == 200


def test_the_openapi_document_describes_the_admin_routes(client):
    doc = client.get("/openapi.json").json()
    paths = doc["paths"]
    assert set(paths["/v1/notes"]) == {"get"}
    assert set(paths["/v1/notes/{note_id}"]) == {"get", "patch", "delete"}
    assert set(paths["/v1/agents"]) == {"get"} and set(paths["/v1/agents/{agent_id}"]) == {"put"}
    names = {p["name"] for p in paths["/v1/notes"]["get"]["parameters"]}
    assert names == {"agent_id", "user_id", "company_id", "status", "q", "limit", "cursor"}
    schemas = doc["components"]["schemas"]
    assert {"NotePage", "NotePatch", "EraseResult", "AgentList", "AgentSettings"} <= set(schemas)
    assert "404" in paths["/v1/notes/{note_id}"]["get"]["responses"]


def test_an_erase_while_a_memory_manager_run_holds_the_home_is_a_503_that_changes_nothing(svc, clock, monkeypatch):
    from datetime import timedelta

    from memory_pipelines.apps.http.common import DEFAULT_HTTP_LEASE_WAIT_S
    from memory_pipelines.errors import ConfigError
    from memory_pipelines.phases.lease import LEASE_HOOKS, MANAGER_LEASE

    svc.configure_agent("a1")
    tea = _seed(svc, clock)["tea"].id
    holder = {"host": "box", "pid": 4242}  # a Memory Manager run of another machine
    assert svc.sources.take_lease(MANAGER_LEASE, "box:4242:run", clock() + timedelta(hours=1), holder)
    events: list[str] = []

    def hook(event: str, name: str, owner: str) -> None:
        events.append(event)

    LEASE_HOOKS.append(hook)
    try:
        with running(create_app(svc, lease_wait_s=0.2)) as url, httpx.Client(base_url=url, timeout=60) as c:
            r = c.delete(f"/v1/notes/{tea}", params={"erase": "true"})
            assert r.status_code == 503, r.text
            assert int(r.headers["Retry-After"]) > 0
            detail = r.json()["detail"]
            assert detail.startswith("A Memory Manager run holds this home") and detail.count(".") == 1
            assert "box" not in detail and "4242" not in detail  # the holder stays in the server log
            assert "waiting" in events  # it waited for the lease before giving up
            assert c.get(f"/v1/notes/{tea}").json()["note"] == "The user likes tea."
            assert [e.event for e in svc.history(tea)] == ["created"]
            assert c.delete(f"/v1/notes/{tea}").status_code == 200  # archiving needs no lease
            assert svc.sources.release_lease(MANAGER_LEASE, "box:4242:run")
            r = c.delete(f"/v1/notes/{tea}", params={"erase": "true"})
            assert r.status_code == 200 and r.json()["notes"] == 1
            schema = c.get("/openapi.json").json()["paths"]["/v1/notes/{note_id}"]["delete"]
            assert "Retry-After" in schema["responses"]["503"]["headers"]
    finally:
        LEASE_HOOKS.remove(hook)
    assert svc.sources.live_leases() == []
    # the wait: a few seconds by default, MEMORY_HTTP_LEASE_WAIT, or create_app's argument
    assert create_app(svc, write_queue=False).state.lease_wait_s == DEFAULT_HTTP_LEASE_WAIT_S == 5
    monkeypatch.setenv("MEMORY_HTTP_LEASE_WAIT", "0")
    assert create_app(svc, write_queue=False).state.lease_wait_s == 0
    for bad in ("soon", "-1", "nan", "inf"):
        monkeypatch.setenv("MEMORY_HTTP_LEASE_WAIT", bad)
        with pytest.raises(ConfigError, match="MEMORY_HTTP_LEASE_WAIT"):
            create_app(svc, write_queue=False)
    for bad_value in (-1.0, float("nan"), True):
        with pytest.raises(ConfigError, match="lease_wait_s"):
            create_app(svc, write_queue=False, lease_wait_s=bad_value)
