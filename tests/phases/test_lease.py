"""One Memory Manager run at a time per home: two services on one home (as two processes
would be) run cycles together; one is held inside consolidation while the other starts.
Synchronisation is by events and the lease's hooks, never by sleeping."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import numpy as np
import pytest
from factories import RecordingJudge, direction, near

from memory_pipelines import MemoryService
from memory_pipelines.config import ManagerConfig
from memory_pipelines.inventory import dangling_lineage
from memory_pipelines.notes import Note
from memory_pipelines.phases import lease
from memory_pipelines.phases.lease import LEASE_HOOKS, ManagerBusyError, exclusive

WAIT = 60  # seconds a test waits for an event before failing (never reached when it passes)


def put(svc, text: str, vec: np.ndarray, **fields) -> Note:
    fields.setdefault("agent_id", "agent")
    fields.setdefault("user_id", "u1")
    fields.setdefault("is_auto_generated", True)
    return svc.save_notes([Note(note=text, **fields)], vectors=np.asarray([vec]))[0]


class HeldJudge(RecordingJudge):
    """Merges like RecordingJudge, but the first cluster waits until ``release`` is set
    (after setting ``inside``): its run stays inside consolidation, holding the lease."""

    def __init__(self):
        super().__init__()
        self.inside = threading.Event()
        self.release = threading.Event()

    def synthesize_cluster(self, notes, *, anchored):
        self.inside.set()
        assert self.release.wait(WAIT)
        return super().synthesize_cluster(notes, anchored=anchored)


@pytest.fixture
def second(svc, open_service) -> Iterator[MemoryService]:
    """A second service on the same home (its own SQL engine and table handles)."""
    with open_service() as other:
        yield other


@pytest.fixture
def hooks() -> Iterator[list]:
    seen: list = []
    LEASE_HOOKS.append(lambda *event: seen.append(event))
    yield seen
    LEASE_HOOKS.clear()


def _clusters(svc, clock, n: int = 3) -> list[list[Note]]:
    svc.configure_agent("agent")
    svc.add_user("u1")
    words = [("green", "tea", "kettle"), ("friday", "deploy", "pipeline"), ("bicycle", "saddle", "gears")]
    clusters = []
    for k in range(n):
        base = direction(100 + k)
        clusters.append(
            [
                put(svc, f"{words[k][i]} {words[k][(i + 1) % 3]}", near(base, 10 * k + i),
                    created_at=clock() - timedelta(days=3 - i))
                for i in range(3)
            ]
        )  # fmt: skip
    return clusters


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def target():
        try:
            out["report"] = fn()
        except BaseException as e:  # reported to the test below
            out["error"] = e

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def test_a_second_cycle_waits_for_the_first_and_finds_nothing_to_do(svc, second, clock, hooks):
    clusters = _clusters(svc, clock)
    held, other = HeldJudge(), RecordingJudge()
    svc.judge, second.judge = held, other
    first_thread, first = _in_thread(lambda: svc.manager.run_cycle(force_maintenance=True))
    assert held.inside.wait(WAIT), first  # the first run is inside consolidation, holding the lease
    waiting = threading.Event()
    LEASE_HOOKS.append(lambda event, name, owner: event == "waiting" and waiting.set())
    second_thread, later = _in_thread(lambda: second.manager.run_cycle(force_maintenance=True))
    assert waiting.wait(WAIT), later  # the second run started and waits for the lease
    assert other.clusters == []  # ... and has decided nothing yet
    held.release.set()
    first_thread.join(WAIT)
    second_thread.join(WAIT)
    assert "error" not in first and "error" not in later, (first, later)
    assert first["report"]["maintenance_consolidatedClusters"] == 3
    assert later["report"]["maintenance_consolidatedClusters"] == 0
    assert other.clusters == []  # the second run found every cluster already merged
    notes = svc.notes()
    merged = notes[notes["derived_from_note_ids"].map(lambda ids: ids is not None and len(ids) > 0)]
    assert len(merged) == 3  # one merged note per cluster, never two
    for cluster in clusters:
        for note in cluster:
            assert svc.get_note(note.id).status == "Revoked"
    assert dangling_lineage(svc.context).empty
    assert svc.sources.live_leases() == []
    events = [e for e, *_ in hooks]
    assert events.count("acquired") == 2 and events.count("released") == 2


def test_a_run_that_cannot_wait_changes_nothing_and_names_the_holder(svc, second, clock):
    clusters = _clusters(svc, clock, n=1)
    second.judge = RecordingJudge()
    second.manager_config = ManagerConfig(lease_wait_s=0)
    with exclusive(svc.context):
        with pytest.raises(ManagerBusyError, match="another Memory Manager run holds this home"):
            second.manager.run_cycle(force_maintenance=True)
        with pytest.raises(ManagerBusyError, match="pid"):
            second.manager.consolidate()
    assert second.judge.clusters == []
    assert {svc.get_note(n.id).status for n in clusters[0]} == {"Active"}
    assert second.manager.run_cycle(force_maintenance=True)["maintenance_consolidatedClusters"] == 1


def test_partitions_run_side_by_side_but_never_beside_the_whole_pool(svc, second):
    with exclusive(svc.context, "p1"):
        with exclusive(second.context, "p2", wait_s=0):  # disjoint partitions: both run
            pass
        with pytest.raises(ManagerBusyError, match="memory-manager:p1"):
            with exclusive(second.context, wait_s=0):
                pass
    with exclusive(svc.context):
        with pytest.raises(ManagerBusyError):
            with exclusive(second.context, "p2", wait_s=0):
                pass
    assert svc.sources.live_leases() == []


def test_a_crashed_holders_lease_expires_on_the_service_clock(svc, second, clock):
    dead = "host:1:dead"
    assert svc.sources.take_lease(lease.MANAGER_LEASE, dead, clock() + timedelta(seconds=60))
    with pytest.raises(ManagerBusyError):
        with exclusive(second.context, wait_s=0):
            pass
    clock.advance(seconds=61)
    with exclusive(second.context, wait_s=0) as owner:
        assert owner != dead
    assert not svc.sources.release_lease(lease.MANAGER_LEASE, dead)  # it was taken over


def test_the_lease_is_reentrant_within_a_thread_only(svc, second):
    with exclusive(svc.context) as owner:
        with exclusive(svc.context, "p1") as inner:  # a phase inside the cycle
            assert inner == owner
        thread, out = _in_thread(lambda: exclusive(svc.context, wait_s=0).__enter__())
        thread.join(WAIT)
        assert isinstance(out.get("error"), ManagerBusyError)


def _cleanups(svc, monkeypatch) -> list[bool]:
    """Run one background compaction of the note table now; what it was told about
    dropping old versions."""
    told: list[bool] = []
    table = svc.store.notes
    real = table.compact_small_fragments
    monkeypatch.setattr(table, "compact_small_fragments", lambda cleanup=True: told.append(cleanup) or real(cleanup))
    table._compactor._cleaned_at = float("-inf")  # a cleanup is due
    table._compactor._compact()
    return told


def test_background_compaction_drops_no_version_while_a_run_holds_the_home(svc, second, monkeypatch):
    svc.add_note("The user likes tea.", agent_id="agent")
    with exclusive(second.context):  # a Memory Manager run elsewhere (another process)
        assert _cleanups(svc, monkeypatch) == [False]
        assert [x["name"] for x in svc.sources.live_leases()] == [lease.MANAGER_LEASE]
    with exclusive(second.context, "p1"):  # ... or a partition's
        assert _cleanups(svc, monkeypatch) == [False]
    assert _cleanups(svc, monkeypatch) == [True]  # the home is free: it cleans, and lets go
    assert svc.sources.live_leases() == []
    with exclusive(svc.context):  # this thread's own run may clean what it wrote
        assert _cleanups(svc, monkeypatch) == [True]


def test_cycle_cli_waits_as_told_then_exits_75_naming_the_holder(svc, home, capsys, monkeypatch):
    from memory_pipelines.apps.cli import main

    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    from datetime import UTC, datetime

    svc.configure_agent("agent")
    until = datetime.now(UTC) + timedelta(hours=1)  # another process, on the real clock
    assert svc.sources.take_lease(lease.MANAGER_LEASE, "box:4242:run", until, {"host": "box", "pid": 4242})
    assert main(["cycle", "--home", str(home), "--force-maintenance", "--wait", "0"]) == 75
    err = capsys.readouterr().err
    assert "another Memory Manager run holds this home" in err and "box pid 4242" in err
    assert svc.sources.release_lease(lease.MANAGER_LEASE, "box:4242:run")
    assert main(["cycle", "--home", str(home), "--force-maintenance", "--wait", "0"]) == 0


def test_a_run_killed_on_this_machine_frees_the_home_at_once(svc, second, clock):
    import socket
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a Memory Manager process that died (kill -9) holding the lease
    here = socket.gethostname()
    until = clock() + timedelta(hours=1)
    assert svc.sources.take_lease(lease.MANAGER_LEASE, "dead", until, {"host": here, "pid": child.pid})
    with exclusive(second.context, wait_s=0) as owner:  # taken over, no wait for the expiry
        assert [x["owner"] for x in svc.sources.live_leases()] == [owner]
    alive = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert svc.sources.take_lease(lease.MANAGER_LEASE, "alive", until, {"host": here, "pid": alive.pid})
        with pytest.raises(ManagerBusyError), exclusive(second.context, wait_s=0):
            pass
        other = {"host": "another-box", "pid": child.pid}  # a dead pid elsewhere means nothing here
        assert svc.sources.take_over_lease(lease.MANAGER_LEASE, "alive", "remote", until, other)
        with pytest.raises(ManagerBusyError), exclusive(second.context, wait_s=0):
            pass
    finally:
        alive.communicate(b"")


def test_an_erase_or_purge_that_cannot_wait_changes_nothing(svc, second, clock):
    svc.configure_agent("agent")
    note = svc.add_note("The user drinks green tea every morning.", agent_id="agent", user_id="u1")
    svc.inject({"agent_id": "agent", "user_id": "u1", "run_id": "r1"}, "tea")
    second.manager_config = ManagerConfig(lease_wait_s=0)  # its own default wait: none
    with exclusive(svc.context):  # a Memory Manager run (another process's service)
        with pytest.raises(ManagerBusyError, match="another Memory Manager run holds this home"):
            second.erase_note(note.id)
        with pytest.raises(ManagerBusyError, match="changed nothing"):
            second.purge_user("u1")
        with pytest.raises(ManagerBusyError):
            second.erase_note(note.id, lease_wait_s=0)
    # the note, its history and its injection rows are all still there
    assert second.get_note(note.id).note == "The user drinks green tea every morning."
    assert [e.event for e in second.history(note.id)] == ["created"]
    assert [e["item_id"] for e in second.sources.injection_events_of("r1", "note")] == [note.id]
    assert svc.sources.live_leases() == []
    # the home free again, both run, each holding the lease from its first change
    acquired: list[str] = []
    LEASE_HOOKS.append(lambda event, name, owner: event == "acquired" and acquired.append(name))
    assert second.erase_note(note.id, lease_wait_s=0)["notes"] == 1
    assert second.purge_user("u1", lease_wait_s=0)["user_id"] == "u1"
    assert acquired == [lease.MANAGER_LEASE, lease.MANAGER_LEASE]
    LEASE_HOOKS.clear()
