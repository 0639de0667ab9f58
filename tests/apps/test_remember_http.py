"""``POST /v1/remember`` over a real uvicorn server on loopback: the same keys and errors
as ``/v1/memory-writes``, and what one user's conversation teaches reaches only that user."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from reliability_helpers import running

from memory_pipelines.apps.http import create_app

AGENT = "agent-1"
DANA = {"agent_id": AGENT, "run_id": "run-1", "user_id": "dana", "company_id": "acme"}
ERIK = {"agent_id": AGENT, "run_id": "run-7", "user_id": "erik", "company_id": "acme"}
SAID = [
    {"role": "user", "content": "I'm vegetarian and I prefer answers in metric units."},
    {"role": "assistant", "content": "Noted!"},
]


@pytest.fixture
def client(svc) -> Iterator[httpx.Client]:
    svc.configure_agent(AGENT, note_injection_strategy="Recent")
    with running(create_app(svc)) as url, httpx.Client(base_url=url, timeout=60) as c:
        yield c


def test_remember_then_the_next_run_of_that_user_gets_it(client, svc):
    r = client.post("/v1/remember", json={"context": DANA, "messages": SAID})
    assert r.status_code == 200, r.text
    notes = r.json()["notes"]
    assert [n["note"] for n in notes] == [
        "User is vegetarian.",
        "User prefers answers in metric units.",
    ]
    assert {n["status"] for n in notes} == {"Provisional"}
    again = client.post("/v1/remember", json={"context": DANA, "messages": SAID})
    assert again.status_code == 200 and again.json() == {"notes": []}

    mine = client.post("/v1/inject", json={"context": {**DANA, "run_id": "run-2"}})
    assert {n["id"] for n in mine.json()["notes"]} == {n["id"] for n in notes}
    theirs = client.post("/v1/inject", json={"context": ERIK})
    assert theirs.json()["notes"] == [] and "vegetarian" not in theirs.json()["message"]


def test_keys_bind_remember_like_writes(client, svc):
    dana_key = svc.create_api_key(company_id="acme", agent_id=AGENT, user_id="dana")
    erik_key = svc.create_api_key(company_id="acme", agent_id=AGENT, user_id="erik")
    body = {"context": DANA, "messages": SAID}
    assert client.post("/v1/remember", json=body).status_code == 401
    wrong = client.post("/v1/remember", json=body, headers={"Authorization": f"Bearer {erik_key}"})
    assert wrong.status_code == 403
    assert len(svc.notes()) == 0
    ok = client.post("/v1/remember", json=body, headers={"Authorization": f"Bearer {dana_key}"})
    assert ok.status_code == 200 and len(ok.json()["notes"]) == 2


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"context": DANA}, 422, "messages"),
        ({"context": DANA, "messages": "hi"}, 422, "messages"),
        ({"messages": SAID}, 422, "context"),
        ({"context": DANA, "messages": SAID, "extra": 1}, 422, "extra"),
        (
            {"context": DANA, "messages": [{"role": "critic", "content": "x"}]},
            422,
            "messages[0].role",
        ),
        ({"context": {**DANA, "run_id": None}, "messages": SAID}, 422, "run_id"),
        ({"context": {**DANA, "agent_id": "ghost"}, "messages": SAID}, 404, "ghost"),
    ],
)
def test_errors_name_the_problem(client, svc, body, status, needle):
    r = client.post("/v1/remember", json=body)
    assert r.status_code == status, r.text
    assert needle in r.json()["detail"]
    assert len(svc.notes()) == 0


def test_a_lone_surrogate_is_a_422_naming_the_message(client, svc):
    raw = (
        '{"context": {"agent_id": "agent-1", "run_id": "r", "user_id": "dana"},'
        ' "messages": [{"role": "user", "content": "I like tea."},'
        ' {"role": "user", "content": "a\\ud800b"}]}'
    )
    r = client.post("/v1/remember", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert "messages[1].content" in r.json()["detail"]
    assert len(svc.notes()) == 0


def test_another_tenants_run_or_conversation_is_409(client, svc):
    first = {**DANA, "conversation_id": "chat-1"}
    assert client.post("/v1/remember", json={"context": first, "messages": SAID}).status_code == 200
    for context, needle in (
        ({**DANA, "user_id": "erik"}, "belongs to another company or user"),
        ({**ERIK, "conversation_id": "chat-1"}, "belongs to another agent, user or company"),
    ):
        r = client.post("/v1/remember", json={"context": context, "messages": SAID})
        assert r.status_code == 409, r.text
        assert needle in r.json()["detail"]
    assert {n.user_id for n in svc.notes().itertuples()} == {"dana"}
