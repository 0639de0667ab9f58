"""The note store on S3-compatible object storage: a real moto S3 server on loopback,
LanceDB's own S3 client, endpoint and credentials from the environment only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import boto3
import pytest

from memory_pipelines import MemoryService
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.errors import ConfigError
from memory_pipelines.storage import STORAGE_OPTIONS_ENV, lance_storage_options
from memory_pipelines.store import eq

REPO = Path(__file__).resolve().parents[1]

# ``s3_endpoint`` and ``s3_uri`` (conftest.py): the moto S3 server and a fresh prefix


def _keys(endpoint: str, uri: str) -> list[str]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    s3 = boto3.client("s3", endpoint_url=endpoint)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
    return [o["Key"] for page in pages for o in page.get("Contents", [])]


# --------------------------------------------------------------------------- options


def test_storage_options_derive_from_a_custom_endpoint():
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}
    assert lance_storage_options("s3://b/p", env=env) == {
        "aws_endpoint": "http://127.0.0.1:9000",
        "aws_virtual_hosted_style_request": "false",
        "allow_http": "true",
    }
    # The S3-specific endpoint wins; HTTPS needs no allow_http.
    env["AWS_ENDPOINT_URL_S3"] = "https://minio.example:9000"
    assert lance_storage_options("s3://b/p", env=env) == {
        "aws_endpoint": "https://minio.example:9000",
        "aws_virtual_hosted_style_request": "false",
    }
    # Plain AWS S3 and local folders need nothing.
    assert lance_storage_options("s3://b/p", env={}) is None
    assert lance_storage_options("/tmp/lance", env=env) is None


def test_storage_options_json_and_explicit_options_win_in_order():
    env = {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        STORAGE_OPTIONS_ENV: json.dumps({"allow_http": False, "timeout": "60s", "max_retries": 5}),
    }
    opts = lance_storage_options("s3://b/p", {"timeout": "5s"}, env=env)
    assert opts == {
        "aws_endpoint": "http://127.0.0.1:9000",
        "aws_virtual_hosted_style_request": "false",
        "allow_http": "false",
        "timeout": "5s",
        "max_retries": "5",
    }
    # The JSON applies to any object store, not only S3.
    env = {STORAGE_OPTIONS_ENV: '{"service_account": "/k.json"}'}
    assert lance_storage_options("gs://b/p", env=env) == {"service_account": "/k.json"}


@pytest.mark.parametrize(
    ("raw", "message"),
    [("{not json", "not valid JSON"), ('["a"]', "JSON object"), ('{"a": {"b": 1}}', "'a'")],
)
def test_bad_storage_options_json_is_a_config_error(raw, message):
    with pytest.raises(ConfigError, match=message):
        lance_storage_options("s3://b/p", env={STORAGE_OPTIONS_ENV: raw})


# --------------------------------------------------------------------------- the store on S3


def test_notes_round_trip_search_upsert_version_and_optimize_on_s3(
    s3_endpoint, s3_uri, tmp_path, open_service
):
    home = tmp_path / "home"
    with open_service(home, lance_uri=s3_uri) as svc:
        assert svc.store.uri == s3_uri
        tea = svc.add_note("user prefers green tea in the afternoon", agent_id="a", user_id="u")
        svc.add_note("deploys happen on Thursdays after standup", agent_id="a", type="Context")
        invoices = svc.add_note(
            "invoices are sent to the finance mailbox", agent_id="a", user_id="u"
        )
        assert svc.get_note(tea.id) == tea
        assert len(svc.notes(agent_id="a")) == 3

        vec = svc.embed([tea.note])[0]
        hits = svc.store.notes.vector_search(vec, where=eq("user_id", "u"), k=2)
        assert hits[0].item.id == tea.id and hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert [h.item.id for h in svc.store.notes.text_search("green tea")] == [tea.id]
        fused = svc.store.notes.hybrid_search("green tea", vec, k=1)
        assert [h.item.id for h in fused] == [tea.id]

        before = svc.store.notes.version
        archived = svc.set_note_status(tea.id, "Archived", "[archived: test]")
        assert svc.store.notes.version > before
        assert svc.get_note(tea.id).status == "Archived"
        assert svc.get_note(tea.id).comments == archived.comments == "[archived: test]"
        assert svc.store.notes.count() == 3  # the upsert replaced the row

        report = svc.store.optimize()
        assert report["notes"]["version_after"] >= report["notes"]["version_before"]
        assert svc.store.notes.count() == 3
        assert [h.item.id for h in svc.store.notes.text_search("invoices finance")] == [invoices.id]

    # The tables live in the bucket, not in the home folder.
    assert not (home / "lance").exists()
    keys = _keys(s3_endpoint, s3_uri)
    assert any(k.split("/")[1] == "notes.lance" for k in keys)
    assert any(k.split("/")[1] == "examples.lance" for k in keys)

    # A second service (another home, same URI) sees the same notes.
    with open_service(tmp_path / "other", lance_uri=s3_uri) as again:
        assert again.get_note(tea.id).status == "Archived"
        assert sorted(again.notes()["note"]) == sorted(
            [
                "deploys happen on Thursdays after standup",
                "invoices are sent to the finance mailbox",
                "user prefers green tea in the afternoon",
            ]
        )


def test_env_only_service_writes_injects_and_runs_a_cycle_on_s3(
    s3_uri, tmp_path, clock, monkeypatch
):
    """A user sets only environment variables (MEMORY_LANCE_URI + AWS_*): writes,
    injection and a forced Memory Manager cycle (hardening, maintenance, compaction)."""
    monkeypatch.setenv("MEMORY_LANCE_URI", s3_uri)
    monkeypatch.delenv("MEMORY_SQL_URL", raising=False)
    with MemoryService.from_env(
        tmp_path / "home", embedder=HashEmbedder(dim=64), clock=clock
    ) as svc:
        assert svc.store.uri == s3_uri
        svc.configure_agent("agent-1", note_injection_strategy="Recent")
        svc.add_user("user-1")
        ctx = {"agent_id": "agent-1", "run_id": "run-1", "user_id": "user-1"}
        results = svc.write(
            ctx,
            [
                {"note": "User prefers answers in metric units", "type": "Preference"},
                {"note": "User prefers answers in metric units", "type": "Preference"},
            ],
        )
        assert [r.disposition for r in results] == ["written", "skipped-duplicate"]
        injection = svc.inject(ctx, "how far is it to the station?")
        assert [n.id for n in injection.notes] == [results[0].note_id]
        assert "User prefers answers in metric units" in injection.message

        clock.advance(days=1)
        report = svc.manager.run_cycle(force_maintenance=True)
        assert report["maintenanceRan"] is True and report["hardened"] == 1
        assert svc.get_note(results[0].note_id).status == "Active"
        # Compaction (optimize + scalar indexes) ran against the bucket; it logs and skips
        # its audit step on failure, so the step proves it succeeded.
        (compaction,) = svc.sources.steps(step_name="Compact Note Tables")
        assert compaction["status"] == "Completed"
        assert compaction["output_json"]["notesVersionAfter"] >= 1


_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from memory_pipelines import MemoryService

    k, uri, home, sync, n = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), int(sys.argv[5])
    with MemoryService.open(home, lance_uri=uri) as svc:
        (sync / f"ready-{k}").touch()
        deadline = time.monotonic() + 120
        while not (sync / "go").exists():
            if time.monotonic() > deadline:
                sys.exit("no go signal")
            time.sleep(0.01)
        for i in range(n):
            svc.add_note(f"writer {k} remembers fact number {i}", id=f"w{k}-{i:03d}", agent_id="a")
            if i % 4 == 3:
                svc.add_note(f"shared note last touched by writer {k} at step {i}", id="shared", agent_id="a")
    print("ok", k)
    """
)


@pytest.mark.slow
def test_two_writer_processes_on_one_s3_table_lose_nothing(s3_uri, tmp_path, open_service):
    """Two processes upsert 40 distinct notes each, and the same note 10 times each,
    concurrently into one S3 table: every distinct note survives, the shared one is one row."""
    per_writer = 40
    sync = tmp_path / "sync"
    sync.mkdir()
    env = {**os.environ, "MEMORY_EMBEDDING_MODEL": "hash", "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WRITER,
                k,
                s3_uri,
                str(tmp_path / f"home-{k}"),
                str(sync),
                str(per_writer),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k in ("1", "2")
    ]
    try:
        deadline = time.monotonic() + 120
        while not all((sync / f"ready-{k}").exists() for k in ("1", "2")):
            assert time.monotonic() < deadline, "writers did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.05)
        (sync / "go").touch()
        outputs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert out.startswith("ok")

    with open_service(tmp_path / "reader", lance_uri=s3_uri, clock=None) as svc:
        ids = sorted(svc.notes()["id"])
        shared = svc.get_note("shared")
    expected = sorted(f"w{k}-{i:03d}" for k in ("1", "2") for i in range(per_writer))
    assert ids == sorted([*expected, "shared"])
    assert shared is not None and shared.note.endswith(f"at step {per_writer - 1}")
