"""Group commit inside one process (``svc.write`` from many threads,
:mod:`memory_pipelines.writes.combine`): calls that arrive while a round runs share the
next round; each caller gets its own results or error, as one after another; a caller
alone runs on its own thread as before; a write made inside a round does not wait for it.

No test here depends on timing: a round is held open by a gate until the other callers
are seen waiting, so the rounds are the same on every run."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from memory_pipelines import MemoryService
from memory_pipelines.clock import FakeClock
from memory_pipelines.config import WriteConfig
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.errors import UnknownAgentError, ValidationError
from memory_pipelines.writes.combine import GroupWriter

AGENT = "agent-1"
WAIT = 60.0  # seconds a test waits for another thread before it fails


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


class _Held:
    """``run_one``/``run_group`` fakes: the first call blocks until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.rounds: list[list] = []

    def one(self, ctx, writes):
        self.rounds.append([ctx])
        if len(self.rounds) == 1:
            self.entered.set()
            assert self.release.wait(WAIT)
        if ctx == "bad":
            raise ValueError("bad call")
        return f"{ctx}:{len(writes)}"

    def group(self, calls):
        self.rounds.append([ctx for ctx, _ in calls])
        return [ValueError("bad call") if c == "bad" else f"{c}:{len(w)}" for c, w in calls]


def _start_behind_a_held_round(writer: GroupWriter, held: _Held, names: list[str], pool):
    """Start a first call that holds its round, then ``names`` in this order, each seen
    waiting before the next starts; return the futures (the first one's first)."""
    first = pool.submit(writer.write, "first", [1])
    assert held.entered.wait(WAIT)
    futures = [first]
    for k, name in enumerate(names, start=1):
        futures.append(pool.submit(writer.write, name, [1] * k))
        _until(lambda k=k: len(writer._queue) == k, f"{k} waiting callers")
    return futures


def test_callers_that_arrive_during_a_round_share_the_next_one():
    held = _Held()
    writer = GroupWriter(held.one, held.group)
    with ThreadPoolExecutor(5) as pool:
        futures = _start_behind_a_held_round(writer, held, ["a", "b", "bad", "c"], pool)
        held.release.set()
        assert futures[0].result(WAIT) == "first:1"
        assert [f.result(WAIT) for f in (futures[1], futures[2], futures[4])] == [
            "a:1",
            "b:2",
            "c:4",
        ]
        with pytest.raises(ValueError, match="bad call"):  # its own error, nobody else's
            futures[3].result(WAIT)
    assert held.rounds == [["first"], ["a", "b", "bad", "c"]]  # in arrival order
    assert writer.stats == {"calls": 5, "rounds": 2, "largest_round": 4}


def test_a_caller_alone_runs_on_its_own_thread():
    seen = []
    writer = GroupWriter(lambda ctx, w: seen.append(threading.get_ident()) or ctx, lambda c: [])
    assert [writer.write(k, []) for k in range(3)] == [0, 1, 2]
    assert seen == [threading.get_ident()] * 3
    with pytest.raises(ValueError):
        GroupWriter(lambda ctx, w: (_ for _ in ()).throw(ValueError("x")), list).write(1, [])


def test_a_failed_round_fails_its_callers_and_the_next_round_runs():
    held = _Held()
    broken = {"on": True}

    def group(calls):
        if broken["on"]:
            broken["on"] = False
            raise RuntimeError("the store went away")
        return held.group(calls)

    writer = GroupWriter(held.one, group, max_round=2)
    with ThreadPoolExecutor(5) as pool:
        futures = _start_behind_a_held_round(writer, held, ["a", "b", "c", "d"], pool)
        held.release.set()
        assert futures[0].result(WAIT) == "first:1"
        for f in futures[1:3]:
            with pytest.raises(RuntimeError, match="went away"):
                f.result(WAIT)
        assert [f.result(WAIT) for f in futures[3:]] == ["c:3", "d:4"]
    assert writer.stats["largest_round"] == 2


def test_a_write_made_inside_a_round_runs_at_once():
    writer: GroupWriter

    def one(ctx, writes):
        if ctx == "outer":
            return ["outer", writer.write("inner", writes)]
        return ctx

    writer = GroupWriter(one, lambda calls: [])
    assert writer.write("outer", []) == ["outer", "inner"]


# ------------------------------------------------------------------------ the service


def _svc(path, **config):
    svc = MemoryService.open(
        path, embedder=HashEmbedder(dim=64), clock=FakeClock(), write_config=WriteConfig(**config)
    )
    svc.configure_agent(AGENT)
    return svc


def _ctx(run: str, user: str | None = "u1", agent: str = AGENT) -> dict:
    return {"agent_id": agent, "run_id": run, "user_id": user, "company_id": "c1"}


CALLS = [
    (_ctx("run-a", "u1"), [{"note": "User likes tea."}, {"note": "User likes tea."}]),
    (_ctx("run-b", "u2"), [{"note": "User sails on Sundays."}]),
    (_ctx("run-x", agent="nobody"), [{"note": "User likes plums."}]),
    (_ctx("run-a", "u1"), [{"note": "User likes tea."}, {"note": "User works in Lisbon."}]),
    ({"agent_id": AGENT, "user_id": "u3"}, [{"note": "User has no run."}]),
    (_ctx("run-c", "u3"), "User likes plums."),
    (_ctx("run-d", "u4"), [{"note": "User likes tea."}]),
]


def _notes(svc):
    frame = svc.notes()
    return sorted(zip(frame["note"], frame["user_id"], frame["status"], strict=True))


def _outcome(call):
    try:
        return [(r.disposition, r.reason, r.final_scope) for r in call()]
    except Exception as e:
        return (type(e).__name__, str(e))


def _held_service_writes(svc, calls, pool):
    """Run ``calls`` from threads, all but the first in one round behind it."""
    gate, entered = threading.Event(), threading.Event()
    real = svc.notebook.save_notes

    def save_notes(*args, **kwargs):  # the first round's commit waits for the others
        if not entered.is_set():
            entered.set()
            assert gate.wait(WAIT)
        return real(*args, **kwargs)

    svc.notebook.save_notes = save_notes
    futures = [pool.submit(_outcome, lambda: svc.write(*calls[0]))]
    assert entered.wait(WAIT)
    for k, call in enumerate(calls[1:], start=1):
        futures.append(pool.submit(_outcome, lambda call=call: svc.write(*call)))
        _until(lambda k=k: len(svc._writer._queue) == k, f"{k} waiting writers")
    gate.set()
    return [f.result(WAIT) for f in futures]


def test_concurrent_service_writes_give_what_one_after_another_gives(tmp_path):
    with _svc(tmp_path / "seq") as svc:
        seq = [_outcome(lambda c=c: svc.write(*c)) for c in CALLS]
        seq_notes = _notes(svc)
        seq_steps = len(svc.sources.steps(None, "Memory Write"))
    with _svc(tmp_path / "at-once") as svc, ThreadPoolExecutor(len(CALLS)) as pool:
        outs = _held_service_writes(svc, CALLS, pool)
        assert svc._writer.stats == {"calls": 7, "rounds": 2, "largest_round": 6}
        notes = _notes(svc)
        steps = len(svc.sources.steps(None, "Memory Write"))
    assert outs == seq
    assert notes == seq_notes and steps == seq_steps
    assert [o[0] for o in outs if isinstance(o, tuple)] == [
        UnknownAgentError.__name__,
        ValidationError.__name__,  # no run id
        ValidationError.__name__,  # writes that are not a list
    ]
    assert [d for d, *_ in outs[3]] == ["skipped-duplicate", "written"]  # saw run-a's round


def test_group_commit_off_runs_each_call_on_its_own(tmp_path):
    with _svc(tmp_path / "h", group_commit=False) as svc:
        with ThreadPoolExecutor(4) as pool:
            outs = list(
                pool.map(
                    lambda k: svc.write(_ctx(f"run-{k}", f"u{k}"), [{"note": f"User {k} rows."}]),
                    range(4),
                )
            )
        assert [o[0].disposition for o in outs] == ["written"] * 4
        assert svc._writer.stats["calls"] == 0


def test_a_call_whose_writes_are_no_list_fails_alone_in_a_round(tmp_path):
    """An array of writes (no truth value) is that call's ValidationError, as alone."""
    np = pytest.importorskip("numpy")
    calls = [
        (_ctx("run-1", "u1"), [{"note": "User likes figs."}]),
        (_ctx("run-2", "u2"), np.array(["User likes dates.", "User likes limes."])),
        (_ctx("run-3", "u3"), [{"note": "User likes plums."}]),
    ]
    with _svc(tmp_path / "h") as svc:
        outs = svc.write_group(calls)
        assert [o[0].disposition for o in (outs[0], outs[2])] == ["written", "written"]
        assert isinstance(outs[1], ValidationError)
