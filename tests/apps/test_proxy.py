"""The memory proxy (``memory-pipelines proxy``) with the official ``openai`` client: in
front of a scripted OpenAI-compatible stub (fast) and of the real local model server
(slow). Checks that the injection reaches the upstream, memoryWrites are executed and
stripped, the exchange is recorded, streaming stays intact and errors are mapped."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from reliability_helpers import running, start_server, stop_process, subprocess_env

from memory_pipelines.apps import cli
from memory_pipelines.apps.openai_stub import create_stub_app
from memory_pipelines.apps.proxy import MEMORY_TOOL, create_app, split_memory_writes
from memory_pipelines.injection import render_examples, render_message, render_notes
from memory_pipelines.phases import mining
from memory_pipelines.writes.protocol import chat_write_instructions

AGENT = "agent-1"
IDS = {"agent": AGENT, "user": "user-1", "company": "co-1", "run": "run-1", "conversation": "conv-1"}
CTX = {"agent_id": AGENT, "user_id": "user-1", "company_id": "co-1", "run_id": "run-1",
       "conversation_id": "conv-1"}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


def headers(**ids: str) -> dict[str, str]:
    merged = {**IDS, **ids}
    return {f"X-Memory-{k.capitalize()}": v for k, v in merged.items() if v}


def _proxy(svc, stub, **kwargs: Any):
    upstream = {"api_base": stub.url + "/v1", "api_key": "sk-stub"}
    return running(create_app(svc, "openai/stub", upstream=upstream, **kwargs))


@pytest.fixture
def proxy_url(svc, stub) -> Iterator[str]:
    svc.configure_agent(AGENT, note_injection_strategy="Recent")
    with _proxy(svc, stub) as url:
        yield url


def client(url: str, api_key: str = "unused", timeout: float = 60, **ids: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=timeout,
        default_headers=headers(**ids),
    )


def ask(c: openai.OpenAI, text: str = "hello", **kwargs: Any):
    return c.chat.completions.create(model="anything", messages=[{"role": "user", "content": text}], **kwargs)


def streamed(c: openai.OpenAI, text: str = "hello", **kwargs: Any) -> tuple[list[Any], str]:
    chunks = list(ask(c, text, stream=True, **kwargs))
    content = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    return chunks, content


# --------------------------------------------------------------------------- injection


def test_injection_and_write_instructions_reach_the_upstream_as_a_system_message(proxy_url, stub, svc):
    svc.add_note("User prefers metric units.", agent_id=AGENT, user_id="user-1")
    instructions = chat_write_instructions(svc.get_agent(AGENT), svc.write_config)
    expected = "\n\n".join([svc.inject(CTX, "hello").message, instructions])
    assert "User prefers metric units." in expected and "```memoryWrites" in instructions
    answer = ask(client(proxy_url))
    assert answer.choices[0].message.content == "ok"
    sent = stub.requests[-1]["messages"]
    assert sent[0] == {"role": "system", "content": expected}
    assert sent[1:] == [{"role": "user", "content": "hello"}]
    # a client asking for JSON gets the instructions of the JSON field instead
    ask(client(proxy_url), response_format={"type": "json_object"})
    assert stub.requests[-1]["messages"][0]["content"].endswith(svc.write_instructions(AGENT))


def test_models_lists_the_served_model(proxy_url):
    assert [m.id for m in client(proxy_url).models.list()] == ["openai/stub"]


def test_an_agent_that_may_not_write_gets_no_instructions(proxy_url, stub, svc):
    svc.configure_agent(AGENT, allow_memory_write=False)
    ask(client(proxy_url))
    assert "Durable Memory" not in json.dumps(stub.requests[-1]["messages"])


# --------------------------------------------------------------------------- writes


def test_memory_writes_are_executed_stripped_and_reported_on_the_next_turn(proxy_url, stub, svc):
    answer = {"reply": "Noted.", "memoryWrites": [{"note": "User prefers bar charts.", "type": "Preference"}]}
    stub.script.append({"content": json.dumps(answer)})
    c = client(proxy_url)
    got = ask(c, "I like bar charts")
    assert json.loads(got.choices[0].message.content) == {"reply": "Noted."}
    notes = svc.notes(agent_id=AGENT)
    assert list(notes["note"]) == ["User prefers bar charts."]
    assert notes.iloc[0]["status"] == "Provisional" and notes.iloc[0]["source_run_id"] == "run-1"

    ask(c, "next")  # the next turn of the same run gets the feedback
    system = stub.requests[-1]["messages"][0]["content"]
    assert "Memory write result:" in system and "**written**" in system
    ask(c, "again")  # delivered once
    assert "Memory write result" not in stub.requests[-1]["messages"][0]["content"]
    ask(client(proxy_url, run="run-2"), "other run")
    assert "Memory write result" not in stub.requests[-1]["messages"][0]["content"]


def test_feedback_a_failed_turn_carried_is_delivered_on_the_next(proxy_url, stub, svc):
    answer = {"reply": "Noted.", "memoryWrites": [{"note": "User prefers tea.", "type": "Preference"}]}
    stub.script.extend([{"content": json.dumps(answer)}, {"status": 500}])
    c = client(proxy_url)
    ask(c, "I like tea")
    with pytest.raises(openai.InternalServerError):
        ask(c, "next")
    assert "Memory write result:" in stub.requests[-1]["messages"][0]["content"]
    ask(c, "retry")
    assert "Memory write result:" in stub.requests[-1]["messages"][0]["content"]
    ask(c, "after")
    assert "Memory write result" not in stub.requests[-1]["messages"][0]["content"]


def test_writes_of_an_agent_that_may_not_write_are_stripped_and_not_saved(proxy_url, stub, svc):
    svc.configure_agent(AGENT, allow_memory_write=False)
    answer = {"reply": "Sure.", "memoryWrites": [{"note": "User likes jazz.", "type": "Preference"}]}
    stub.script.append({"content": json.dumps(answer)})
    c = client(proxy_url)
    assert json.loads(ask(c).choices[0].message.content) == {"reply": "Sure."}
    assert svc.notes(agent_id=AGENT).empty
    ask(c, "next")
    assert "NOT saved" in stub.requests[-1]["messages"][0]["content"]


def test_a_fenced_json_answer_is_stripped_too():
    text = '```json\n{"a": 1, "memoryWrites": [{"note": "x", "type": "Context"}]}\n```'
    cleaned, writes = split_memory_writes(text)
    assert writes == [{"note": "x", "type": "Context"}]
    assert "memoryWrites" not in cleaned and json.loads(cleaned.strip("`").removeprefix("json")) == {"a": 1}
    assert split_memory_writes("plain {text}") == ("plain {text}", None)
    assert split_memory_writes('{"broken": ') == ('{"broken": ', None)
    assert split_memory_writes('{"a": 1}') == ('{"a": 1}', None)
    assert split_memory_writes('{"memoryWrites": "bad"}') == ("", ["bad"])


def test_memory_write_tool_calls_are_executed_and_removed(proxy_url, stub, svc):
    stub.script.append({"content": None, "tool_calls": [
        {"name": MEMORY_TOOL, "arguments": {"note": "User lives in Oslo.", "type": "Context"}},
    ]})
    got = ask(client(proxy_url), "I live in Oslo", tools=[WEATHER_TOOL])
    tools = [t["function"]["name"] for t in stub.requests[-1]["tools"]]
    assert tools == ["get_weather", MEMORY_TOOL]
    assert not got.choices[0].message.tool_calls and got.choices[0].finish_reason == "stop"
    assert list(svc.notes(agent_id=AGENT)["note"]) == ["User lives in Oslo."]

    stub.script.append({"content": None, "tool_calls": [
        {"name": MEMORY_TOOL, "arguments": {"note": "User likes rain.", "type": "Preference"}},
        {"name": "get_weather", "arguments": {"city": "Oslo"}},
    ]})
    got = ask(client(proxy_url), "weather?", tools=[WEATHER_TOOL])
    calls = got.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather"] and got.choices[0].finish_reason == "tool_calls"
    assert "User likes rain." in set(svc.notes(agent_id=AGENT)["note"])


def test_without_tools_no_memory_tool_is_added(proxy_url, stub):
    ask(client(proxy_url))
    assert "tools" not in stub.requests[-1]


# --------------------------------------------------------------------------- recording


def test_the_exchange_is_recorded_and_can_be_rated(proxy_url, stub, svc):
    stub.script.append({"content": json.dumps({"reply": "Hi!", "memoryWrites": []})})
    raw = client(proxy_url).chat.completions.with_raw_response.create(
        model="x", messages=[{"role": "system", "content": "be nice"}, {"role": "user", "content": "hello"}]
    )
    answer = raw.parse()
    assert raw.headers["x-memory-message"] == answer.id and raw.headers["x-memory-run"] == "run-1"
    rows = svc.sources.messages_of("conv-1")
    assert [(r["role"], r["text"]) for r in rows] == [("user", "hello"), ("assistant", '{"reply": "Hi!"}')]
    assert rows[1]["message_id"] == answer.id
    conv = svc.sources.get_conversation("conv-1")
    assert (conv["agent_id"], conv["user_id"], conv["company_id"]) == (AGENT, "user-1", "co-1")
    run = svc.sources.get_agent_run("run-1")
    assert (run["status"], run["success"], run["conversation_id"]) == ("Completed", True, "conv-1")

    # a resent history does not store the same user message twice
    client(proxy_url).chat.completions.create(
        model="x", messages=[{"role": "system", "content": "be nice"}, {"role": "user", "content": "hello"}]
    )
    assert [r["role"] for r in svc.sources.messages_of("conv-1")] == ["user", "assistant", "assistant"]

    with httpx.Client(base_url=proxy_url) as http:
        ok = http.post("/v1/feedback", json={"conversation_id": "conv-1", "message_id": answer.id,
                                             "rating": 9, "comment": "great"})
        assert ok.status_code == 200 and ok.json()["rating"] == 9
        bad = http.post("/v1/feedback", json={"conversation_id": "conv-1", "message_id": answer.id, "rating": 11})
        assert bad.status_code == 400 and "rating" in bad.json()["error"]["message"]
        missing = http.post("/v1/feedback", json={"conversation_id": "conv-1", "message_id": "nope", "rating": 5})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    rated = [r for r in svc.sources.messages_of("conv-1") if r["message_id"] == answer.id][0]
    assert (rated["rating"], rated["rating_comment"], rated["text"]) == (9, "great", '{"reply": "Hi!"}')
    # the Memory Manager mines the rated conversation on its next cycle
    batches = mining.load_conversations(svc.context, "notes", [AGENT], "mm-test").batches
    assert any(b.conversation_id == "conv-1" and b.rating_context == "positive" for b in batches)


def test_generated_ids_when_no_run_or_conversation_header(proxy_url, svc):
    raw = client(proxy_url, run="", conversation="").chat.completions.with_raw_response.create(
        model="x", messages=[{"role": "user", "content": "hi"}]
    )
    conv, run = raw.headers["x-memory-conversation"], raw.headers["x-memory-run"]
    assert conv.startswith("conv-") and run.startswith("run-")
    assert svc.sources.get_agent_run(run)["conversation_id"] == conv


def test_another_contexts_run_or_conversation_is_a_409(proxy_url, stub, svc):
    svc.configure_agent("agent-2")
    ask(client(proxy_url))
    with pytest.raises(openai.ConflictError) as info:
        ask(client(proxy_url, agent="agent-2", conversation="conv-2"))
    assert info.value.body["code"] == "run_conflict"
    for other in ({"user": "user-2"}, {"company": "co-2"}, {"agent": "agent-2", "run": "run-9"}):
        with pytest.raises(openai.ConflictError) as info:
            ask(client(proxy_url, **other))
        assert info.value.body["code"] == "conversation_conflict"
    conv = svc.sources.get_conversation("conv-1")
    assert (conv["agent_id"], conv["user_id"], conv["company_id"]) == (AGENT, "user-1", "co-1")
    assert len(stub.requests) == 1 and len(svc.sources.messages_of("conv-1")) == 2


def test_user_comes_from_the_user_field_without_a_header(proxy_url, svc):
    ask(client(proxy_url, user=""), user="field-user")
    assert svc.sources.get_conversation("conv-1")["user_id"] == "field-user"


def test_message_text_is_not_logged_at_info(proxy_url, stub, caplog):
    caplog.set_level(logging.INFO)
    stub.script.append({"content": "the secret answer"})
    ask(client(proxy_url), "my secret question")
    assert "proxy turn" in caplog.text
    assert "secret" not in caplog.text


# --------------------------------------------------------------------------- streaming


def test_streaming_text_passes_through_in_chunks(proxy_url, stub, svc):
    stub.script.append({"content": "Hello there, friend.", "chunks": 4})
    chunks, content = streamed(client(proxy_url))
    assert content == "Hello there, friend."
    assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) == 4
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert stub.requests[-1]["stream"] is True and stub.requests[-1]["messages"][0]["role"] == "system"
    assert svc.sources.messages_of("conv-1")[-1]["text"] == "Hello there, friend."


def test_streaming_json_with_memory_writes_is_buffered_and_stripped(proxy_url, stub, svc):
    answer = {"reply": "Saved.", "memoryWrites": [{"note": "User prefers tea.", "type": "Preference"}]}
    stub.script.append({"content": json.dumps(answer), "chunks": 5})
    chunks, content = streamed(client(proxy_url), "I like tea")
    assert json.loads(content) == {"reply": "Saved."}
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert list(svc.notes(agent_id=AGENT)["note"]) == ["User prefers tea."]
    assert svc.sources.messages_of("conv-1")[-1]["text"] == content
    assert svc.sources.get_agent_run("run-1")["success"] is True


def test_streaming_memory_write_tool_calls_are_held_back(proxy_url, stub, svc):
    stub.script.append({"content": None, "tool_calls": [
        {"name": MEMORY_TOOL, "arguments": {"note": "User uses vim.", "type": "Preference"}},
        {"name": "get_weather", "arguments": {"city": "Rome"}},
    ]})
    chunks, _ = streamed(client(proxy_url), tools=[WEATHER_TOOL])
    calls = [tc for ch in chunks if ch.choices for tc in ch.choices[0].delta.tool_calls or []]
    assert {tc.function.name for tc in calls if tc.function.name} == {"get_weather"}
    assert {tc.index for tc in calls} == {0}
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == {"city": "Rome"}
    assert list(svc.notes(agent_id=AGENT)["note"]) == ["User uses vim."]


# --------------------------------------------------------------------------- errors


def test_unknown_agent_is_a_404_in_the_openai_format(proxy_url, stub):
    with pytest.raises(openai.NotFoundError) as info:
        ask(client(proxy_url, agent="nobody"))
    assert info.value.body["code"] == "agent_not_found" and "nobody" in info.value.body["message"]
    assert stub.requests == []


def test_upstream_errors_are_mapped_and_recorded_as_failures(proxy_url, stub, svc):
    stub.script.append({"status": 500, "message": "model exploded"})
    with pytest.raises(openai.InternalServerError) as info:
        ask(client(proxy_url))
    assert info.value.status_code == 502 and info.value.body["type"] == "upstream_error"
    run = svc.sources.get_agent_run("run-1")
    assert (run["status"], run["success"]) == ("Failed", False) and "model exploded" in run["error_message"]
    assert [r["role"] for r in svc.sources.messages_of("conv-1")] == ["user"]

    stub.script.append({"status": 429, "message": "slow down"})
    with pytest.raises(openai.RateLimitError):
        ask(client(proxy_url, run="run-2"))
    stub.script.append({"status": 500})
    with pytest.raises(openai.InternalServerError):
        ask(client(proxy_url, run="run-3"), stream=True)
    assert svc.sources.get_agent_run("run-3")["success"] is False


def test_an_error_in_mid_stream_reaches_the_client_and_fails_the_run(proxy_url, stub, svc):
    stub.script.append({"content": "partial answer here", "chunks": 3, "fail_after": 1})
    with pytest.raises(openai.APIError):
        streamed(client(proxy_url))
    run = svc.sources.get_agent_run("run-1")
    assert (run["status"], run["success"]) == ("Failed", False)


def test_an_unreachable_upstream_is_a_502(svc):
    svc.configure_agent(AGENT)
    app = create_app(svc, "openai/stub", upstream={"api_base": "http://127.0.0.1:9/v1", "api_key": "x"})
    with running(app) as url, pytest.raises(openai.InternalServerError) as info:
        ask(client(url))
    assert info.value.status_code == 502


def test_without_an_agent_the_request_is_refused_or_passed_through(svc, stub):
    svc.configure_agent(AGENT)
    with _proxy(svc, stub) as url, pytest.raises(openai.BadRequestError) as info:
        ask(client(url, agent=""))
    assert "X-Memory-Agent" in info.value.body["message"] and stub.requests == []
    svc.add_note("User prefers metric units.", agent_id=AGENT, user_id="user-1")
    with _proxy(svc, stub, passthrough=True) as url:
        got = ask(openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0), "plain")
        _, content = streamed(openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0))
    assert got.choices[0].message.content == "ok" and content == "ok"
    assert stub.requests[0]["messages"] == [{"role": "user", "content": "plain"}]
    assert svc.sources.agent_runs_since(None) == []


# --------------------------------------------------------------------------- keys


def test_api_keys_bind_proxy_callers(proxy_url, svc):
    admin = svc.create_api_key(admin=True)
    other = svc.create_api_key(company_id="co-2")
    mine = svc.create_api_key(company_id="co-1", agent_id=AGENT)
    with pytest.raises(openai.AuthenticationError) as info:
        ask(client(proxy_url, api_key="wrong"))
    assert info.value.body["code"] == "invalid_api_key"
    with pytest.raises(openai.PermissionDeniedError):
        ask(client(proxy_url, api_key=other))
    assert ask(client(proxy_url, api_key=mine)).choices[0].message.content == "ok"
    assert ask(client(proxy_url, api_key=admin)).choices[0].message.content == "ok"
    with httpx.Client(base_url=proxy_url) as http:
        assert http.get("/healthz").status_code == 200
        assert http.get("/v1/models").status_code == 401
        body = {"conversation_id": "conv-1", "message_id": "m", "rating": 5}
        denied = http.post("/v1/feedback", json=body, headers={"Authorization": f"Bearer {other}"})
        assert denied.status_code == 403


def test_proxy_refuses_a_public_host_without_keys(home, capsys):
    assert cli.proxy_command(["--home", str(home), "--model", "openai/x", "--host", "0.0.0.0"]) == 1
    assert "memory-pipelines proxy: refusing to listen" in capsys.readouterr().err


# --------------------------------------------------------------------------- real model


@pytest.fixture
def llm_server(tmp_path) -> Iterator[str]:
    pytest.importorskip("llama_cpp")
    from memory_pipelines.apps.cli import COMMANDS

    if "llm-server" not in COMMANDS:
        pytest.skip("memory-pipelines llm-server is not available")
    proc, url = start_server(
        lambda port: [sys.executable, "-m", "memory_pipelines.apps.cli", "llm-server", "--port", str(port)],
        log=tmp_path / "llm-server.log", ready_path="/v1/models", timeout=600, env=subprocess_env(),
    )
    try:
        yield url
    finally:
        stop_process(proc)


@pytest.mark.slow
def test_proxy_in_front_of_the_real_local_model(svc, llm_server):
    from memory_pipelines.apps import llm_server as server_module

    name = getattr(server_module, "DEFAULT_MODEL_NAME", "local")
    svc.configure_agent(AGENT)
    svc.add_note("User's favourite colour is green.", agent_id=AGENT, user_id="user-1")
    app = create_app(svc, f"openai/{name}", upstream={"api_base": llm_server + "/v1", "api_key": "local"})
    with running(app) as url:
        c = client(url, timeout=600)
        got = ask(c, "What is my favourite colour? Answer in one word.", max_tokens=64)
        # whatever the model answers, the client never receives a parseable memoryWrites
        assert split_memory_writes(got.choices[0].message.content or "")[1] is None
        chunks, content = streamed(c, "Say hello.", max_tokens=32)
        assert chunks and split_memory_writes(content)[1] is None
    assert [r["role"] for r in svc.sources.messages_of("conv-1")][:2] == ["user", "assistant"]
    run = svc.sources.get_agent_run("run-1")
    assert (run["status"], run["success"]) == ("Completed", True)


def test_the_cli_routes_proxy(capsys):
    from memory_pipelines.apps.cli import main

    with pytest.raises(SystemExit):
        main(["proxy", "--help"])
    out = capsys.readouterr().out
    assert "--model" in out and "--passthrough" in out and "8766" in out


def test_a_client_tool_named_memory_write_is_left_alone(proxy_url, stub, svc):
    own = {"type": "function", "function": {"name": MEMORY_TOOL, "parameters": {"type": "object"}}}
    stub.script.append({"content": None, "tool_calls": [{"name": MEMORY_TOOL, "arguments": {"note": "x"}}]})
    got = ask(client(proxy_url), tools=[own])
    assert [t["function"]["name"] for t in stub.requests[-1]["tools"]] == [MEMORY_TOOL]
    assert [c.function.name for c in got.choices[0].message.tool_calls] == [MEMORY_TOOL]
    assert svc.notes(agent_id=AGENT).empty


def test_multipart_user_content_is_injected_for_and_recorded(proxy_url, svc):
    parts = [{"type": "text", "text": "first part"}, {"type": "text", "text": "second part"}]
    client(proxy_url).chat.completions.create(model="x", messages=[{"role": "user", "content": parts}])
    assert svc.sources.messages_of("conv-1")[0]["text"] == "first part\nsecond part"


def test_bad_requests_and_upstream_client_errors(proxy_url, stub, svc):
    with httpx.Client(base_url=proxy_url, headers=headers()) as http:
        r = http.post("/v1/chat/completions", content=b"{not json")
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        r = http.post("/v1/chat/completions", json={"messages": []})
        assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
    assert stub.requests == []
    stub.script.append({"status": 400, "message": "context too long"})
    with pytest.raises(openai.BadRequestError) as info:
        ask(client(proxy_url))
    assert "context too long" in info.value.body["message"]
    assert svc.sources.get_agent_run("run-1")["success"] is False


def test_proxy_reports_a_broken_home_in_one_line(tmp_path, capsys, monkeypatch):
    from memory_pipelines.apps.cli import main

    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    home = tmp_path / "home"
    home.write_text("not a folder")
    assert main(["proxy", "--model", "openai/x", "--home", str(home)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(home) in err[0] and "not a folder" in err[0]


# --------------------------------------------------------------------------- trust boundary


@pytest.mark.parametrize("field", ["api_base", "base_url", "api_key", "extra_headers", "mock_response"])
def test_a_client_never_chooses_the_upstream_or_its_credentials(proxy_url, stub, field):
    attacker = create_stub_app()
    with running(attacker) as attacker_url:
        values = {"api_base": attacker_url + "/v1", "base_url": attacker_url + "/v1",
                  "api_key": "sk-client", "extra_headers": {"X-Leak": "1"}, "mock_response": "owned"}
        r = httpx.post(
            proxy_url + "/v1/chat/completions", headers=headers(),
            json={"model": "x", "messages": [{"role": "user", "content": "hi"}], field: values[field]},
            timeout=60,
        )
    assert r.status_code == 400
    assert field in r.json()["error"]["message"]
    assert attacker.state.requests == []
    assert stub.requests == []


def test_only_openai_request_fields_reach_the_upstream(proxy_url, stub):
    r = httpx.post(
        proxy_url + "/v1/chat/completions", headers=headers(),
        json={"model": "x", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.5,
              "vendor_thing": {"a": 1}},
        timeout=60,
    )
    assert r.status_code == 200
    sent = stub.requests[-1]
    assert sent.get("temperature") == 0.5
    assert "vendor_thing" not in sent


# --------------------------------------------------------------------------- first contact

ENVELOPE_TEXT = 'Got it, I\'ll keep "deploy windows" in mind.\nFridays ✓ 😀 — noted.'
DEPLOY = {"note": "Team deploys on Fridays.", "type": "Context", "scopeHint": "agent"}


def envelope(text: str = ENVELOPE_TEXT, writes: list[Any] | None = None) -> str:
    return json.dumps({"answer": text, "memoryWrites": [DEPLOY] if writes is None else writes})


def test_the_client_gets_the_answer_text_not_the_envelope(proxy_url, stub, svc):
    stub.script.append({"content": envelope()})
    got = ask(client(proxy_url), "We deploy on Fridays")
    assert got.choices[0].message.content == ENVELOPE_TEXT
    assert list(svc.notes(agent_id=AGENT)["note"]) == ["Team deploys on Fridays."]
    assert svc.sources.messages_of("conv-1")[-1]["text"] == ENVELOPE_TEXT


@pytest.mark.parametrize("pieces", [3, 17, 200])
def test_a_streamed_envelope_arrives_as_text_chunks(proxy_url, stub, svc, pieces):
    stub.script.append({"content": envelope(), "chunks": pieces})
    chunks, content = streamed(client(proxy_url), "We deploy on Fridays")
    assert content == ENVELOPE_TEXT
    texts = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert all("memoryWrites" not in t and '{"answer"' not in t for t in texts)
    if pieces > 3:
        assert len(texts) > 2  # the answer streams; it is not sent as one buffered piece
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert list(svc.notes(agent_id=AGENT)["note"]) == ["Team deploys on Fridays."]
    assert svc.sources.messages_of("conv-1")[-1]["text"] == ENVELOPE_TEXT


BLOCK_ANSWER = "Noted, deploys are on Fridays.\n\n```memoryWrites\n" + json.dumps([DEPLOY]) + "\n```"


@pytest.mark.parametrize("pieces", [1, 9, 400])
def test_a_trailing_block_is_held_back_while_the_text_streams(proxy_url, stub, svc, pieces):
    stub.script.append({"content": BLOCK_ANSWER, "chunks": pieces})
    chunks, content = streamed(client(proxy_url), "We deploy on Fridays")
    assert content == "Noted, deploys are on Fridays."
    if pieces > 1:
        assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) >= 2
    assert list(svc.notes(agent_id=AGENT)["note"]) == ["Team deploys on Fridays."]
    stub.script.append({"content": BLOCK_ANSWER})
    assert ask(client(proxy_url, run="run-2"), "again").choices[0].message.content == content


def test_text_that_only_looks_like_the_protocol_streams_unchanged(proxy_url, stub, svc):
    for text in ("```python\nprint('```')\n```", "{not json at all", "Use ``` fences. ```mem is fine."):
        stub.script.append({"content": text, "chunks": 7})
        assert streamed(client(proxy_url))[1] == text
        stub.script.append({"content": text})
        assert ask(client(proxy_url)).choices[0].message.content == text
    assert svc.notes(agent_id=AGENT).empty


def test_a_client_that_asked_for_json_keeps_json(proxy_url, stub, svc):
    fmt = {"type": "json_object"}
    stub.script.append({"content": envelope()})
    got = ask(client(proxy_url), response_format=fmt)
    assert json.loads(got.choices[0].message.content) == {"answer": ENVELOPE_TEXT}
    stub.script.append({"content": envelope(), "chunks": 9})
    assert json.loads(streamed(client(proxy_url), response_format=fmt)[1]) == {"answer": ENVELOPE_TEXT}


# --------------------------------------------------------------------------- limits


def test_a_body_over_the_limit_is_a_413_and_nothing_is_recorded(svc, stub):
    svc.configure_agent(AGENT)
    with _proxy(svc, stub, max_body_bytes=20_000) as url:
        with pytest.raises(openai.APIStatusError) as info:
            ask(client(url), "x" * 30_000)
        assert info.value.status_code == 413 and info.value.body["code"] == "request_too_large"
        ask(client(url), "small")  # a body within the limit still passes
    assert not stub.requests[:-1] and svc.sources.messages_of("conv-1")[0]["text"] == "small"


def test_over_a_hundred_writes_keep_the_first_and_report_the_rest(proxy_url, stub, svc):
    writes = [{"note": f"User likes colour number {i}.", "type": "Preference"} for i in range(130)]
    stub.script.append({"content": envelope("Many noted.", writes)})
    c = client(proxy_url)
    assert ask(c, "my colours").choices[0].message.content == "Many noted."
    run = svc.sources.get_agent_run("run-1")
    assert (run["status"], run["success"]) == ("Completed", True)  # the turn is recorded
    assert len(svc.notes(agent_id=AGENT)) == svc.write_config.max_writes_per_run  # the run's cap
    ask(c, "next")
    system = stub.requests[-1]["messages"][0]["content"]
    assert "Memory write results (100 writes):" in system and "**skipped-cap**" in system
    assert "30 more memoryWrites of the previous answer were not saved" in system


@pytest.mark.parametrize("stream", [False, True])
def test_a_hanging_upstream_is_a_504_after_the_timeout(svc, stub, stream):
    svc.configure_agent(AGENT)
    stub.script.append({"content": "late", "delay": 3})  # well past the 0.5 s timeout
    with _proxy(svc, stub, timeout=0.5) as url:
        with pytest.raises(openai.APIStatusError) as info:
            if stream:
                list(ask(client(url), stream=True))
            else:
                ask(client(url))
    assert info.value.status_code == 504 and info.value.body["type"] == "upstream_error"
    run = svc.sources.get_agent_run("run-1")
    assert (run["status"], run["success"]) == ("Failed", False)


def test_the_cli_takes_the_limits_and_refuses_bad_ones(monkeypatch, capsys):
    from memory_pipelines.apps import cli as cli_module

    seen: dict[str, Any] = {}

    class FakeProxy:
        @staticmethod
        def serve(*args: Any, **kwargs: Any) -> int:
            seen.update(kwargs)
            return 0

    monkeypatch.setattr(cli_module, "_app", lambda name: FakeProxy)
    assert cli_module.proxy_command([
        "--model", "offline", "--timeout", "2.5", "--max-body-bytes", "1000",
        "--max-injected-tokens", "400", "--max-injected-tokens", "a-1=200",
    ]) == 0
    assert (seen["timeout"], seen["max_body_bytes"]) == (2.5, 1000)
    assert seen["max_injected_tokens"] == {"*": 400, "a-1": 200}
    monkeypatch.setenv("MEMORY_PROXY_TIMEOUT", "7")
    monkeypatch.setenv("MEMORY_PROXY_MAX_INJECTED_TOKENS", "300")
    assert cli_module.proxy_command(["--model", "offline"]) == 0
    assert seen["timeout"] == 7.0 and seen["max_injected_tokens"] == {"*": 300}
    for bad in (["--timeout", "0"], ["--max-body-bytes", "0"], ["--max-injected-tokens", "a=x"]):
        with pytest.raises(SystemExit):
            cli_module.proxy_command(["--model", "offline", *bad])
    assert "--max-injected-tokens" in capsys.readouterr().err


# --------------------------------------------------------------------------- offline model


def test_the_offline_demo_model_learns_and_injects_end_to_end(svc):
    from memory_pipelines.apps.proxy.offline import LABEL

    svc.configure_agent(AGENT)
    with running(create_app(svc, "offline")) as url:
        first = ask(client(url, run="r1", conversation="c1"), "I prefer metric units.")
        text = first.choices[0].message.content
        assert text.startswith(LABEL) and "User prefers metric units." in text
        assert "memoryWrites" not in text
        assert list(svc.notes(agent_id=AGENT)["note"]) == ["User prefers metric units."]
        # a later run of the same user: the note is injected and the model answers from it
        _, later = streamed(client(url, run="r2", conversation="c2"), "Which units should you use for me?")
        assert later.startswith(LABEL) and "User prefers metric units." in later
        # another user of the agent is not told
        other = ask(client(url, user="user-2", run="r3", conversation="c3"), "Which units?")
        assert "metric" not in other.choices[0].message.content


# --------------------------------------------------------------------------- token budget


def test_a_token_budget_bounds_what_injection_adds(svc, stub):
    from memory_pipelines.apps.proxy.tokens import token_counter

    count = token_counter().count
    svc.configure_agent(AGENT, note_injection_strategy="Recent", max_notes_to_inject=40)
    svc.configure_agent("agent-2", note_injection_strategy="Recent", max_notes_to_inject=40)
    for i in range(40):
        for agent in (AGENT, "agent-2"):
            svc.add_note(f"User fact {i}: prefers option {i} for task {i}.", agent_id=agent, user_id="user-1")
    with _proxy(svc, stub, max_injected_tokens={AGENT: 400}) as url:
        ask(client(url))
        bounded = stub.requests[-1]["messages"][0]["content"]
        ask(client(url, agent="agent-2", run="run-2", conversation="conv-2"))
        unbounded = stub.requests[-1]["messages"][0]["content"]
    assert count(bounded) <= 400 < count(unbounded)
    assert "<memory_policy>" in unbounded and "<memory_policy>" not in bounded  # the policy goes first
    assert "## Durable Memory" in bounded  # the write instructions are never cut
    kept = bounded.count("User fact ")
    assert 0 < kept < unbounded.count("User fact ") == 40
    # what is kept is the injection of the top-ranked notes, rendered as the service does
    full = svc.inject({**CTX, "run_id": "x"}, "hello")
    assert bounded.startswith(render_message(
        render_notes(full.notes[:kept], include_memory_policy=False), render_examples(full.examples[:0])
    ))
    # a budget below the instructions alone leaves the injection out, never the instructions
    with _proxy(svc, stub, max_injected_tokens=10) as url:
        ask(client(url, run="run-3"))
    assert stub.requests[-1]["messages"][0]["content"] == chat_write_instructions(
        svc.get_agent(AGENT), svc.write_config)
    from memory_pipelines.errors import ConfigError

    for bad in (0, -5, True, "300", {AGENT: 0}):
        with pytest.raises(ConfigError, match="max_injected_tokens"):
            create_app(svc, "offline", max_injected_tokens=bad)


def test_notes_a_token_budget_leaves_out_are_not_recorded_as_injected(svc, stub):
    svc.configure_agent(AGENT, note_injection_strategy="Recent", max_notes_to_inject=40)
    for i in range(40):
        svc.add_note(f"User fact {i}: prefers option {i} for task {i}.", agent_id=AGENT, user_id="user-1")
    full = svc.inject({**CTX, "run_id": "probe"}, "hello")
    assert len(full.notes) == 40
    with _proxy(svc, stub, max_injected_tokens=400) as url:
        ask(client(url))
    kept = stub.requests[0]["messages"][0]["content"].count("User fact ")
    assert 0 < kept < 40
    events = svc.sources.injection_events_of("run-1", "note")
    assert [e["item_id"] for e in events] == [n.id for n in full.notes[:kept]]
    assert [e["rank"] for e in events] == list(range(1, kept + 1))
    (step,) = svc.sources.steps("run-1", "Memory Injection")
    output = step["output_json"]
    output = output if isinstance(output, dict) else json.loads(output)
    assert output["memoryAttribution"]["injectedNoteIds"] == [n.id for n in full.notes[:kept]]
    # what the fold counts as accesses: the notes the model saw, once per turn
    counts = svc.sources.injection_counts([n.id for n in full.notes])
    assert all(counts[n.id][0] == 2 for n in full.notes[:kept])  # probe + run-1
    assert all(counts[n.id][0] == 1 for n in full.notes[kept:])  # the probe only
    with _proxy(svc, stub, max_injected_tokens=100_000) as url:  # the injection fits: all 40
        ask(client(url, run="run-3"))
    assert len(svc.sources.injection_events_of("run-3", "note")) == 40


# --------------------------------------------------------------------------- the stream filter


FILTER_CASES = [
    (envelope(), ENVELOPE_TEXT, [DEPLOY]),
    (json.dumps({"answer": "pair \ud83d\ude00 and lone \ud800 x", "memoryWrites": []}),
     "pair 😀 and lone \ufffd x", []),
    ('  {"answer" :  "spaced \\"quote\\" \\\\ back", "memoryWrites": [' + json.dumps(DEPLOY) + "]}",
     'spaced "quote" \\ back', [DEPLOY]),
    (BLOCK_ANSWER, "Noted, deploys are on Fridays.", [DEPLOY]),
    ("Before.\n```memoryWrites\n" + json.dumps([DEPLOY]) + "\n```\nAfter.", "Before.\n\nAfter.", [DEPLOY]),
    ("Plain text with ``` and {braces} and ```mem", "Plain text with ``` and {braces} and ```mem", []),
    ("```python\nx = 1\n```", "```python\nx = 1\n```", []),
]


@pytest.mark.parametrize(("content", "text", "writes"), FILTER_CASES)
def test_every_split_of_a_streamed_answer_gives_the_same_text_and_writes(content, text, writes):
    from memory_pipelines.apps.proxy.turns import ChoiceFilter

    assert split_memory_writes(content) == (text, writes if "memoryWrites" in content else None)
    cuts = [[i] for i in range(1, len(content))] + [list(range(1, len(content)))]
    for points in cuts:
        f = ChoiceFilter(strip=True, intercept=False)
        bounds = [0, *points, len(content)]
        sent = "".join(f.content(content[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
        rest, got = f.flush()
        assert (sent + rest).strip() == text.strip(), (points, sent, rest)
        assert got == writes
        assert "memoryWrites" not in sent + rest


def test_a_lone_surrogate_in_an_answer_is_replaced_not_a_500(proxy_url, stub, svc):
    content = json.dumps({"answer": "bad \ud800 x", "memoryWrites": []})
    stub.script.append({"content": content})
    assert ask(client(proxy_url)).choices[0].message.content == "bad \ufffd x"
    stub.script.append({"content": content, "chunks": 5})
    assert streamed(client(proxy_url))[1] == "bad \ufffd x"
    stub.script.append({"content": "plain \ud800 text", "chunks": 3})
    assert streamed(client(proxy_url))[1] == "plain \ufffd text"
    assert svc.sources.messages_of("conv-1")[-1]["text"] == "plain \ufffd text"


def test_a_lone_surrogate_in_a_passed_through_answer_is_replaced_not_a_500(svc, stub):
    calls = [{"name": "get_weather", "arguments": '{"city": "lone \ud800 town"}'}]
    stub.script.extend([
        {"content": "plain \ud800 text"},
        {"content": "plain \ud800 text", "chunks": 3},
        {"content": None, "tool_calls": calls},
    ])
    with _proxy(svc, stub, passthrough=True) as url:
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        assert ask(c).choices[0].message.content == "plain \ufffd text"
        assert streamed(c)[1] == "plain \ufffd text"
        call = ask(c, tools=[WEATHER_TOOL]).choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments) == {"city": "lone \ufffd town"}
    assert svc.sources.agent_runs_since(None) == []  # passed through: nothing recorded


def test_a_lone_surrogate_in_a_tool_call_of_a_memory_turn_is_replaced_not_a_500(proxy_url, stub):
    stub.script.append({"content": None, "tool_calls": [{"name": "get_weather", "arguments": '"\ud800"'}]})
    call = ask(client(proxy_url), tools=[WEATHER_TOOL]).choices[0].message.tool_calls[0]
    assert call.function.arguments == '"\ufffd"'
