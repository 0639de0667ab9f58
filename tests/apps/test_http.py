"""The HTTP API over a real uvicorn server on loopback, talked to with httpx; and the
``memory-pipelines serve`` command as a subprocess."""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from reliability_helpers import running, start_server, stop_process

from memory_pipelines.apps.http import RunLocks, create_app
from memory_pipelines.errors import StoreError, ValidationError

AGENT = "agent-1"
CTX = {"agent_id": AGENT, "run_id": "run-1", "user_id": "user-1", "company_id": "co-1"}


@pytest.fixture
def client(svc) -> Iterator[httpx.Client]:
    svc.configure_agent(AGENT, note_injection_strategy="Recent")
    with running(create_app(svc)) as url, httpx.Client(base_url=url, timeout=60) as c:
        yield c


# --------------------------------------------------------------------------- basics


def test_healthz_reports_versions_and_counts(client, svc):
    r = client.get("/healthz")
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "ok"
    assert body["counts"] == {"notes": 0, "injectable_notes": 0, "examples": 0, "agents": 1}
    assert isinstance(body["notes_version"], int) and isinstance(body["examples_version"], int)
    svc.add_note("A note", agent_id=AGENT)
    svc.add_note("An archived note", agent_id=AGENT, status="Archived")
    body2 = client.get("/healthz").json()
    assert body2["counts"]["notes"] == 2 and body2["counts"]["injectable_notes"] == 1
    assert body2["notes_version"] > body["notes_version"]


def test_openapi_lists_the_endpoints(client):
    r = client.get("/openapi.json")
    assert r.status_code == 200
    spec = r.json()
    assert "post" in spec["paths"]["/v1/memory-writes"]
    assert "post" in spec["paths"]["/v1/inject"]
    assert "get" in spec["paths"]["/healthz"]
    schemas = spec["components"]["schemas"]
    assert {"WritesRequest", "InjectRequest", "RunContext", "ErrorResponse"} <= set(schemas)
    for path in ("/v1/memory-writes", "/v1/inject"):
        responses = spec["paths"][path]["post"]["responses"]
        assert {"200", "404", "422", "500"} <= set(responses)
        ref = responses["422"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("/ErrorResponse")


# --------------------------------------------------------------------------- writes


def test_write_happy_path(client, svc):
    writes = [{"note": "User prefers tea over coffee", "type": "Preference", "scopeHint": "user"}]
    r = client.post("/v1/memory-writes", json={"context": CTX, "writes": writes})
    assert r.status_code == 200, r.text
    body = r.json()
    (result,) = body["results"]
    assert result["disposition"] == "written"
    assert result["final_scope"] == {"agent_id": AGENT, "user_id": "user-1", "company_id": "co-1"}
    assert result["request"] == writes[0]
    assert result["duration_ms"] >= 0 and isinstance(result["reason"], str)
    assert body["feedback"].startswith("Memory write result:")
    note = svc.get_note(result["note_id"])
    assert note.note == "User prefers tea over coffee" and note.user_id == "user-1"
    assert note.source_run_id == "run-1"


def test_empty_write_batch(client):
    r = client.post("/v1/memory-writes", json={"context": CTX, "writes": []})
    assert r.status_code == 200, r.text
    assert r.json()["results"] == []


def test_malformed_single_write_is_rejected_type_not_422(client, svc):
    writes = [
        {"note": "User works in the Berlin office", "type": "Context"},
        42,
        {"type": "Preference"},
        {"note": "x", "scopeHint": "galaxy"},
        None,
    ]
    r = client.post("/v1/memory-writes", json={"context": CTX, "writes": writes})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["disposition"] for x in results] == [
        "written",
        "rejected-type",
        "rejected-type",
        "rejected-type",
        "rejected-type",
    ]
    assert results[1]["request"] == 42 and results[4]["request"] is None
    assert all(x["reason"] for x in results[1:])
    assert "galaxy" in results[3]["reason"]
    assert len(svc.notes()) == 1


def test_non_finite_numbers_in_a_write_are_echoed_safely(client):
    body = '{"context": {"agent_id": "agent-1", "run_id": "r"}, "writes": [{"note": NaN}]}'
    r = client.post("/v1/memory-writes", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    (result,) = r.json()["results"]
    assert result["disposition"] == "rejected-type"


def test_concurrent_writes_of_one_run_respect_the_cap(client, svc):
    topics = [
        "quarterly invoices go to the finance mailbox",
        "standup meets at nine fifteen sharp",
        "dark mode is enabled on every laptop",
        "Kubernetes upgrades happen on Thursdays",
        "billing exports use semicolon separated CSV",
        "the Rust toolchain is pinned to stable",
        "passwords rotate every ninety days",
        "release notes are written in German",
    ]
    ctx = {**CTX, "run_id": "run-concurrent"}
    results: list[dict] = []
    errors: list[BaseException] = []

    def post(text: str) -> None:
        try:
            r = client.post("/v1/memory-writes", json={"context": ctx, "writes": [{"note": text}]})
            assert r.status_code == 200, r.text
            results.extend(r.json()["results"])
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=post, args=(t,)) for t in topics]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    dispositions = sorted(x["disposition"] for x in results)
    cap = svc.write_config.max_writes_per_run
    assert dispositions.count("written") == cap
    assert dispositions.count("skipped-cap") == len(topics) - cap
    assert len(svc.notes(source_run_id="run-concurrent")) == cap


def test_run_locks_are_shared_per_run_and_forgotten():
    locks = RunLocks()
    a = locks.get("r1")
    assert locks.get("r1") is a and locks.get("r2") is not a
    key_count = len(locks._locks)
    del a
    assert len(locks._locks) < key_count


# --------------------------------------------------------------------------- inject


def test_inject_happy_path(client, svc):
    note = svc.add_note("User prefers tea over coffee", agent_id=AGENT, user_id="user-1")
    svc.add_note("Someone else's secret", agent_id=AGENT, user_id="user-2")
    r = client.post(
        "/v1/inject",
        json={"context": {**CTX, "run_id": "run-2"}, "current_input": "What should I drink?"},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert "User prefers tea over coffee" in body["message"]
    assert "secret" not in body["message"]
    assert [n["id"] for n in body["notes"]] == [note.id]
    assert body["notes"][0]["created_at"].startswith("2026-06-01T12:00:00")
    assert body["examples"] == []


def test_inject_without_current_input_and_nothing_to_inject(client):
    r = client.post("/v1/inject", json={"context": {"agent_id": AGENT}})
    assert r.status_code == 200, r.text
    assert r.json() == {"message": "", "notes": [], "examples": []}


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("path", ["/v1/memory-writes", "/v1/inject"])
def test_bad_json_is_422_with_a_message(client, path):
    r = client.post(path, content=b'{"context": {', headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert "not valid JSON" in r.json()["detail"]


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/v1/memory-writes", {"writes": []}, "context"),
        ("/v1/memory-writes", {"context": CTX}, "writes"),
        ("/v1/memory-writes", {"context": CTX, "writes": {"note": "x"}}, "writes"),
        ("/v1/memory-writes", {"context": CTX, "writes": "remember this"}, "writes"),
        ("/v1/memory-writes", {"context": {"run_id": "r"}, "writes": []}, "context.agent_id"),
        ("/v1/memory-writes", {"context": {"agent_id": 5}, "writes": []}, "context.agent_id"),
        ("/v1/memory-writes", {"context": {"agent_id": ""}, "writes": []}, "context.agent_id"),
        ("/v1/memory-writes", {"context": "agent-1", "writes": []}, "context"),
        (
            "/v1/memory-writes",
            {"context": {**CTX, "colour": "red"}, "writes": []},
            "context.colour",
        ),
        ("/v1/memory-writes", {"context": CTX, "writes": [], "extra": 1}, "extra"),
        ("/v1/memory-writes", [1, 2], "body"),
        ("/v1/inject", {}, "context"),
        ("/v1/inject", {"context": CTX, "current_input": 5}, "current_input"),
        ("/v1/inject", {"context": {**CTX, "secondary_scopes": [1]}}, "secondary_scopes"),
        ("/v1/inject", {"context": {"agent_id": AGENT, "user_id": ["u"]}}, "context.user_id"),
    ],
)
def test_invalid_fields_are_422_naming_the_field(client, path, body, needle):
    r = client.post(path, json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str) and needle in detail
    assert r.json()["errors"]


def test_empty_body_is_422(client):
    r = client.post("/v1/memory-writes")
    assert r.status_code == 422
    assert "body" in r.json()["detail"]


@pytest.mark.parametrize("path", ["/v1/memory-writes", "/v1/inject"])
def test_unknown_agent_is_404(client, path):
    body = {"context": {**CTX, "agent_id": "ghost-agent"}, "writes": [{"note": "x"}]}
    if path == "/v1/inject":
        body = {"context": {**CTX, "agent_id": "ghost-agent"}, "current_input": "hi"}
    r = client.post(path, json=body)
    assert r.status_code == 404, r.text
    assert "ghost-agent" in r.json()["detail"]


def test_write_without_run_id_is_422(client):
    r = client.post(
        "/v1/memory-writes", json={"context": {"agent_id": AGENT}, "writes": [{"note": "x"}]}
    )
    assert r.status_code == 422, r.text
    assert "run_id" in r.json()["detail"]


def test_service_validation_error_is_422(client, svc, monkeypatch):
    def refuse(ctx, current_input=None, **_):
        raise ValidationError("current_input is too long")

    monkeypatch.setattr(svc, "inject", refuse)
    r = client.post("/v1/inject", json={"context": CTX, "current_input": "x"})
    assert r.status_code == 422
    assert r.json()["detail"] == "current_input is too long"


@pytest.mark.parametrize("exc", [RuntimeError("secret internals"), StoreError("secret store path")])
def test_unexpected_errors_are_500_with_a_generic_message(client, svc, monkeypatch, exc, caplog):
    def boom(*args, **kwargs):
        raise exc

    monkeypatch.setattr(svc, "write", boom)  # the per-request path (MEMORY_WRITE_QUEUE=each/off)
    monkeypatch.setattr(svc, "write_group", boom)  # the group writer (the default)
    with caplog.at_level("ERROR", logger="memory_pipelines.apps.http"):
        r = client.post("/v1/memory-writes", json={"context": CTX, "writes": [{"note": "x"}]})
    assert r.status_code == 500
    assert "secret" not in r.text and "see the server log" in r.json()["detail"]
    assert any("secret" in (rec.exc_text or "") for rec in caplog.records)
    assert client.get("/healthz").status_code == 200  # the server keeps serving


# --------------------------------------------------------------------------- the CLI


def test_cli_serve_answers_healthz(tmp_path):
    exe = shutil.which("memory-pipelines", path=str(Path(sys.executable).parent))
    cmd = [exe] if exe else [sys.executable, "-m", "memory_pipelines.apps.cli"]
    env = {
        **os.environ,
        "MEMORY_EMBEDDING_MODEL": "hash",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    env.pop("MEMORY_LANCE_URI", None)
    env.pop("MEMORY_SQL_URL", None)
    home = tmp_path / "served-home"
    log = tmp_path / "serve.log"
    proc, url = start_server(
        lambda port: [
            *cmd, "serve", "--home", str(home), "--port", str(port), "--log-level", "warning"
        ],
        log=log,
        env=env,
        text=True,
    )
    try:
        body = httpx.get(f"{url}/healthz", timeout=30).json()
        assert body["status"] == "ok" and body["counts"]["notes"] == 0
        assert (home / "lance").is_dir() and (home / "memory.sqlite3").is_file()
        r = httpx.post(f"{url}/v1/inject", json={"context": {"agent_id": "nobody"}}, timeout=30)
        assert r.status_code == 404
    finally:
        code = stop_process(proc)
    assert code == 0, log.read_text()[-3000:]


@pytest.mark.parametrize("port", ["99999", "0", "-1", "65536"])
def test_cli_serve_rejects_a_port_out_of_range(port, tmp_path, capsys):
    from memory_pipelines.apps.cli import serve_command as main

    with pytest.raises(SystemExit) as exc:
        main(["--home", str(tmp_path / "h"), "--port", port])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--port" in err and "1..65535" in err
    assert not (tmp_path / "h").exists()  # refused before opening anything
