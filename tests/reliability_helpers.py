"""Shared helpers of the reliability suites (purge, properties, isolation, faults, crash,
load): a real uvicorn server on loopback, a snapshot of the notes table, and the
environment of ``memory-pipelines`` subprocesses."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import uvicorn

ROOT = Path(__file__).resolve().parents[1]

#: columns whose change means "something stored changed"
SNAPSHOT_COLUMNS = [
    "id", "note", "type", "status", "agent_id", "user_id", "company_id", "access_count",
    "last_accessed_at", "updated_at", "comments", "consolidated_into_note_id",
]


@contextmanager
def running(app: Any) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free loopback port in a background thread."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def snapshot(svc: Any) -> list[tuple]:
    """The notes table as sorted tuples of ``SNAPSHOT_COLUMNS`` (for before/after checks)."""
    df = svc.store.notes.scan(None, SNAPSHOT_COLUMNS)
    rows = [tuple(str(v) for v in r) for r in df.itertuples(index=False)]
    return sorted(rows)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for a child ``python``: the hash embedder, offline litellm, this repo."""
    env = dict(os.environ)
    env.update(
        MEMORY_EMBEDDING_MODEL="hash",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        DAGSTER_DISABLE_TELEMETRY="1",
        PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update(extra)
    return env


PYTHON = sys.executable


def load_client(args: tuple[str, int, float, int]) -> dict[str, Any]:
    """One load-test client process: write then inject in a loop until ``seconds`` pass.

    Each iteration is a new run of user ``u<k % 4>``; every fifth run sends more writes
    than the per-run cap. Returns latencies (ms), status codes, the written note ids and,
    per run, how many writes came back ``written``.
    """
    import httpx

    url, client_no, seconds, cap = args
    write_ms: list[float] = []
    inject_ms: list[float] = []
    statuses: dict[int, int] = {}
    written: list[str] = []
    per_run: dict[str, int] = {}
    errors: list[str] = []
    deadline = time.monotonic() + seconds
    i = 0
    with httpx.Client(base_url=url, timeout=60) as http:
        while time.monotonic() < deadline:
            run_id = f"load-{client_no}-{i}"
            ctx = {"agent_id": "load-agent", "run_id": run_id, "user_id": f"u{client_no % 4}",
                   "company_id": "co"}
            n = cap + 2 if i % 5 == 4 else 2
            writes = [
                {"note": f"Client {client_no} run {i} fact {j} about topic {(i + j) % 7}",
                 "type": "Preference" if j % 2 else "Context"}
                for j in range(n)
            ]
            t0 = time.perf_counter()
            try:
                r = http.post("/v1/memory-writes", json={"context": ctx, "writes": writes})
            except httpx.HTTPError as e:
                errors.append(f"write {run_id} after {time.perf_counter() - t0:.1f}s: {e!r}")
                break
            write_ms.append((time.perf_counter() - t0) * 1000)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code == 200:
                results = r.json()["results"]
                ids = [x["note_id"] for x in results if x["disposition"] == "written"]
                written.extend(ids)
                per_run[run_id] = len(ids)
            t0 = time.perf_counter()
            try:
                r = http.post("/v1/inject", json={"context": ctx, "current_input": f"topic {i % 7}"})
            except httpx.HTTPError as e:
                errors.append(f"inject {run_id} after {time.perf_counter() - t0:.1f}s: {e!r}")
                break
            inject_ms.append((time.perf_counter() - t0) * 1000)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            i += 1
    return {"write_ms": write_ms, "inject_ms": inject_ms, "statuses": statuses,
            "written": written, "per_run": per_run, "errors": errors}
