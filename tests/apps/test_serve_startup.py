"""``memory-pipelines serve`` answers before the memory home has opened: ``/healthz`` is
503 ``starting`` meanwhile, other requests wait for the opening, and a home that cannot be
opened is a 503 ``degraded`` and an exit 1 naming the problem."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import httpx
import pytest
from reliability_helpers import free_port

from memory_pipelines.apps.http import create_app, serving_in_thread
from memory_pipelines.apps.http.serving import StartingApp

AGENT = "agent-1"


def test_healthz_is_starting_until_the_api_is_ready_and_requests_wait_for_it(svc):
    svc.configure_agent(AGENT)
    starting = StartingApp()
    answers: dict[str, httpx.Response] = {}
    with serving_in_thread(starting) as url:
        early = httpx.get(f"{url}/healthz", timeout=30)

        def inject() -> None:  # sent before the API exists: it waits, then is served
            answers["inject"] = httpx.post(
                f"{url}/v1/inject", json={"context": {"agent_id": AGENT}}, timeout=30
            )

        waiting = threading.Thread(target=inject)
        waiting.start()
        app = create_app(svc, write_queue=False)
        starting.ready(app)
        waiting.join(30)
        ready = httpx.get(f"{url}/healthz", timeout=30)
    assert early.status_code == 503
    assert early.json() == {
        "status": "starting",
        "notes_version": None,
        "examples_version": None,
        "counts": {},
        "reason": "the memory home is opening",
    }
    assert answers["inject"].status_code == 200, answers["inject"].text
    assert "message" in answers["inject"].json()
    assert ready.status_code == 200 and ready.json()["status"] == "ok"


def test_a_home_that_could_not_open_is_degraded_and_requests_are_refused_with_retry_after():
    starting = StartingApp(wait_s=30)
    starting.failed("memory home /x is not writable (Permission denied)")
    with serving_in_thread(starting) as url:
        health = httpx.get(f"{url}/healthz", timeout=30)
        write = httpx.post(f"{url}/v1/memory-writes", json={}, timeout=30)
    assert health.status_code == 503
    assert health.json()["status"] == "degraded"
    assert health.json()["reason"] == "memory home /x is not writable (Permission denied)"
    assert write.status_code == 503 and write.headers["retry-after"] == "1"
    assert write.json() == {"detail": "memory home /x is not writable (Permission denied)"}


def test_a_request_waits_for_the_opening_at_most_its_bound():
    starting = StartingApp(wait_s=0.05)
    with serving_in_thread(starting) as url:
        r = httpx.post(f"{url}/v1/inject", json={}, timeout=30)
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json() == {"detail": "the memory home is still opening after 0.05 seconds"}


@pytest.mark.slow  # a subprocess that imports the whole stack
def test_serve_exits_1_naming_a_home_that_cannot_open(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "memory.sqlite3").write_bytes(os.urandom(8192))
    proc = subprocess.run(
        [sys.executable, "-m", "memory_pipelines.apps.cli", "serve", "--home", str(home),
         "--port", str(free_port()), "--log-level", "warning"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "MEMORY_EMBEDDING_MODEL": "hash"},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "memory.sqlite3" in proc.stderr and "not a SQLite database" in proc.stderr
    assert "Traceback" not in proc.stderr
