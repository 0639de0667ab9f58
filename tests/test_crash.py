"""Crash safety: a subprocess is killed with SIGKILL in the middle of a write batch and in
the middle of every Memory Manager phase (at the k-th LanceDB write or SQL state/audit
write), then the home is reopened and the work rerun: no note is lost, no lineage points
at a missing note, no consolidation is left half-applied, and the rerun completes.

The child monkeypatches ``RowTable``/``Sources`` methods in its own process to call
``os.kill(os.getpid(), SIGKILL)``; production code has no crash hook."""

from __future__ import annotations

import subprocess
import textwrap
from datetime import datetime, timedelta

import pytest
from reliability_helpers import PYTHON, assert_nothing_lost_or_half_applied, subprocess_env

from memory_pipelines import MemoryService, RunContext
from memory_pipelines.clock import FakeClock
from memory_pipelines.embeddings import HashEmbedder

pytestmark = pytest.mark.slow

CHILD = textwrap.dedent(
    """
    import os, signal, sys, json
    from datetime import datetime, timedelta
    from memory_pipelines import MemoryService, RunContext
    from memory_pipelines.store import RowTable
    from memory_pipelines.sources import Sources

    home, action, target, nth, when, now = sys.argv[1:7]
    nth = int(nth)
    calls = {"n": 0}
    TARGETS = {
        "store": [(RowTable, "upsert"), (RowTable, "put"), (RowTable, "add"), (RowTable, "delete")],
        "sql": [(Sources, "set_state"), (Sources, "add_step"), (Sources, "ledger_claim"),
                (Sources, "add_step_batch")],
    }

    def arm(cls, name):
        real = getattr(cls, name)

        def wrapped(self, *a, **k):
            calls["n"] += 1
            hit = calls["n"] == nth
            if hit and when == "before":
                os.kill(os.getpid(), signal.SIGKILL)
            out = real(self, *a, **k)
            if hit:
                os.kill(os.getpid(), signal.SIGKILL)
            return out

        setattr(cls, name, wrapped)

    clock = lambda: datetime.fromisoformat(now)
    svc = MemoryService.from_env(home, clock=clock)
    for cls, name in TARGETS[target]:
        arm(cls, name)
    if action == "writes":
        batch = json.loads(os.environ["CRASH_BATCH"])
        svc.write(RunContext(agent_id="a", run_id="r-batch", user_id="u"), batch)
    else:
        getattr(svc.manager, action)()
    svc.close()
    """
)

BATCH = [
    {"note": "User prefers oolong tea", "type": "Preference"},
    {"note": "User works from Lisbon", "type": "Context"},
    {"note": "User prefers oolong tea", "type": "Preference"},
    {"note": "User reads reports on Mondays", "type": "Preference"},
    {"note": "User reads reports on Mondays and Fridays", "type": "Preference"},
    {"note": "User likes dark mode", "type": "Preference"},
]
#: (what is wrapped, which call, before or after it runs)
CRASH_POINTS = [("store", 1, "after"), ("store", 2, "before"), ("sql", 1, "after"),
                ("sql", 2, "after")]
PHASES = ["extract", "harden", "score_importance", "consolidate", "resolve_contradictions",
          "prune_stale", "expire_and_decay"]


def _open(home, clock) -> MemoryService:
    return MemoryService.open(home, embedder=HashEmbedder(), clock=clock)


def _seed(svc: MemoryService, clock: FakeClock) -> None:
    svc.configure_agent("a")
    svc.add_user("u")
    svc.add_user("gone")
    old = clock()
    for i, text in enumerate(["User prefers tea", "User prefers tea.", "User prefers tea!",
                              "User prefers tea in the morning"]):
        svc.add_note(text, agent_id="a", user_id="u", author_type="Agent", is_auto_generated=True,
                     created_at=old, access_count=i)
    svc.add_note("User never prefers tea in the morning", agent_id="a", user_id="u",
                 author_type="Agent", is_auto_generated=True, created_at=old + timedelta(days=9))
    svc.add_note("Stale user fact", agent_id="a", user_id="gone", author_type="Agent",
                 is_auto_generated=True)
    svc.add_note("Expiring fact", agent_id="a", user_id="u", author_type="Agent",
                 is_auto_generated=True, expires_at=old)
    svc.write(RunContext(agent_id="a", run_id="r0", user_id="u"),
              [{"note": "User prefers tea", "type": "Preference"},
               {"note": "User lives in Porto", "type": "Context"}])
    svc.add_conversation("c1", "a", user_id="u")
    svc.add_message("c1", "m1", "user", "I prefer metric units in every answer.")
    svc.add_message("c1", "m2", "user", "I work from Berlin now.")
    svc.delete_user("gone")
    clock.advance(days=10)


def _run_child(home, action, target, nth, when, now, batch=None) -> int:
    import json

    env = subprocess_env(CRASH_BATCH=json.dumps(batch or []))
    proc = subprocess.run([PYTHON, "-c", CHILD, str(home), action, target, str(nth), when, now],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, -9), proc.stderr[-3000:]
    return proc.returncode


@pytest.mark.parametrize("target", ["store", "sql"])
def test_kill_during_write_batch(tmp_path, target):
    """The batched path makes one note commit and one ledger claim (then one audit
    transaction) for this batch; the per-write fallback makes one of each per write. Every
    point reached is a crash; points past the batch's last write are not reached."""
    crashed = []
    for nth, when in ((1, "before"), (1, "after"), (2, "after"), (4, "after")):
        home, clock = tmp_path / f"{target}-{nth}-{when}", FakeClock()
        with _open(home, clock) as svc:
            svc.configure_agent("a")
        rc = _run_child(home, "writes", target, nth, when, clock().isoformat(), BATCH)
        if rc == 0:
            continue  # the batch committed before that write: nothing to recover
        crashed.append((nth, when))
        with _open(home, clock) as svc:
            assert_nothing_lost_or_half_applied(svc, set())
            results = svc.write(RunContext(agent_id="a", run_id="r-batch", user_id="u"), BATCH)
            assert all(r.disposition != "error" for r in results), results
            texts = list(svc.notes()["note"])
            for req in BATCH:  # each fact stored exactly once
                assert texts.count(req["note"]) == 1, (nth, texts)
            for row in svc.sources.ledger_rows("r-batch"):
                assert svc.get_note(row["note_id"]) is not None, row
    assert crashed[:2] == [(1, "before"), (1, "after")], crashed


@pytest.mark.parametrize("phase", PHASES)
def test_kill_during_each_maintenance_phase(tmp_path, phase):
    crashed = 0
    for target, nth, when in CRASH_POINTS:
        home, clock = tmp_path / f"{target}-{nth}-{when}", FakeClock()
        with _open(home, clock) as svc:
            _seed(svc, clock)
            before_ids = set(svc.notes()["id"])
        now = clock().isoformat()
        rc = _run_child(home, phase, target, nth, when, now)
        crashed += rc == -9
        if rc == 0:
            continue  # the phase finished before that write: nothing to recover
        clock.current = datetime.fromisoformat(now)
        with _open(home, clock) as svc:
            getattr(svc.manager, phase)()  # the rerun completes
            assert_nothing_lost_or_half_applied(svc, before_ids)
            getattr(svc.manager, phase)()  # and is idempotent enough to run again
            assert_nothing_lost_or_half_applied(svc, before_ids)
    assert crashed > 0, f"{phase}: no crash point was reached"
