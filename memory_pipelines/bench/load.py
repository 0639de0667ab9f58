"""Concurrent HTTP load: write and inject latency of a real ``serve`` under N clients.

``memory-pipelines bench load [--clients 8] [--seconds 60] [--repeats 1] [--notes 500]
[--embedder minilm|hash] [--modes group queue threads]``

For each repeat and mode, a fresh copy of one prefilled home (``--notes`` Active notes of
one agent over 4 users, added in one batch, then compacted) is served by a real
``memory-pipelines serve`` subprocess on loopback. ``--clients`` client threads each loop
for ``--seconds``: a new run of user ``u<k % 4>`` posts 2 new facts to
``/v1/memory-writes``, then ``/v1/inject`` with a question. Modes: ``group`` is the
server as shipped (one writer thread; each drained round of requests is one group commit,
buffered attribution); ``queue`` is the writer with ``MEMORY_WRITE_QUEUE=each`` (each
request of a round its own batch and commit); ``threads`` is the baseline with
``MEMORY_WRITE_QUEUE=off`` (writes run in the request threads, serialised per run;
since 2026-12-02 concurrent ``svc.write`` calls share rounds in the service itself,
:mod:`memory_pipelines.writes.combine`, so ``queue`` is the baseline without group
commit).

Reported per mode (medians over repeats): write and inject p50/p95 (ms, client-side,
HTTP included), write requests/s and notes written/s, and the check of no lost or
duplicated write after the server stopped: every note id the clients were told
``written`` is in the note table exactly once, the table holds nothing else new, the
ledger holds one ``written`` row per such note, and the ``injection_events`` rows equal
the notes the clients were shown (buffered attribution flushed at shutdown). Targets:
write p95 <= 500 ms, inject p95 <= 100 ms, nothing lost or duplicated.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import func, select
from tabulate import tabulate

from memory_pipelines.embeddings import HashEmbedder, MiniLMEmbedder, embedder_from_name
from memory_pipelines.notes import Note
from memory_pipelines.service import MemoryService
from memory_pipelines.sources import injection_events, write_ledger

AGENT = "load-agent"
USERS = 4
TOPICS = ("billing", "travel", "reports", "deployments", "meetings", "coffee", "hardware")


def _words(*key: object) -> str:
    digest = hashlib.sha256(repr(key).encode()).hexdigest()
    return " ".join(digest[j : j + 5] for j in range(0, 20, 5))


def _fact(*key: object) -> str:
    topic = TOPICS[int(hashlib.sha256(repr(key).encode()).hexdigest(), 16) % len(TOPICS)]
    return f"The user's {topic} detail is {_words(*key)}."


#: ``MEMORY_WRITE_QUEUE`` of each mode
MODES = {"group": "group", "queue": "each", "threads": "off"}


def _env(embedder: str, mode: str) -> dict[str, str]:
    env = dict(os.environ)
    env["MEMORY_EMBEDDING_MODEL"] = "hash:384" if embedder == "hash" else "default"
    env["MEMORY_WRITE_QUEUE"] = MODES[mode]
    env.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    env.pop("MEMORY_LLM_MODEL", None)
    return env


def prefill(home: Path, notes: int, embedder: str) -> None:
    """A home with the agent and ``notes`` Active notes over its users, compacted."""
    model = embedder_from_name("hash:384" if embedder == "hash" else "default", home / "embcache")
    with MemoryService.open(home, embedder=model) as svc:
        svc.configure_agent(AGENT, note_injection_strategy="Relevant", max_notes_to_inject=5)
        rows = [
            Note(note=_fact("prefill", k), type="Context", agent_id=AGENT, user_id=f"u{k % USERS}",
                 company_id="co", created_at=svc.now(), updated_at=svc.now())
            for k in range(notes)
        ]
        if rows:
            vecs = svc.embed([n.note for n in rows])
            svc.store.notes.add(rows, vecs)
        svc.store.optimize(cleanup_older_than=None)  # as the daily maintenance leaves it
    shutil.rmtree(home / "embcache", ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(home: Path, env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    import httpx

    for _ in range(5):
        port = _free_port()
        out = log.open("w")
        proc = subprocess.Popen(
            [sys.executable, "-m", "memory_pipelines.apps.cli", "serve", "--home", str(home),
             "--port", str(port), "--log-level", "warning"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        proc.kill()
        proc.wait()
        if "address already in use" not in log.read_text(errors="replace").lower():
            break
    raise RuntimeError(f"serve did not start:\n{log.read_text(errors='replace')[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _client(url: str, k: int, seconds: float, out: dict[str, Any], start: threading.Barrier) -> None:
    import httpx

    write_ms: list[float] = []
    inject_ms: list[float] = []
    written: list[str] = []
    shown = 0
    errors: list[str] = []
    i = 0
    with httpx.Client(base_url=url, timeout=120) as http:
        start.wait()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ctx = {"agent_id": AGENT, "run_id": f"load-{k}-{i}", "user_id": f"u{k % USERS}",
                   "company_id": "co"}
            writes = [{"note": _fact("load", k, i, j), "type": "Context", "scopeHint": "user"}
                      for j in range(2)]
            t0 = time.perf_counter()
            r = http.post("/v1/memory-writes", json={"context": ctx, "writes": writes})
            write_ms.append((time.perf_counter() - t0) * 1000)
            if r.status_code != 200:
                errors.append(f"write {r.status_code}: {r.text[:200]}")
            else:
                written += [x["note_id"] for x in r.json()["results"] if x["disposition"] == "written"]
            t0 = time.perf_counter()
            r = http.post("/v1/inject", json={"context": ctx,
                                               "current_input": f"what is the user's {TOPICS[i % len(TOPICS)]} detail?"})
            inject_ms.append((time.perf_counter() - t0) * 1000)
            if r.status_code != 200:
                errors.append(f"inject {r.status_code}: {r.text[:200]}")
            else:
                body = r.json()
                shown += len(body["notes"]) + len(body["examples"])
            i += 1
    out[k] = {"write_ms": write_ms, "inject_ms": inject_ms, "written": written, "shown": shown,
              "errors": errors}


def _check(home: Path, embedder: str, before: int, told: list[str], shown: int) -> dict[str, Any]:
    """Lost and duplicated writes, from the stopped server's home."""
    model = HashEmbedder(384) if embedder == "hash" else MiniLMEmbedder()
    with MemoryService.open(home, embedder=model) as svc:
        ids = list(svc.store.notes.scan(None, ["id"])["id"])
        with svc.sources.begin() as c:
            ledger = c.execute(
                select(func.count()).select_from(write_ledger).where(
                    write_ledger.c.disposition == "written", write_ledger.c.run_id.like("load-%")
                )
            ).scalar_one()
            events = c.execute(select(func.count()).select_from(injection_events)).scalar_one()
    stored = set(ids)
    return {
        "lost": len(set(told) - stored),
        "duplicated": (len(ids) - len(stored)) + (len(told) - len(set(told))),
        "unexpected": len(ids) - before - len(set(told)),
        "ledger_mismatch": int(ledger) - len(set(told)),
        "events_mismatch": int(events) - shown,
    }


def run_once(base: Path, work: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    home = work / f"home-{mode}"
    shutil.rmtree(home, ignore_errors=True)
    shutil.copytree(base, home)
    proc, url = _start(home, _env(args.embedder, mode), work / f"serve-{mode}.log")
    outs: dict[int, Any] = {}
    try:
        start = threading.Barrier(args.clients)
        threads = [
            threading.Thread(target=_client, args=(url, k, args.seconds, outs, start))
            for k in range(args.clients)
        ]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
    finally:
        _stop(proc)
    write_ms = [x for o in outs.values() for x in o["write_ms"]]
    inject_ms = [x for o in outs.values() for x in o["inject_ms"]]
    told = [x for o in outs.values() for x in o["written"]]
    errors = [e for o in outs.values() for e in o["errors"]]
    check = _check(home, args.embedder, args.notes, told, sum(o["shown"] for o in outs.values()))
    shutil.rmtree(home, ignore_errors=True)
    return {
        "write_p50": float(np.percentile(write_ms, 50)),
        "write_p95": float(np.percentile(write_ms, 95)),
        "inject_p50": float(np.percentile(inject_ms, 50)),
        "inject_p95": float(np.percentile(inject_ms, 95)),
        "requests_s": len(write_ms) / elapsed,
        "writes_s": len(told) / elapsed,
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
        **check,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: ``memory-pipelines bench load [options]``."""
    parser = argparse.ArgumentParser(
        prog="memory-pipelines bench load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=60.0, help="load time per mode and repeat")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--notes", type=int, default=500, help="prefilled Active notes")
    parser.add_argument("--embedder", choices=["minilm", "hash"], default="minilm")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.clients < 1 or args.seconds <= 0 or args.repeats < 1 or args.notes < 0:
        parser.error("--clients, --seconds and --repeats must be positive, --notes not negative")
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        work = Path(tmp)
        base = work / "base"
        prefill(base, args.notes, args.embedder)
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in args.modes}
        for _ in range(args.repeats):
            for mode in args.modes:  # interleaved, so both see the same machine load
                runs[mode].append(run_once(base, work, mode, args))
    keys = ["write_p50", "write_p95", "inject_p50", "inject_p95", "requests_s", "writes_s"]
    checks = ["errors", "lost", "duplicated", "unexpected", "ledger_mismatch", "events_mismatch"]
    rows = []
    med: dict[str, dict[str, float]] = {}
    for mode, results in runs.items():
        med[mode] = {k: statistics.median(r[k] for r in results) for k in keys}
        rows.append([mode, *(med[mode][k] for k in keys), *(max(r[c] for r in results) for c in checks)])
    print(
        f"bench load: {args.clients} clients x {args.seconds:g} s, {args.notes} prefilled notes, "
        f"embedder {args.embedder}, median of {args.repeats} (latency ms, client-side)"
    )
    print(tabulate(rows, headers=["mode", *keys, *checks], tablefmt="github", floatfmt=".1f"))
    for base in ("queue", "threads"):
        if "group" in med and base in med:
            g, b = med["group"], med[base]
            print(
                f"group vs {base}: write p95 {b['write_p95'] / g['write_p95']:.2f}x lower, "
                f"inject p95 {b['inject_p95'] / g['inject_p95']:.2f}x lower, "
                f"writes/s {g['writes_s'] / max(b['writes_s'], 1e-9):.2f}x"
            )
    for mode, results in runs.items():
        for r in results:
            if r["first_error"]:
                print(f"{mode}: first error: {r['first_error']}")
    bad = any(max(r[c] for r in rs) for rs in runs.values() for c in checks[1:5])
    if bad:
        print("LOST OR DUPLICATED WRITES (see the table)")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
