"""The MCP server: each tool through a real MCP client session (the SDK's ``Client``
over in-memory JSON-RPC streams), tool errors, and ``memory-pipelines mcp`` over stdio."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from memory_pipelines.apps.mcp_server import build_server

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


def test_lists_the_four_tools(server):
    async def run():
        async with Client(server, mode="legacy") as client:
            return await client.list_tools()

    tools = {t.name: t for t in anyio.run(run).tools}
    assert set(tools) == {"memory_write", "memory_inject", "memory_explain", "memory_history"}
    assert tools["memory_history"].input_schema["required"] == ["context", "note_id"]
    assert "context" in tools["memory_write"].input_schema["properties"]
    assert tools["memory_explain"].input_schema["required"] == ["context", "topic"]


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
    assert [r["disposition"] for r in w["results"]] == ["written", "rejected-type"]
    assert w["results"][0]["final_scope"] == {
        "agent_id": AGENT,
        "user_id": "u1",
        "company_id": None,
    }
    assert w["results"][0]["request"] == writes[0]
    assert w["feedback"].startswith("Memory write results (2 writes):")
    note_id = w["results"][0]["note_id"]
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


def test_tool_errors_have_clear_messages(server):
    unknown, bad_context, no_topic, bad_args = call(
        server,
        ("memory_inject", {"context": {"agent_id": "nobody"}}),
        ("memory_write", {"context": {"agent_id": AGENT, "bogus": 1}, "writes": []}),
        ("memory_explain", {"context": CTX, "topic": "  "}),
        ("memory_write", {"context": CTX}),
    )
    for result in (unknown, bad_context, no_topic, bad_args):
        assert result.is_error
    assert "unknown agent 'nobody'" in unknown.content[0].text
    assert "invalid arguments: invalid run context" in bad_context.content[0].text
    assert "bogus" in bad_context.content[0].text
    assert "topic must be a non-empty string" in no_topic.content[0].text
    assert "writes" in bad_args.content[0].text


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
