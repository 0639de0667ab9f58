"""Buffered attribution: ``injection_events`` rows wait in the process and are inserted in
batches (N events or T seconds), and before anything reads them (the event queries, the
fold, ``purge_user``) and at ``close``; the audit step waits with them (a reader of steps
and any other step flush first); a killed process loses at most the rows that were waiting."""

from __future__ import annotations

import subprocess
import time

from reliability_helpers import PYTHON, subprocess_env
from sqlalchemy import func, select

from memory_pipelines import MemoryService
from memory_pipelines.injection.attribution import buffer_attribution, flush_attribution
from memory_pipelines.sources import injection_events, run_steps

A = "agent-attr"


def _stored(svc: MemoryService, user_id: str | None = None) -> int:
    """``injection_events`` rows in the database (raw SQL: no flush)."""
    q = select(func.count()).select_from(injection_events)
    if user_id is not None:
        q = q.where(injection_events.c.user_id == user_id)
    with svc.sources.engine.connect() as c:
        return int(c.execute(q).scalar_one())


def _seed(svc: MemoryService, users=("u1",), notes: int = 2) -> None:
    svc.configure_agent(A, note_injection_strategy="All")
    for u in users:
        for k in range(notes):
            svc.add_note(f"{u} fact number {k}", agent_id=A, user_id=u)


def _stored_steps(svc: MemoryService, step_name: str = "Memory Injection") -> list[str]:
    """Run ids of the stored ``step_name`` steps in id order (raw SQL: no flush)."""
    q = select(run_steps.c.run_id).where(run_steps.c.step_name == step_name).order_by(run_steps.c.id)
    with svc.sources.engine.connect() as c:
        return list(c.execute(q).scalars())


def test_events_and_the_audit_step_wait_in_the_buffer(svc):
    """Behaviour change: the audit step used to be written at once; it now waits with the
    events (one row more in the buffer) and a reader of steps flushes first."""
    _seed(svc)
    buffer_attribution(svc.context, max_events=1000, max_seconds=3600)
    got = svc.inject({"agent_id": A, "run_id": "r1", "user_id": "u1"})
    assert len(got.notes) == 2
    assert _stored(svc) == 0 and _stored_steps(svc) == []
    assert svc.sources.pending_injection_events() == 3
    (step,) = svc.sources.steps("r1", "Memory Injection")  # a reader flushes first
    assert step["output_json"]["memoryAttribution"]["noteCount"] == 2
    assert _stored(svc) == 2 and svc.sources.pending_injection_events() == 0
    events = svc.sources.injection_events_of("r1")
    assert [(e["item_id"], e["rank"]) for e in events] == [(n.id, i) for i, n in enumerate(got.notes, 1)]


def test_a_later_audit_step_flushes_the_waiting_ones_first(svc):
    _seed(svc)
    buffer_attribution(svc.context, max_events=1000, max_seconds=3600)
    svc.inject({"agent_id": A, "run_id": "r1", "user_id": "u1"})
    svc.sources.add_step("r2", "Tool", "Something Else")
    svc.inject({"agent_id": A, "run_id": "r3", "user_id": "u1"})
    assert _stored_steps(svc) == ["r1"]  # r3 waits
    assert [s["run_id"] for s in svc.sources.steps()][-3:] == ["r1", "r2", "r3"]


def test_explain_sees_buffered_steps(svc):
    _seed(svc, notes=1)
    buffer_attribution(svc.context, max_events=1000, max_seconds=3600)
    ctx = {"agent_id": A, "run_id": "w1", "user_id": "u1"}
    svc.write(ctx, [{"note": "User keeps bees in the garden", "type": "Preference"}])
    svc.inject({"agent_id": A, "run_id": "r1", "user_id": "u1"})
    assert "r1" not in _stored_steps(svc)
    svc.explain({"agent_id": A, "user_id": "u1"}, "bees")
    assert _stored_steps(svc) == ["r1"] and svc.sources.pending_injection_events() == 0


def test_purge_after_inject_erases_buffered_steps(svc):
    _seed(svc, users=("u1", "u2"))
    buffer_attribution(svc.context, max_events=1000, max_seconds=3600)
    svc.inject({"agent_id": A, "run_id": "r1", "user_id": "u1"})
    svc.inject({"agent_id": A, "run_id": "r2", "user_id": "u2"})
    svc.purge_user("u1")
    flush_attribution(svc.context)  # nothing of u1 was left waiting to come back
    assert _stored_steps(svc) == ["r2"]


def test_batches_of_n_events_are_inserted_by_the_call_that_fills_them(svc):
    _seed(svc)
    buffer_attribution(svc.context, max_events=5, max_seconds=3600)
    ctx = {"agent_id": A, "user_id": "u1"}
    svc.inject(ctx)
    svc.inject(ctx)
    assert _stored(svc) == 0  # 4 waiting
    svc.inject(ctx)
    assert _stored(svc) == 6 and svc.sources.pending_injection_events() == 0


def test_the_timer_flushes_after_t_seconds(svc):
    _seed(svc)
    buffer_attribution(svc.context, max_events=1000, max_seconds=0.1)
    svc.inject({"agent_id": A, "user_id": "u1"})
    deadline = time.monotonic() + 10
    while _stored(svc) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _stored(svc) == 2


def test_fold_after_inject_counts_buffered_events(svc):
    _seed(svc)
    buffer_attribution(svc.context, max_events=1000, max_seconds=3600)
    got = svc.inject({"agent_id": A, "user_id": "u1"})
    report = svc.manager.fold_injection_events()
    assert report["eventsFolded"] == 2
    assert all(svc.get_note(n.id).access_count == 1 for n in got.notes)


def test_purge_after_inject_erases_buffered_events(svc):
    _seed(svc, users=("u1", "u2"))
    buffer_attribution(svc.context, max_events=1000, max_seconds=3600)
    svc.inject({"agent_id": A, "run_id": "r1", "user_id": "u1"})
    svc.inject({"agent_id": A, "run_id": "r2", "user_id": "u2"})
    counts = svc.purge_user("u1")
    assert counts["injection_events"] == 2
    flush_attribution(svc.context)  # nothing of u1 was left waiting to come back
    assert _stored(svc, "u1") == 0 and _stored(svc, "u2") == 2


def test_close_flushes(open_service):
    with open_service() as svc:
        _seed(svc)
        buffer_attribution(svc.context, max_events=1000, max_seconds=3600)
        svc.inject({"agent_id": A, "user_id": "u1"})
        assert _stored(svc) == 0
    with open_service() as svc:
        assert _stored(svc) == 2


def test_turning_buffering_off_flushes_and_writes_through(svc):
    _seed(svc)
    buffer_attribution(svc.context, max_events=1000, max_seconds=3600)
    svc.inject({"agent_id": A, "user_id": "u1"})
    buffer_attribution(svc.context, max_events=0)
    assert _stored(svc) == 2
    svc.inject({"agent_id": A, "user_id": "u1"})
    assert _stored(svc) == 4


KILLED = """
import os, signal, sys, time
from memory_pipelines import MemoryService
from memory_pipelines.injection.attribution import buffer_attribution
home, n, t, injects, wait = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
svc = MemoryService.from_env(home)
buffer_attribution(svc.context, max_events=n, max_seconds=t)
runs = len(sys.argv) > 6  # a run id per inject: one audit step each
for i in range(injects):
    svc.inject({"agent_id": "agent-attr", "user_id": "u1", **({"run_id": f"k{i}"} if runs else {})})
deadline = time.monotonic() + wait
while wait and svc.sources.pending_injection_events() and time.monotonic() < deadline:
    time.sleep(0.02)  # the timer, not this loop, flushes: nothing here calls a flush
if wait:
    with svc.sources._event_buffer().flushing:  # a timed flush in progress ends first
        pass
print(svc.sources.pending_injection_events(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_run(home, n: int, t: float, injects: int, wait: float, runs: bool = False) -> str:
    proc = subprocess.run(
        [PYTHON, "-c", KILLED, str(home), str(n), str(t), str(injects), str(wait)]
        + (["runs"] if runs else []),
        env=subprocess_env(), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == -9, proc.stderr[-3000:]
    return proc.stdout.strip()


def test_a_killed_process_loses_at_most_the_bound(home, open_service):
    with open_service(clock=None) as svc:
        _seed(svc)  # 2 events per inject
    n, injects = 7, 9  # 18 events: flushes at 8 and 16, 2 waiting at the kill
    waiting = _killed_run(home, n, 3600, injects, 0)
    with open_service(clock=None) as svc:
        stored = _stored(svc)
    assert 18 - stored == int(waiting) < n
    # with a short T nothing is lost once T has passed
    _killed_run(home, 1000, 0.2, 3, 60.0)
    with open_service(clock=None) as svc:
        assert _stored(svc) == stored + 6


def test_a_killed_process_loses_at_most_the_bound_of_events_and_steps(home, open_service):
    with open_service(clock=None) as svc:
        _seed(svc)  # 2 events and 1 step per inject
    n, injects = 7, 8  # 24 rows: flushes at 9 and 18, 6 waiting at the kill
    waiting = _killed_run(home, n, 3600, injects, 0, runs=True)
    with open_service(clock=None) as svc:
        stored = _stored(svc) + len(_stored_steps(svc))
        assert len(_stored_steps(svc)) == 6  # whole injections: k0..k5
    assert 24 - stored == int(waiting) == 6 < n
