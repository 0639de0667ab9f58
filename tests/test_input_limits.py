"""Hostile input at the boundary (CONTRACT §2.8): text that is not UTF-8, huge values and
out-of-range agent settings get a clear error naming the field, and nothing stored is
lost or half-saved."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from reliability_helpers import running, snapshot

from memory_pipelines import RunContext
from memory_pipelines.apps.http import create_app
from memory_pipelines.apps.mcp_server import build_server
from memory_pipelines.errors import MemoryPipelineError, ValidationError

A = "agent-1"
CTX = {"agent_id": A, "run_id": "run-1", "user_id": "u1"}
BAD = "bad \ud800 text"


@pytest.fixture
def agent(svc):
    svc.configure_agent(A, note_injection_strategy="Recent")
    return A


@pytest.fixture
def client(svc, agent) -> Iterator[httpx.Client]:
    with running(create_app(svc)) as url, httpx.Client(base_url=url, timeout=60) as c:
        yield c


def post(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    """POST ``body`` as JSON text; a lone surrogate goes out as a ``\\ud800`` escape."""
    return client.post(
        path, content=json.dumps(body), headers={"content-type": "application/json"}
    )


def mcp_call(svc: Any, name: str, args: dict[str, Any]) -> Any:
    async def run() -> Any:
        with anyio.fail_after(60):  # a tool that never answers fails the test, not hangs it
            async with Client(build_server(svc), mode="legacy") as client:
                return await client.call_tool(name, args)

    return anyio.run(run)


# --------------------------------------------------------------------------- lone surrogates


def test_a_write_item_with_a_lone_surrogate_is_rejected_and_the_others_proceed(svc, agent):
    results = svc.write(CTX, [{"note": "User likes tea."}, {"note": BAD}, {"note": "User owns a cat."}])
    assert [r.disposition for r in results] == ["written", "rejected-type", "written"]
    assert "'note'" in results[1].reason and "UTF-8" in results[1].reason
    feedback = svc.format_write_feedback(results)
    feedback.encode("utf-8")
    json.dumps([r.request for r in results], ensure_ascii=False).encode("utf-8")
    steps = svc.sources.steps("run-1", "Memory Write")
    assert [s["status"] for s in steps] == ["Completed", "Failed", "Completed"]
    assert sorted(svc.notes()["note"]) == ["User likes tea.", "User owns a cat."]


@pytest.mark.parametrize("field", ["type", "scopeHint"])
def test_a_surrogate_in_another_write_field_names_that_field(svc, agent, field):
    (result,) = svc.write(CTX, [{"note": "User likes tea.", field: BAD}])
    assert result.disposition == "rejected-type"
    assert f"'{field}'" in result.reason
    result.reason.encode("utf-8")
    svc.format_write_feedback([result]).encode("utf-8")


@pytest.mark.parametrize(
    "field", ["agent_id", "run_id", "user_id", "company_id", "conversation_id", "primary_scope_record_id"]
)
def test_a_surrogate_in_a_context_field_is_a_validation_error_naming_it(svc, agent, field):
    svc.write(CTX, [{"note": "User likes tea."}])
    before = snapshot(svc)
    ctx = {**CTX, field: BAD}
    for call in (lambda: svc.write(ctx, [{"note": "User owns a dog."}]), lambda: svc.inject(ctx, "tea")):
        with pytest.raises(ValidationError, match=field):
            call()
    with pytest.raises(ValueError, match=field):
        RunContext(**ctx)
    assert snapshot(svc) == before


def test_a_surrogate_in_secondary_scopes_is_a_validation_error(svc, agent):
    with pytest.raises(ValidationError, match="secondary_scopes"):
        svc.inject({**CTX, "secondary_scopes": {"region": BAD}}, "tea")


def test_surrogates_in_service_arguments_name_the_field(svc, agent):
    with pytest.raises(ValidationError, match="current_input"):
        svc.inject(CTX, BAD)
    with pytest.raises(ValidationError, match="topic"):
        svc.explain(CTX, BAD)
    with pytest.raises(ValidationError, match="current_input"):
        svc.explain(CTX, "tea", BAD)
    with pytest.raises(ValidationError, match="name"):
        svc.configure_agent(A, name=BAD)
    with pytest.raises(ValidationError, match="scope_config"):
        svc.configure_agent(A, scope_config={"dimensions": [{"name": BAD}]})
    with pytest.raises(ValidationError, match="agent_id"):
        svc.configure_agent(BAD)
    with pytest.raises(ValidationError, match="note"):
        svc.add_note(BAD, agent_id=A)
    with pytest.raises(ValidationError, match="user_id"):
        svc.add_note("User likes tea.", agent_id=A, user_id=BAD)
    with pytest.raises(ValidationError, match="example_output"):
        svc.add_example(A, "question", BAD)
    assert svc.notes().empty and svc.examples().empty
    assert svc.get_agent(A).name is None


def test_http_surrogates_are_per_item_rejections_or_422(client, svc):
    r = post(client, "/v1/memory-writes", {"context": CTX, "writes": [{"note": "User likes tea."}, {"note": BAD}]})
    assert r.status_code == 200, r.text
    assert [x["disposition"] for x in r.json()["results"]] == ["written", "rejected-type"]
    for path, body, field in (
        ("/v1/memory-writes", {"context": {**CTX, "user_id": BAD}, "writes": [{"note": "x y z"}]}, "user_id"),
        ("/v1/inject", {"context": {**CTX, "user_id": BAD}}, "user_id"),
        ("/v1/inject", {"context": CTX, "current_input": BAD}, "current_input"),
        ("/v1/explain", {"context": CTX, "topic": BAD}, "topic"),
    ):
        r = post(client, path, body)
        assert r.status_code == 422, (path, r.text)
        assert field in r.json()["detail"]
    assert svc.notes()["note"].tolist() == ["User likes tea."]


def test_mcp_surrogates_answer_instead_of_hanging(svc, agent):
    wrote = mcp_call(svc, "memory_write", {"context": CTX, "writes": [{"note": BAD}]})
    assert not wrote.is_error, wrote.content
    assert json.loads(wrote.content[0].text)["results"][0]["disposition"] == "rejected-type"
    for name, args, field in (
        ("memory_inject", {"context": {**CTX, "user_id": BAD}}, "user_id"),
        ("memory_inject", {"context": CTX, "current_input": BAD}, "current_input"),
        ("memory_explain", {"context": CTX, "topic": BAD}, "topic"),
        ("memory_write", {"context": {**CTX, "run_id": BAD}, "writes": [{"note": "x"}]}, "run_id"),
    ):
        res = mcp_call(svc, name, args)
        assert res.is_error and field in res.content[0].text, (name, res.content)
    assert svc.notes().empty


def test_validation_error_is_a_project_error():
    assert issubclass(ValidationError, MemoryPipelineError)


# --------------------------------------------------------------------------- agent settings


@pytest.mark.parametrize("field", ["max_notes_to_inject", "max_examples_to_inject"])
@pytest.mark.parametrize("value", [10**18, 101, -1, 2.5, True, "5", None])
def test_configure_agent_rejects_out_of_range_counts(svc, agent, field, value):
    with pytest.raises(ValidationError, match=field):
        svc.configure_agent(A, **{field: value})
    assert getattr(svc.get_agent(A), field) == {"max_notes_to_inject": 5, "max_examples_to_inject": 3}[field]


@pytest.mark.parametrize("field", ["max_notes_to_inject", "max_examples_to_inject"])
def test_configure_agent_accepts_the_bounds(svc, agent, field):
    assert getattr(svc.configure_agent(A, **{field: 100}), field) == 100
    assert getattr(svc.configure_agent(A, **{field: 0}), field) == 0


@pytest.mark.parametrize(
    "value",
    [
        {"dimensions": ["region"]},
        {"dimensions": "region"},
        {"defaultInheritanceMode": "sideways"},
        {"dimensions": [{"name": "region", "inheritanceMode": "up"}]},
        ["sharedOnly"],
        "not json",
    ],
)
def test_configure_agent_rejects_a_malformed_scope_config(svc, agent, value):
    with pytest.raises(ValidationError, match="scope_config"):
        svc.configure_agent(A, scope_config=value)
    assert svc.get_agent(A).scope_config is None
    svc.inject(CTX, "tea")


@pytest.mark.parametrize(
    "value",
    [
        {"retrievalMultiplier": 10**18},
        {"retrieval_multiplier": 0},
        {"retrievalMultiplier": "3"},
        {"enabled": "yes"},
        {"fallbackOnError": 1},
        {"type": 7},
        {"model": ["m"]},
        ["enabled"],
    ],
)
def test_configure_agent_rejects_a_malformed_reranker_config(svc, agent, value):
    with pytest.raises(ValidationError, match="reranker_config"):
        svc.configure_agent(A, reranker_config=value)
    assert svc.get_agent(A).reranker_config is None


@pytest.mark.parametrize("field", ["note_injection_strategy", "example_injection_strategy"])
def test_configure_agent_rejects_unknown_strategies(svc, agent, field):
    with pytest.raises(ValidationError, match=field):
        svc.configure_agent(A, **{field: "Whatever"})


def test_a_stored_out_of_range_count_is_clamped_on_read(svc, agent, caplog):
    svc.add_note("User likes tea.", agent_id=A, user_id="u1")
    bad = svc.get_agent(A).model_copy(update={"max_notes_to_inject": 10**18, "max_examples_to_inject": 10**18})
    svc.sources.upsert_agent(bad)  # a row stored before configure_agent checked the range
    with caplog.at_level("WARNING"):
        assert svc.get_agent(A).max_notes_to_inject == 100
    assert "max_notes_to_inject" in caplog.text
    assert [n.note for n in svc.inject(CTX, "tea").notes] == ["User likes tea."]
    assert svc.explain(CTX, "tea").notes


@pytest.mark.parametrize("limit", [10**9, 101, 0, True, 2.5])
def test_explain_limit_is_bounded_everywhere(svc, agent, limit):
    with pytest.raises(ValidationError, match="limit"):
        svc.explain(CTX, "tea", limit=limit)
    res = mcp_call(svc, "memory_explain", {"context": CTX, "topic": "tea", "limit": 10**9})
    assert res.is_error and "limit" in res.content[0].text
    assert svc.explain(CTX, "tea", limit=100).topic == "tea"


def test_a_stored_malformed_scope_config_fails_closed_with_a_clear_error(svc, agent):
    from memory_pipelines.errors import ConfigError

    svc.sources.upsert_agent(svc.get_agent(A).model_copy(update={"scope_config": {"dimensions": "x"}}))
    with pytest.raises(ConfigError, match="agent-1.*malformed scope_config.*configure_agent"):
        svc.inject(CTX, "tea")


# --------------------------------------------------------------------------- size limits


def test_limits_have_documented_defaults_and_env_overrides(monkeypatch):
    from memory_pipelines.errors import ConfigError
    from memory_pipelines.limits import Limits, limits

    d = Limits()
    assert (d.max_body_bytes, d.max_writes_per_request, d.max_note_chars) == (1 << 20, 100, 2000)
    assert (d.max_retrieval_chars, d.max_id_chars, d.audit_text_prefix) == (4000, 200, 200)
    assert d.max_injected_items == 100
    monkeypatch.setenv("MEMORY_MAX_WRITES_PER_REQUEST", "7")
    assert limits().max_writes_per_request == 7
    monkeypatch.setenv("MEMORY_MAX_WRITES_PER_REQUEST", "lots")
    with pytest.raises(ConfigError, match="MEMORY_MAX_WRITES_PER_REQUEST"):
        limits()
    # every limit is documented where users look up settings
    page = (__import__("pathlib").Path(__file__).parents[1] / "docs/reference/configuration.md").read_text()
    for f in __import__("dataclasses").fields(Limits):
        assert f"`MEMORY_{f.name.upper()}`" in page, f.name


def test_too_many_writes_in_one_request_is_a_validation_error(svc, agent):
    before = snapshot(svc)
    with pytest.raises(ValidationError, match="writes"):
        svc.write(CTX, [{"note": f"User fact {i}."} for i in range(101)])
    assert snapshot(svc) == before and svc.sources.steps("run-1") == []


def test_a_huge_note_is_rejected_and_neither_stored_nor_echoed_whole(svc, agent):
    import hashlib

    huge = "x" * 5_000_000
    (result,) = svc.write(CTX, [{"note": huge}])
    assert result.disposition == "rejected-type" and "2000-character limit" in result.reason
    assert len(json.dumps(result.request)) < 1000
    (step,) = svc.sources.steps("run-1", "Memory Write")
    stored = json.dumps(step["input_json"]) if not isinstance(step["input_json"], str) else step["input_json"]
    assert len(stored) < 1000
    assert hashlib.sha256(huge.encode()).hexdigest() in stored
    assert svc.notes().empty


@pytest.mark.parametrize("field", ["agent_id", "run_id", "user_id", "company_id", "conversation_id"])
@pytest.mark.parametrize("value", ["r" * 201, "run\x00id", "run\nid", "a\x7fb"])
def test_ids_are_bounded_and_printable(svc, agent, field, value):
    with pytest.raises(ValidationError, match=field):
        svc.write({**CTX, field: value}, [{"note": "User likes tea."}])
    assert svc.notes().empty
    with pytest.raises(ValidationError, match="agent_id"):
        svc.configure_agent("a" * 201)
    with pytest.raises(ValidationError, match="user_id"):
        svc.add_note("User likes tea.", agent_id=A, user_id="u" * 201)
    assert svc.write({**CTX, "run_id": "r" * 200}, [{"note": "User likes tea."}])[0].disposition == "written"


def test_retrieval_uses_the_last_4000_characters_of_the_input(svc, agent, monkeypatch):
    svc.configure_agent(A, note_injection_strategy="Relevant")
    svc.add_note("User likes green tea.", agent_id=A, user_id="u1")
    seen: list[int] = []
    embed = svc.notebook.embed
    monkeypatch.setattr(svc.notebook, "embed", lambda texts: seen.extend(map(len, texts)) or embed(texts))
    svc.inject(CTX, "x " * 3_000_000 + "green tea")
    svc.explain(CTX, "y " * 3_000_000 + "green tea")
    assert seen and max(seen) <= 4000


def test_http_body_size_is_bounded_with_413(client, svc):
    big = {"context": CTX, "writes": [{"note": "x" * (2 << 20)}]}
    r = post(client, "/v1/memory-writes", big)
    assert r.status_code == 413
    assert "1048576" in r.json()["detail"]
    r = client.post(
        "/v1/inject",
        content=iter([b'{"context": {"agent_id": "agent-1"}, "current_input": "', b"x" * (2 << 20), b'"}']),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413
    r = post(client, "/v1/memory-writes", {"context": CTX, "writes": [{"note": "n"}] * 101})
    assert r.status_code == 422 and "writes" in r.json()["detail"]
    assert svc.notes().empty
    assert post(client, "/v1/inject", {"context": CTX, "current_input": "tea"}).status_code == 200
