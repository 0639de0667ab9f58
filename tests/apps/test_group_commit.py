"""Group commit: concurrent ``/v1/memory-writes`` requests go through one writer that runs
them back to back; each request gets exactly its own results or error; nothing is lost or
written twice, in one process or across two processes writing one home."""

from __future__ import annotations

import hashlib
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from reliability_helpers import run_scripts_at_once, running
from sqlalchemy import func, select

from memory_pipelines.apps.http import WriteQueue, create_app
from memory_pipelines.errors import MemoryPipelineError, UnknownAgentError
from memory_pipelines.sources import write_ledger

AGENT = "agent-gc"
CLIENTS = 8
REQUESTS = 4


def _ctx(client: int, i: int, agent: str = AGENT) -> dict:
    return {"agent_id": agent, "run_id": f"run-{client}-{i}", "user_id": f"u{client % 3}"}


def _text(*key: object) -> str:
    """A sentence of words no other test sentence shares (no near-duplicates)."""
    digest = hashlib.sha256(repr(key).encode()).hexdigest()
    return "Remember " + " ".join(digest[j : j + 6] for j in range(0, 36, 6))


def _writes(client: int, i: int) -> list[dict]:
    return [
        {"note": _text(client, i, k), "type": "Context", "scopeHint": "user"} for k in range(2)
    ]


def _post_all(url: str, jobs: list[tuple[dict, list]]) -> list[httpx.Response]:
    barrier = threading.Barrier(min(len(jobs), CLIENTS))

    def post(job: tuple[dict, list]) -> httpx.Response:
        ctx, writes = job
        with httpx.Client(base_url=url, timeout=120) as http:
            try:
                barrier.wait(timeout=30)
            except threading.BrokenBarrierError:
                pass
            return http.post("/v1/memory-writes", json={"context": ctx, "writes": writes})

    with ThreadPoolExecutor(CLIENTS) as pool:
        return list(pool.map(post, jobs))


def test_concurrent_requests_each_get_their_own_results_and_nothing_is_lost(svc):
    svc.configure_agent(AGENT)
    app = create_app(svc)
    jobs = [(_ctx(c, i), _writes(c, i)) for c in range(CLIENTS) for i in range(REQUESTS)]
    with running(app) as url:
        answers = _post_all(url, jobs)
    assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
    note_ids = []
    for (ctx, writes), r in zip(jobs, answers, strict=True):
        results = r.json()["results"]
        assert [x["request"] for x in results] == writes  # its own results, in order
        assert [x["disposition"] for x in results] == ["written", "written"]
        assert all(x["final_scope"]["user_id"] == ctx["user_id"] for x in results)
        note_ids += [x["note_id"] for x in results]
    assert len(note_ids) == len(set(note_ids)) == 2 * len(jobs)
    stored = svc.notes()
    assert sorted(stored["id"]) == sorted(note_ids)  # none lost, none twice
    assert sorted(stored["note"]) == sorted(w["note"] for _, ws in jobs for w in ws)
    stats = app.state.write_queue.stats
    assert stats["requests"] == len(jobs) and 1 <= stats["rounds"] <= len(jobs)


def test_one_requests_error_is_its_own(svc):
    svc.configure_agent(AGENT)
    jobs = [(_ctx(c, 0, AGENT if c % 2 else "nobody"), _writes(c, 0)) for c in range(CLIENTS)]
    with running(create_app(svc)) as url:
        answers = _post_all(url, jobs)
    for (ctx, _), r in zip(jobs, answers, strict=True):
        if ctx["agent_id"] == "nobody":
            assert r.status_code == 404, r.text
        else:
            assert r.status_code == 200 and r.json()["results"][0]["disposition"] == "written"
    assert len(svc.notes()) == 2 * (CLIENTS // 2)


def test_concurrent_requests_of_one_run_hold_its_cap(svc):
    svc.configure_agent(AGENT)
    ctx = {"agent_id": AGENT, "run_id": "shared-run", "user_id": "u1"}
    jobs = [(ctx, _writes(c, 0)) for c in range(CLIENTS)]  # 16 new facts, cap 5
    with running(create_app(svc)) as url:
        answers = _post_all(url, jobs)
    dispositions = [x["disposition"] for r in answers for x in r.json()["results"]]
    assert dispositions.count("written") == 5
    assert dispositions.count("skipped-cap") == 2 * CLIENTS - 5
    assert len(svc.notes()) == 5


def test_the_baseline_switch_writes_in_the_handler_threads(svc):
    svc.configure_agent(AGENT)
    app = create_app(svc, write_queue=False)
    assert app.state.write_queue is None
    jobs = [(_ctx(c, 0), _writes(c, 0)) for c in range(4)]
    with running(app) as url:
        answers = _post_all(url, jobs)
    assert all(r.status_code == 200 for r in answers)
    assert len(svc.notes()) == 8


def test_queue_runs_in_arrival_order_drains_on_close_and_refuses_after(svc):
    svc.configure_agent(AGENT)
    writer = WriteQueue(svc, idle_seconds=0.2)
    first = writer.submit(_ctx(0, 0), _writes(0, 0))
    assert [r.disposition for r in first] == ["written", "written"]
    with pytest.raises(UnknownAgentError):
        writer.submit(_ctx(0, 1, "nobody"), _writes(0, 1))
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(writer.submit, _ctx(c, 2), _writes(c, 2)) for c in range(4)]
        writer_results = [f.result(timeout=120) for f in futures]
    assert all(r.disposition == "written" for rs in writer_results for r in rs)
    writer.close()
    with pytest.raises(MemoryPipelineError):
        writer.submit(_ctx(0, 3), _writes(0, 3))
    assert len(svc.notes()) == 10


def test_idle_writer_thread_stops_and_restarts(svc):
    svc.configure_agent(AGENT)
    writer = WriteQueue(svc, idle_seconds=0.05)
    writer.submit(_ctx(0, 0), _writes(0, 0))
    thread = writer._thread
    if thread is not None:
        thread.join(timeout=10)
    assert writer._thread is None
    writer.submit(_ctx(0, 1), _writes(0, 1))  # started again
    writer.close()
    assert len(svc.notes()) == 4


WRITER = """
import hashlib, json, sys
from memory_pipelines import MemoryService
home, proc, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = []
with MemoryService.from_env(home) as svc:
    for i in range(runs):
        ctx = {"agent_id": "agent-gc", "run_id": f"p{proc}-run{i}", "user_id": f"u{i % 3}"}
        texts = [hashlib.sha256(f"{proc}/{i}/{k}".encode()).hexdigest() for k in range(3)]
        writes = [{"note": "Remember " + " ".join(t[j:j + 6] for j in range(0, 36, 6)),
                   "type": "Context", "scopeHint": "user"} for t in texts]
        out += [[r.disposition, r.note_id] for r in svc.write(ctx, writes)]
print(json.dumps(out))
"""


def test_two_processes_writing_one_home_lose_and_duplicate_nothing(tmp_path, open_service):
    home = tmp_path / "home"
    with open_service(home, clock=None) as svc:
        svc.configure_agent(AGENT)
    runs = 12
    done = run_scripts_at_once(WRITER, [[str(home), str(p), str(runs)] for p in range(2)], 600)
    outs = [row for out in done for row in json.loads(out.strip().splitlines()[-1])]
    assert [d for d, _ in outs] == ["written"] * (2 * runs * 3)
    told = [note_id for _, note_id in outs]
    assert len(told) == len(set(told))
    with open_service(home, clock=None) as svc:
        stored = svc.notes()
        assert sorted(stored["id"]) == sorted(told)  # every acknowledged write, exactly once
        with svc.sources.begin() as c:
            ledger = c.execute(select(func.count()).select_from(write_ledger)).scalar_one()
            keys = c.execute(
                select(write_ledger.c.run_id, write_ledger.c.key, func.count())
                .group_by(write_ledger.c.run_id, write_ledger.c.key)
                .having(func.count() > 1)
            ).all()
    assert keys == [] and ledger >= len(told)


def test_a_round_of_queued_requests_is_one_group_commit(svc, monkeypatch):
    svc.configure_agent(AGENT)
    writer = WriteQueue(svc, group=True, max_round=3)
    gate, entered, rounds = threading.Event(), threading.Event(), []
    real = svc.write_group

    def write_group(calls):
        rounds.append(len(calls))
        entered.set()
        gate.wait(timeout=60)  # hold the first round until the others are queued
        return real(calls)

    monkeypatch.setattr(svc, "write_group", write_group)
    jobs = [(_ctx(c, 0), _writes(c, 0)) for c in range(5)] + [(_ctx(9, 0, "nobody"), _writes(9, 0))]
    with ThreadPoolExecutor(len(jobs)) as pool:
        first = pool.submit(writer.submit, *jobs[0])
        assert entered.wait(timeout=60)
        rest = [pool.submit(writer.submit, *job) for job in jobs[1:]]
        while writer._queue.qsize() < len(rest):  # every request queued behind the first
            threading.Event().wait(0.01)
        gate.set()
        answers = [first.result(timeout=120)] + [f.result(timeout=120) for f in rest[:-1]]
        with pytest.raises(UnknownAgentError):
            rest[-1].result(timeout=120)
    writer.close()
    assert rounds == [1, 3, 2]  # drained up to max_round requests per group commit
    for (_, writes), results in zip(jobs, answers, strict=False):
        assert [r.request for r in results] == writes and all(r.disposition == "written" for r in results)
    assert len(svc.notes()) == 10


def test_the_writer_warms_the_scopes_it_wrote_for_the_next_injection(svc):
    from memory_pipelines.injection.cache import read_cache
    from memory_pipelines.injection.read_filters import RunScope, scope_cells
    from memory_pipelines.notes import RunContext

    svc.configure_agent(AGENT, note_injection_strategy="Relevant", max_notes_to_inject=5)
    writer = WriteQueue(svc, group=True)
    ctx = _ctx(0, 0)
    writer.submit(ctx, _writes(0, 0))
    cache = read_cache(svc.store.notes)
    svc.inject(ctx, "what should I remember?")  # injection caches the scope: it fits
    writer.submit(ctx, _writes(0, 1))  # a new table version
    scans = cache.scans
    shown = svc.inject(ctx, "what should I remember?")
    assert cache.scans == scans  # served from the entry the writer read at the new version
    assert {n.id for n in shown.notes} == set(svc.notes()["id"])
    other = _ctx(1, 0)  # a scope no injection has cached is not read by the writer
    writer.submit(other, _writes(1, 0))
    scope = RunScope.of(RunContext.model_validate(other), svc.get_agent(AGENT))
    assert not cache.holds(scope_cells(scope)[0])  # (only its near-duplicate scope)
    writer.close()
