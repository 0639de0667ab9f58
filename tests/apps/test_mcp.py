"""The MCP server: each tool through a real MCP client session (the SDK's ``Client``
over in-memory JSON-RPC streams), tool errors, and ``memory-pipelines mcp`` over stdio."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import select
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters, types
from mcp.shared.message import SessionMessage

import memory_pipelines
from memory_pipelines.apps.mcp_server import TOOLS, Identity, OpeningService, build_server
from memory_pipelines.apps.mcp_stdio import answer_line, parse_line
from memory_pipelines.errors import EmbeddingModelMissingError

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
        (
            "memory_remember",
            {
                "context": CTX,
                "messages": [
                    {"role": "user", "content": "ok"},
                    {"role": "user", "content": "a\ud800"},
                ],
            },
            "messages[1].content contains text that cannot be encoded as UTF-8",
        ),
        (
            "memory_inject",
            {"context": {**CTX, "user_id": "u\udfff"}},
            "context.user_id contains text",
        ),
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


# --------------------------------------------------------------------------- over stdio

DOCS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "mcp.md"


def docs_server_entries() -> list[dict[str, Any]]:
    """The server entries of the client configurations the MCP guide shows."""
    blocks = re.findall(r"```json\n(.*?)```", DOCS_PAGE.read_text(), re.DOTALL)
    return [json.loads(b)["mcpServers"]["memory"] for b in blocks if "mcpServers" in b]


def command_line(entry: dict[str, Any], home: Path) -> StdioServerParameters:
    """The entry's command line with its placeholder paths made real."""
    assert Path(entry["command"]).name == "memory-pipelines"
    script = Path(sys.executable).parent / "memory-pipelines"
    command, prefix = (
        (str(script), [])
        if script.exists()
        else (sys.executable, ["-m", "memory_pipelines.apps.cli"])
    )
    args = [str(home) if a == "/path/to/.memory" else a for a in entry["args"]]
    env = {**os.environ, "MEMORY_EMBEDDING_MODEL": "hash"}  # the fixture's 64-d model
    return StdioServerParameters(command=command, args=[*prefix, *args], env=env)


def test_the_documented_config_starts_a_bound_server(svc, home):
    """Claude Desktop's and Cursor's snippets: the server starts, answers initialize with the
    package version, and its tools work with text only for the configured user."""
    entries = docs_server_entries()
    assert len(entries) == 2 and entries[0] == entries[1]
    args = entries[0]["args"]
    assert args[args.index("--agent") + 1] == "assistant" and "--user" in args
    svc.configure_agent("assistant", note_injection_strategy="Recent")
    said = [{"role": "user", "content": "I'm vegetarian and I prefer answers in metric units."}]

    async def run():
        with anyio.fail_after(120):
            async with Client(command_line(entries[0], home), mode="legacy") as client:
                listed = await client.list_tools()
                return (
                    client.server_info,
                    listed,
                    [
                        await client.call_tool("memory_remember", {"messages": said}),
                        await client.call_tool(
                            "memory_write", {"writes": [{"note": "User cycles to work."}]}
                        ),
                        await client.call_tool("memory_inject", {}),
                        await client.call_tool(
                            "memory_inject", {"context": {"user_id": "someone-else"}}
                        ),
                    ],
                )

    info, listed, (remembered, wrote, injected, refused) = anyio.run(run)
    assert info.name == "memory-pipelines" and info.version == memory_pipelines.__version__
    assert {t.name for t in listed.tools} == set(TOOLS)
    learnt = [n["note"] for n in payload(remembered)["notes"]]
    assert learnt == ["User is vegetarian.", "User prefers answers in metric units."]
    assert payload(wrote)["results"][0]["disposition"] == "written"
    message = payload(injected)["message"]
    assert all(text in message for text in [*learnt, "User cycles to work."])
    assert refused.is_error and "not this server's user" in refused.content[0].text
    users = set(svc.notes()["user_id"])
    assert users == {args[args.index("--user") + 1]}


def mcp_command(home: Path, agent: str) -> list[str]:
    """The command line of ``memory-pipelines mcp`` bound to ``agent`` in ``home``."""
    cli = [sys.executable, "-m", "memory_pipelines.apps.cli"]
    return [*cli, "mcp", "--home", str(home), "--agent", agent]


def raw_session(home: Path, *lines: str) -> tuple[list[dict[str, Any]], str]:
    """Start ``memory-pipelines mcp``, send ``initialize`` and ``lines`` (raw), and read one
    answer per line that expects one (each read bounded, so a dropped request fails)."""
    proc = subprocess.Popen(
        mcp_command(home, AGENT),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "MEMORY_EMBEDDING_MODEL": "hash", "MEMORY_MAX_BODY_BYTES": "4096"},
    )
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    answers = []
    try:
        for line in [
            json.dumps(init),
            '{"jsonrpc": "2.0", "method": "notifications/initialized"}',
            *lines,
        ]:
            proc.stdin.write(line.encode("utf-8") + b"\n")
            proc.stdin.flush()
            if '"notifications/' in line:
                continue
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready, f"no answer to {line[:80]!r}"
            answers.append(json.loads(proc.stdout.readline()))
    finally:
        proc.stdin.close()
        proc.wait(30)
    return answers[1:], proc.stderr.read().decode()


def tools_call(request_id: int, name: str, arguments_json: str) -> str:
    return (
        f'{{"jsonrpc": "2.0", "id": {request_id}, "method": "tools/call",'
        f' "params": {{"name": "{name}", "arguments": {arguments_json}}}}}'
    )


def test_every_stdio_request_gets_an_answer(svc, home):
    svc.configure_agent(AGENT, note_injection_strategy="Recent")
    answers, _ = raw_session(
        home,
        '{"jsonrpc": "2.0", "id": 1, "method": "tools/list"',  # cut off
        "[1, 2]",
        '{"jsonrpc": "2.0", "id": 2, "method": 5}',
        tools_call(
            3,
            "memory_write",
            '{"writes": [{"note": "User likes green tea."}, {"note": "bad \\ud800 text"}]}',
        ),
        tools_call(4, "memory_inject", '{"current_input": "tea \\udfff"}'),
        tools_call(6, "memory_write", json.dumps({"writes": [{"note": "User likes tea. " * 400}]})),
        '{"jsonrpc": "2.0", "id": 5, "method": "tools/list"}',
    )
    parse, not_rpc, bad_method, wrote, injected, too_big, listed = answers
    assert parse["id"] is None and parse["error"]["code"] == -32700
    assert not_rpc["id"] is None and not_rpc["error"]["code"] == -32600
    assert bad_method["id"] == 2 and bad_method["error"]["code"] == -32600
    assert wrote["id"] == 3 and not wrote["result"]["isError"]
    data = json.loads(wrote["result"]["content"][0]["text"])
    assert [r["disposition"] for r in data["results"]] == ["written", "rejected-type"]
    assert "field 'note' contains text that cannot be encoded as UTF-8" in data["feedback"]
    assert injected["id"] == 4 and injected["result"]["isError"]
    assert "current_input" in injected["result"]["content"][0]["text"]
    assert too_big["id"] == 6 and too_big["error"]["code"] == -32600
    assert "at most 4096 bytes" in too_big["error"]["message"]
    assert listed["id"] == 5 and len(listed["result"]["tools"]) == len(TOOLS)
    assert list(svc.notes()["note"]) == ["User likes green tea."]


@pytest.mark.slow  # a subprocess that imports the whole stack
def test_an_unknown_agent_flag_stops_the_server_with_a_hint(home, svc):
    proc = subprocess.run(
        mcp_command(home, "ghost"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MEMORY_EMBEDDING_MODEL": "hash"},
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert "unknown agent 'ghost'" in proc.stderr
    assert f"memory-pipelines agents set ghost --home {home}" in proc.stderr


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("", None),
        ("{", ("error", -32700)),
        ('"text"', ("error", -32600)),
        ('{"jsonrpc": "2.0", "method": 5}', None),  # an invalid notification: not answered
        ('{"jsonrpc": "2.0", "id": [1], "method": "x"}', ("error", -32600)),
        ('{"jsonrpc": "2.0", "id": 1, "method": "ping"}', ("message", None)),
        (
            '{"jsonrpc": "2.0", "id": 1, "method": "x", "params": {"a": "\\ud800"}}',
            ("message", None),
        ),
    ],
)
def test_parse_line(line, expected):
    parsed = parse_line(line)
    if expected is None:
        assert parsed is None
    elif expected[0] == "message":
        assert isinstance(parsed, SessionMessage)
    else:
        answer = json.loads(parsed)
        assert answer["error"]["code"] == expected[1] and answer["jsonrpc"] == "2.0"
        assert answer["id"] is None


def test_an_answer_holding_a_lone_surrogate_is_still_sent():
    message = SessionMessage(
        types.JSONRPCResponse(jsonrpc="2.0", id=1, result={"text": "a\ud800b"})
    )
    line = answer_line(message)
    line.encode("utf-8")
    assert json.loads(line)["result"] == {"text": "a\ufffdb"}


# --------------------------------------------------------------------------- opening in the background


def opening_after(gate: threading.Event, result: Any, **kwargs: Any) -> OpeningService:
    """An ``OpeningService`` whose opening waits for ``gate``, then returns (or raises)
    ``result``."""

    def open_fn() -> Any:
        gate.wait(30)
        if isinstance(result, BaseException):
            raise result
        return result

    return OpeningService(open_fn, **kwargs).start()


def test_initialize_and_tools_list_are_answered_while_the_service_opens(svc):
    svc.configure_agent(AGENT, note_injection_strategy="Recent")
    gate = threading.Event()
    opening = opening_after(gate, svc)
    server = build_server(opening, Identity(agent_id=AGENT))

    async def run():
        async with Client(server, mode="legacy") as client:
            listed = await client.list_tools()
            still_opening = not opening.wait(0)
            gate.set()  # the open finishes; the tool call waits for it
            wrote = await client.call_tool("memory_write", {"writes": [{"note": "User rows."}]})
            return client.server_info, listed, still_opening, wrote

    info, listed, still_opening, wrote = anyio.run(run)
    assert still_opening and info.version == memory_pipelines.__version__
    assert {t.name for t in listed.tools} == set(TOOLS)
    assert payload(wrote)["results"][0]["disposition"] == "written"
    assert list(svc.notes()["note"]) == ["User rows."]


def test_a_service_that_cannot_open_makes_every_tool_call_an_error_naming_why():
    gate = threading.Event()
    gate.set()
    broken = EmbeddingModelMissingError("the embedding model 'MiniLM' is not installed")
    server = build_server(opening_after(gate, broken), Identity(agent_id=AGENT))

    async def run():
        async with Client(server, mode="legacy") as client:
            return await client.list_tools(), [
                await client.call_tool(name, args)
                for name, args in [
                    ("memory_inject", {}),
                    ("memory_write", {"writes": [{"note": "User rows."}]}),
                    ("memory_history", {"note_id": "n1"}),
                ]
            ]

    listed, results = anyio.run(run)
    assert len(listed.tools) == len(TOOLS)
    for result in results:
        text = result.content[0].text
        assert result.is_error, text
        assert text == (
            "the memory service could not be opened: the embedding model 'MiniLM' is not installed"
        )


def test_a_tool_call_waits_for_the_opening_at_most_its_bound(svc):
    gate = threading.Event()
    opening = opening_after(gate, svc, wait_s=0.05)
    server = build_server(opening, Identity(agent_id=AGENT))
    try:
        (result,) = call(server, ("memory_inject", {}))
    finally:
        gate.set()
        opening.wait(30)
    assert result.is_error
    assert "still opening after 0.05 seconds; try the call again" in result.content[0].text


def test_the_mcp_server_module_imports_neither_the_service_nor_lancedb():
    code = (
        "import sys, memory_pipelines.apps.mcp_server\n"
        "print(sorted(m for m in ('lancedb', 'memory_pipelines.service') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
