"""The proxy's answer envelope without writes, through the official ``openai`` client: a
model that answers ``{"answer": "..."}`` with nothing to save gives a chat client the
answer's text (streamed and not), while a client that asked for JSON keeps its JSON, and
what is recorded as the assistant's turn is what the client read."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from reliability_helpers import running

from memory_pipelines.apps.proxy import create_app

AGENT = "agent-1"
IDS = {"agent": AGENT, "user": "user-1", "company": "co-1", "run": "run-1", "conversation": "conv-1"}
TEXT = 'Marathons are 42.2 km "long" \u2014 about 26.2 miles.'
ENVELOPES = [
    json.dumps({"answer": TEXT}),
    json.dumps({"answer": TEXT}, ensure_ascii=False, indent=2),
    "```json\n" + json.dumps({"answer": TEXT}) + "\n```",
]


@pytest.fixture
def proxy(svc, stub) -> Iterator[openai.OpenAI]:
    svc.configure_agent(AGENT, note_injection_strategy="Recent")
    upstream = {"api_base": stub.url + "/v1", "api_key": "sk-stub"}
    with running(create_app(svc, "openai/stub", upstream=upstream)) as url:
        yield openai.OpenAI(
            base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60,
            default_headers={f"X-Memory-{k.capitalize()}": v for k, v in IDS.items()},
        )


def ask(c: openai.OpenAI, stream: bool, **kwargs: Any) -> str:
    messages = [{"role": "user", "content": "How long is a marathon?"}]
    if not stream:
        got = c.chat.completions.create(model="anything", messages=messages, **kwargs)
        return got.choices[0].message.content
    chunks = c.chat.completions.create(model="anything", messages=messages, stream=True, **kwargs)
    return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


def recorded_answer(svc) -> str:
    rows = svc.sources.messages_of("conv-1")
    return [r["text"] for r in rows if r["role"] == "assistant"][-1]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize("content", ENVELOPES, ids=["compact", "indented", "fenced"])
def test_an_envelope_without_writes_gives_a_chat_client_the_answer_text(proxy, stub, svc, content, stream):
    stub.script.append({"content": content, "chunks": 7})
    assert ask(proxy, stream) == TEXT
    assert recorded_answer(svc) == TEXT
    assert svc.notes(agent_id=AGENT).empty


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_client_that_asked_for_json_keeps_the_envelope_as_json(proxy, stub, stream):
    stub.script.append({"content": json.dumps({"answer": TEXT}), "chunks": 5})
    got = ask(proxy, stream, response_format={"type": "json_object"})
    assert json.loads(got) == {"answer": TEXT}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_other_json_and_a_non_string_answer_stay_as_the_model_wrote_them(proxy, stub, stream):
    # (an envelope that starts like the answer's and adds fields is streamed as its
    # answer's text as it arrives: it is not listed here)
    for content in ('{"answer": 42}', '{"reply": "x"}', '{"sources": [1], "answer": "x"}'):
        stub.script.append({"content": content, "chunks": 4})
        assert ask(proxy, stream) == content
