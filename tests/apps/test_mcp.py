"""The MCP server: each tool through a real MCP client session (the SDK's ``Client``
over in-memory JSON-RPC streams), tool errors, and ``memory-pipelines mcp`` over stdio."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

import memory_pipelines
from memory_pipelines.apps.mcp_server import TOOLS, Identity, build_server

AGENT = "agent-1"
CTX = {"agent_id": AGENT, "run_id": "run-1", "user_id": "u1"}


def call(server: Any, *calls: tuple[str, dict[str, Any]]) -> list[Any]:
    """Open one client session on ``server`` and run the tool calls in order."""

    async def run() -> list[Any]:
        async with Client(server, mode="legacy") as client:
            return [await client.call_tool(name, args) for name, args in calls]

    return anyio.run(run)


def payload(result: Any) -> dict[str, Any]:
    assert not result.is_error, result.content
    data = json.loads(result.content[0].text)
    assert result.structured_content in (None, data)
    return data


@pytest.fixture
def server(svc):
    svc.configure_agent(AGENT, note_injection_strategy="Recent")
    return build_server(svc)


def test_lists_the_five_tools_with_context_optional(server):
    async def run():
        async with Client(server, mode="legacy") as client:
            return client.server_info, await client.list_tools()

    info, listed = anyio.run(run)
    assert info.name == "memory-pipelines" and info.version == memory_pipelines.__version__
    tools = {t.name: t for t in listed.tools}
    assert (
        set(tools)
        == set(TOOLS)
        == {
            "memory_write",
            "memory_inject",
            "memory_remember",
            "memory_explain",
            "memory_history",
        }
    )
    assert tools["memory_history"].input_schema["required"] == ["note_id"]
    assert tools["memory_write"].input_schema["required"] == ["writes"]
    assert tools["memory_remember"].input_schema["required"] == ["messages"]
    assert tools["memory_explain"].input_schema["required"] == ["topic"]
    assert "required" not in tools["memory_inject"].input_schema
    for t in tools.values():
        assert (
            "context" in t.input_schema["properties"] and "ctx" not in t.input_schema["properties"]
        )
        assert "\n        " not in t.description  # dedented


def test_write_inject_explain_round_trip(server, svc):
    writes = [
        {"note": "User prefers tea over coffee", "type": "Preference", "scopeHint": "user"},
        {"note": "Do whatever the user says", "type": "Constraint"},
    ]
    wrote, injected, explained = call(
        server,
        ("memory_write", {"context": CTX, "writes": writes}),
        ("memory_inject", {"context": CTX, "current_input": "tea?"}),
        ("memory_explain", {"context": CTX, "topic": "tea"}),
    )
    w = payload(wrote)
    # compact: no request echo, no timing; the feedback holds each reason
    assert w["results"] == [
        {"disposition": "written", "note_id": w["results"][0]["note_id"]},
        {"disposition": "rejected-type"},
    ]
    assert w["feedback"].startswith("Memory write results (2 writes):")
    assert "not allowed in-flight" in w["feedback"]
    note_id = w["results"][0]["note_id"]
    assert svc.get_note(note_id).user_id == "u1"
    assert svc.get_note(note_id).status == "Provisional"

    i = payload(injected)
    assert i["note_ids"] == [note_id] and i["example_ids"] == []
    assert "User prefers tea over coffee" in i["message"]

    e = payload(explained)
    (note,) = e["notes"]
    assert note["note_id"] == note_id and note["verdict"] == "injected (rank 1 of 1)"
    assert note["provenance"]["writes"][0]["disposition"] == "written"


def test_explain_never_shows_another_tenant(server, svc):
    secret = svc.add_note(
        "The codeword is falcon", agent_id=AGENT, user_id="usr-alpha", company_id="co-xray"
    )
    shared = svc.add_note("Never say a codeword aloud", agent_id=AGENT)
    contexts = [
        {"agent_id": AGENT, "user_id": "usr-bravo", "company_id": "co-yankee"},
        *({"agent_id": AGENT, "user_id": u} for u in ["x' OR 1=1 --", "%", "*", "", None]),
    ]
    results = call(
        server, *(("memory_explain", {"context": c, "topic": "codeword"}) for c in contexts)
    )
    for result in results:
        data = payload(result)
        assert [n["note_id"] for n in data["notes"]] == [shared.id]
        assert "falcon" not in result.content[0].text and secret.id not in result.content[0].text
    (owner,) = call(
        server,
        (
            "memory_explain",
            {
                "context": {"agent_id": AGENT, "user_id": "usr-alpha", "company_id": "co-xray"},
                "topic": "codeword",
            },
        ),
    )
    assert {n["note_id"] for n in payload(owner)["notes"]} == {secret.id, shared.id}


def test_tool_errors_are_one_sentence(server):
    cases = [
        ("memory_inject", {"context": {"agent_id": "nobody"}}, "unknown agent 'nobody'"),
        (
            "memory_write",
            {"context": {"agent_id": AGENT, "bogus": 1}, "writes": []},
            "invalid context: context.bogus is not a known field",
        ),
        ("memory_write", {"context": "agent-1", "writes": []}, "context must be an object"),
        ("memory_inject", {"context": {"user_id": "u1"}}, "context.agent_id is required"),
        ("memory_inject", {"context": {"agent_id": 5}}, "context.agent_id must be a string"),
        (
            "memory_inject",
            {"context": {**CTX, "user_id": ["u"]}},
            "context.user_id must be a string",
        ),
        (
            "memory_inject",
            {"context": {**CTX, "secondary_scopes": [1]}},
            "context.secondary_scopes: secondary_scopes must be a JSON object",
        ),
        ("memory_explain", {"context": CTX, "topic": "  "}, "topic must be a non-empty string"),
        (
            "memory_write",
            {"context": CTX},
            "invalid arguments for memory_write: writes is required",
        ),
        ("memory_write", {"context": CTX, "writes": "x"}, "writes must be a list"),
        ("memory_remember", {"context": CTX, "messages": [{"role": "critic"}]}, "messages[0].role"),
    ]
    results = call(server, *((name, args) for name, args, _ in cases))
    for (name, _, needle), result in zip(cases, results, strict=True):
        text = result.content[0].text
        assert result.is_error and needle in text, (name, text)
        assert "\n" not in text and "http" not in text and "Error executing" not in text, text


@pytest.mark.slow  # a subprocess that imports the whole stack: seconds, not milliseconds
def test_stdio_command(svc, home):
    svc.configure_agent(AGENT)
    svc.add_note("User likes sailing", agent_id=AGENT)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "memory_pipelines.apps.cli", "mcp", "--home", str(home)],
        env={**os.environ, "MEMORY_EMBEDDING_MODEL": "hash"},  # the fixture's 64-d model
    )

    async def run():
        async with Client(params, mode="legacy") as client:
            return await client.call_tool(
                "memory_explain", {"context": {"agent_id": AGENT}, "topic": "sailing"}
            )

    result = anyio.run(run)
    (note,) = payload(result)["notes"]
    assert note["note"] == "User likes sailing" and note["verdict"] == "injected (rank 1 of 1)"


# --------------------------------------------------------------------------- identity


@pytest.fixture
def bound(svc):
    svc.configure_agent(AGENT, note_injection_strategy="Recent")
    return build_server(svc, Identity(agent_id=AGENT, user_id="dana", company_id="acme"))


def test_a_bound_server_takes_text_only(bound, svc):
    said = [{"role": "user", "content": "I'm vegetarian and I prefer answers in metric units."}]
    wrote, remembered, injected = call(
        bound,
        ("memory_write", {"writes": [{"note": "User likes green tea"}]}),
        ("memory_remember", {"messages": said}),
        ("memory_inject", {}),
    )
    note_id = payload(wrote)["results"][0]["note_id"]
    note = svc.get_note(note_id)
    assert (note.agent_id, note.user_id, note.company_id) == (AGENT, "dana", "acme")
    assert note.source_run_id.startswith("mcp-")
    kept = payload(remembered)["notes"]
    assert [n["note"] for n in kept] == [
        "User is vegetarian.",
        "User prefers answers in metric units.",
    ]
    assert {n["status"] for n in kept} == {"Provisional"}
    assert {svc.get_note(n["id"]).source_run_id for n in kept} == {note.source_run_id}
    i = payload(injected)
    assert set(i["note_ids"]) == {note_id, *(n["id"] for n in kept)}
    # the same words in a context naming the bound identity are the same call
    (same,) = call(bound, ("memory_inject", {"context": {"agent_id": AGENT, "user_id": "dana"}}))
    assert payload(same)["note_ids"] == i["note_ids"]


def test_one_run_id_per_session_unless_given(bound, svc):
    svc.write_config = dataclasses.replace(svc.write_config, max_writes_per_run=2)
    notes = [{"note": f"User owns {n} bikes"} for n in ("two", "three", "four")]
    one_session = call(bound, *(("memory_write", {"writes": [w]}) for w in notes))
    assert [payload(r)["results"][0]["disposition"] for r in one_session] == [
        "written",
        "written",
        "skipped-cap",  # one session is one run: its cap holds across calls
    ]
    (next_session,) = call(bound, ("memory_write", {"writes": [{"note": "User owns a kayak"}]}))
    assert payload(next_session)["results"][0]["disposition"] == "written"
    (given,) = call(
        bound,
        ("memory_write", {"writes": [{"note": "User owns a canoe"}], "context": {"run_id": "r-9"}}),
    )
    assert svc.get_note(payload(given)["results"][0]["note_id"]).source_run_id == "r-9"


@pytest.mark.parametrize(
    ("context", "named"),
    [
        ({"agent_id": "other-agent"}, "context.agent_id 'other-agent' is not this server's agent"),
        ({"user_id": "erik"}, "context.user_id 'erik' is not this server's user"),
        ({"company_id": "globex"}, "context.company_id 'globex' is not this server's company"),
        ({"user_id": "%"}, "not this server's user"),
    ],
)
def test_a_bound_server_refuses_another_identity(bound, svc, context, named):
    svc.configure_agent("other-agent")
    svc.add_note("Erik's codeword is falcon", agent_id=AGENT, user_id="erik", company_id="acme")
    calls = [
        ("memory_write", {"writes": [{"note": "User likes tea"}], "context": context}),
        (
            "memory_remember",
            {"messages": [{"role": "user", "content": "I like tea."}], "context": context},
        ),
        ("memory_inject", {"context": context}),
        ("memory_explain", {"topic": "codeword", "context": context}),
        ("memory_history", {"note_id": "x", "context": context}),
    ]
    for result in call(bound, *calls):
        text = result.content[0].text
        assert result.is_error and named in text and "falcon" not in text, text
    assert len(svc.notes()) == 1


def test_an_unbound_server_still_needs_the_agent(server):
    (result,) = call(server, ("memory_inject", {}))
    assert result.is_error
    assert (
        "context.agent_id is required (or start the server with --agent)" in result.content[0].text
    )
