"""Single writes between maintenance runs, over real LanceDB: ``put`` appends new ids and
merges stored ones, the background compactor keeps the fragment count bounded without
losing, duplicating, hiding or resurrecting a row, in this process and as another
process (``read_consistency_interval=0``) sees it; ``svc.compact`` and ``bench trickle``."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from reliability_helpers import run_scripts_at_once

from memory_pipelines.bench import trickle
from memory_pipelines.config import INDEXED_NOTE_COLUMNS, TableTuning
from memory_pipelines.notes import Note, NoteStatus
from memory_pipelines.store import NoteStore, and_, eq, injectable

DIM = 8
ROOT = Path(__file__).resolve().parents[2]


def unit(i: int) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i % DIM] = 1.0
    v[(i + 1) % DIM] = 0.01 * (i + 1)
    return v / np.linalg.norm(v)


def test_put_appends_new_ids_and_merges_stored_ones(tmp_path):
    store = NoteStore(str(tmp_path / "lance"), DIM, compact_every=0)
    t = store.notes
    t.put([Note(id="a", note="first"), Note(id="b", note="second")], np.stack([unit(0), unit(1)]))
    assert t.existing_ids(["a", "b", "zz"]) == {"a", "b"}
    v = t.version
    t.put([Note(id="a", note="first, edited")], unit(2)[None, :])  # a stored id: merged
    t.put([Note(id="c", note="third")], unit(3)[None, :])  # a new id: appended
    assert t.version == v + 2
    assert t.count() == 3 and t.count(eq("id", "a")) == 1
    assert t.get("a").note == "first, edited"
    np.testing.assert_allclose(t.vectors(["a"])["a"], unit(2), rtol=1e-6)
    # a batch mixing stored and new ids is one merge
    t.put(
        [Note(id="c", note="third, edited"), Note(id="d", note="fourth")],
        np.stack([unit(4), unit(5)]),
    )
    assert t.version == v + 3
    assert sorted(n.id for n in t.all()) == ["a", "b", "c", "d"]


def test_a_compaction_that_meets_a_concurrent_commit_is_tried_again_at_once(tmp_path):
    """Lance rejects a rewrite when an update commits while it runs; the compactor tries
    again at once (not 32 writes later), and a lasting failure is still logged as one."""
    from memory_pipelines.errors import StoreError

    store = NoteStore(str(tmp_path / "lance"), DIM, compact_every=0)
    t = store.notes
    t.put([Note(id="a", note="first")], unit(0)[None, :])
    real = t.compact_small_fragments
    errors = [StoreError("notes: optimize failed: Retryable commit conflict for version 7")]
    t.compact_small_fragments = lambda **kw: real(**kw) if not errors else (_ for _ in ()).throw(errors.pop())
    t._compactor.request()
    assert t.wait_for_compaction()
    assert (t._compactor.runs, t._compactor.conflicts, t._compactor.failures) == (1, 1, 0)
    errors[:] = [StoreError("notes: optimize failed: disk full")]
    t._compactor.request()
    assert t.wait_for_compaction()
    assert (t._compactor.runs, t._compactor.failures) == (1, 1)


def test_a_compaction_preempted_by_writes_on_every_attempt_is_not_a_failure(tmp_path):
    """Under load a writer's updates can win all three attempts of a rewrite: that is the
    writer being busy, not a broken table; the next request compacts."""
    from memory_pipelines.errors import StoreError

    store = NoteStore(str(tmp_path / "lance"), DIM, compact_every=0)
    t = store.notes
    t.put([Note(id="a", note="first")], unit(0)[None, :])
    real = t.compact_small_fragments
    errors = [
        StoreError(f"notes: optimize failed: Retryable commit conflict for version {v}")
        for v in (7, 8, 9)
    ]
    t.compact_small_fragments = lambda **kw: real(**kw) if not errors else (_ for _ in ()).throw(errors.pop())
    t._compactor.request()
    assert t.wait_for_compaction()
    assert (t._compactor.runs, t._compactor.preempted, t._compactor.failures) == (0, 1, 0)
    t._compactor.request()
    assert t.wait_for_compaction()
    assert (t._compactor.runs, t._compactor.failures) == (1, 0)


def test_background_compaction_bounds_fragments_and_keeps_every_row(tmp_path):
    store = NoteStore(str(tmp_path / "lance"), DIM, compact_every=4)
    t = store.notes
    for i in range(30):
        t.put([Note(id=f"n{i}", note=f"note {i}", agent_id="a")], unit(i)[None, :])
        assert t.get(f"n{i}") is not None  # a fresh write is never hidden
    assert t.wait_for_compaction()
    assert t._compactor.runs >= 1 and t._compactor.failures == 0
    assert t.stats()["fragments"] <= 4
    assert t.count() == 30
    assert sorted(t.scan(columns=["id"])["id"]) == sorted(f"n{i}" for i in range(30))
    top = t.vector_search(unit(7), where=eq("agent_id", "a"), k=1)
    assert top[0].item.id in {f"n{i}" for i in range(7, 30, DIM)}


def test_compaction_creates_the_id_index_from_the_threshold(tmp_path):
    store = NoteStore(str(tmp_path / "lance"), DIM, compact_every=0, tuning=TableTuning(id_index_min_rows=5))
    t = store.notes
    for i in range(6):
        t.put([Note(id=f"n{i}", note=f"note {i}")], unit(i)[None, :])
    report = t.compact_small_fragments()
    assert report["fragments_before"] == 6 and report["fragments_after"] == 1
    assert any(i.columns == ["id"] for i in t.lance.list_indices())
    t.put([Note(id="n2", note="updated through the index")], unit(2)[None, :])
    t.put([Note(id="n9", note="new after the index")], unit(1)[None, :])
    assert t.count() == 7 and t.get("n2").note == "updated through the index"


def test_compaction_creates_the_scalar_indexes_from_the_threshold(tmp_path):
    store = NoteStore(str(tmp_path / "lance"), DIM, compact_every=0, tuning=TableTuning(id_index_min_rows=5))
    t = store.notes
    assert t.scalar_columns == INDEXED_NOTE_COLUMNS
    for i in range(4):
        t.put([Note(id=f"n{i}", note=f"note {i}", agent_id="a", user_id="u")], unit(i)[None, :])
    t.compact_small_fragments()  # below the threshold: no index yet
    assert not [i for i in t.lance.list_indices() if i.columns != ["id"]]
    t.put([Note(id="n4", note="note 4", agent_id="b", user_id="u")], unit(4)[None, :])
    t.compact_small_fragments()
    assert {c for i in t.lance.list_indices() for c in i.columns} >= {"id", *t.scalar_columns}
    t.put([Note(id="n5", note="after the index", agent_id="a", user_id="u")], unit(5)[None, :])
    archived = t.get("n0").model_copy(update={"status": NoteStatus.ARCHIVED.value})
    t.put([archived], unit(0)[None, :])
    where = and_(eq("agent_id", "a"), eq("user_id", "u"), injectable())
    assert sorted(t.scan(where, columns=["id"])["id"]) == ["n1", "n2", "n3", "n5"]


def test_erasure_waits_for_a_running_compaction(tmp_path):
    store = NoteStore(str(tmp_path / "lance"), DIM, compact_every=2)
    t = store.notes
    for i in range(6):
        t.put([Note(id=f"n{i}", note=f"note {i}")], unit(i)[None, :])
    t.delete(eq("id", "n3"))
    t.erase_old_versions()
    assert t.wait_for_compaction()
    assert t.count() == 5 and t.get("n3") is None
    assert len(t.list_versions()) >= 1


_WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from memory_pipelines.notes import Note
    from memory_pipelines.store import NoteStore, eq, injectable, and_

    uri, n, dim = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    store = NoteStore(uri, dim, compact_every=3)
    t = store.notes
    for i in range(n):
        v = np.zeros((1, dim), dtype=np.float32); v[0, i % dim] = 1.0
        t.put([Note(id=f"n{i}", note=f"note {i}", agent_id="a")], v)
        assert t.get(f"n{i}") is not None
        if i % 3 == 2:  # archive the previous note: no longer injectable
            prev = t.get(f"n{i - 1}")
            t.put([prev.model_copy(update={"status": "Archived"})], t.vectors([prev.id])[prev.id][None, :])
            assert t.count(and_(eq("id", prev.id), injectable())) == 0
        print(i, flush=True)
        sys.stdin.readline()  # the reader in the other process checks, then lets us go on
    t.wait_for_compaction()
    print("runs", t._compactor.runs, "failures", t._compactor.failures, flush=True)
    t.compact_small_fragments()  # the appends after the last requested compaction
    """
)


def test_another_process_sees_every_write_and_no_archived_note_while_compacting(tmp_path):
    uri = str(tmp_path / "lance")
    NoteStore(uri, DIM)
    reader = NoteStore(uri, DIM, compact_every=0)  # read_consistency_interval=0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    n = 24
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, uri, str(n), str(DIM)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    archived: set[str] = set()
    try:
        for i in range(n):
            line = proc.stdout.readline()
            assert line.strip() == str(i), proc.stderr.read()[-2000:]
            assert reader.notes.get(f"n{i}") is not None  # the fresh write is visible
            if i % 3 == 2:
                archived.add(f"n{i - 1}")
            live = set(reader.notes.scan(injectable(), columns=["id"])["id"])
            assert live == {f"n{j}" for j in range(i + 1)} - archived
            hits = reader.notes.vector_search(
                unit(0), where=and_(eq("agent_id", "a"), injectable()), k=50
            )
            assert not {h.item.id for h in hits} & archived
            proc.stdin.write("\n")
            proc.stdin.flush()
        tail = proc.stdout.readline().split()
        proc.stdin.close()
        assert proc.wait(timeout=120) == 0, proc.stderr.read()[-2000:]
        errors = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert tail[:2] == ["runs", tail[1]] and int(tail[1]) >= 1 and tail[3] == "0", errors[-2000:]
    assert reader.notes.count() == n
    appended = n + len(archived)  # an archive rewrites its row: one more append
    assert reader.notes.stats()["fragments"] <= math.floor(math.log2(appended)) + 1
    assert reader.notes.count(eq("status", NoteStatus.ARCHIVED.value)) == len(archived)


_APPENDER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from memory_pipelines.notes import Note
    from memory_pipelines.store import NoteStore

    uri, tag, n, dim = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store = NoteStore(uri, dim, compact_every=2)
    rng = np.random.default_rng(int(tag[1:]))
    for i in range(n):
        store.notes.put([Note(id=f"{tag}-{i}", note=f"{tag} {i}")], rng.normal(size=(1, dim)).astype(np.float32))
        if i % 5 == 4:  # an update of one of ours, through the id index
            old = store.notes.get(f"{tag}-{i - 4}")
            store.notes.put([old.model_copy(update={"note": old.note + " (edited)"})], rng.normal(size=(1, dim)).astype(np.float32))
    store.notes.wait_for_compaction()
    print("ok", store.notes._compactor.runs)
    """
)


def test_two_processes_appending_and_compacting_lose_and_duplicate_nothing(tmp_path):
    uri = str(tmp_path / "lance")
    NoteStore(uri, DIM)
    run_scripts_at_once(_APPENDER, [[uri, tag, "30", str(DIM)] for tag in ("p1", "p2")])
    store = NoteStore(uri, DIM)
    ids = list(store.notes.scan(columns=["id"])["id"])
    assert len(ids) == len(set(ids)) == 60
    edited = store.notes.scan(columns=["id", "note"])
    assert sum(edited["note"].str.endswith("(edited)")) == 12


def test_svc_compact_reports_what_it_did(svc):
    for i in range(5):
        svc.add_note(f"note number {i} about charts", agent_id="a", user_id="u1")
    before = svc.notes().sort_values("id").reset_index(drop=True)
    report = svc.compact(run_id="run-compact")
    assert report["notesFragmentsBefore"] >= 5 and report["notesFragmentsAfter"] == 1
    assert report["notesVersionAfter"] > report["notesVersionBefore"]
    assert {"notesSeconds", "examplesSeconds", "notesRows", "examplesVersionsKept"} <= set(report)
    assert report["notesRows"] == 5
    after = svc.notes().sort_values("id").reset_index(drop=True)
    assert before.equals(after)
    assert len(svc.sources.steps("run-compact", "Compact Note Tables")) == 1


@pytest.mark.parametrize(
    "argv", [["--n", "40", "--runs", "2", "--queries", "3", "--legacy-n", "20"]]
)
def test_bench_trickle_runs_both_paths(argv, capsys):
    assert trickle.main(argv) == 0
    out = capsys.readouterr().out
    assert "legacy merge_insert" in out and "append + id index" in out


def test_bench_trickle_repeats_report_medians_and_the_spread(capsys):
    argv = ["--n", "30", "--runs", "1", "--queries", "2", "--no-legacy", "--repeats", "3"]
    assert trickle.main(argv) == 0
    captured = capsys.readouterr()
    assert captured.err.count("append path, 30 adds, run") == 3
    (row,) = [line for line in captured.out.splitlines() if line.startswith("append + id index")]
    assert "; runs " in row


def test_repeated_trickle_figures_are_medians_of_the_runs():
    def run(first: float, last: float, p95: float) -> dict:
        return {
            "mode": "m", "n": 10, "first100_median": first, "last100_median": last,
            "first100_mean": first, "last100_mean": last, "writes_per_s": first,
            "fragments": 3, "inject_before": (1.0, p95), "inject_after": (1.0, 2.0),
        }

    out = trickle.combine([run(10, 30, 2.0), run(10, 12, 4.0), run(20, 30, 3.0)])
    assert out["first100_median"] == 10 and out["last100_median"] == 30
    assert out["add_ratio"] == 1.5  # the median of 3.0, 1.2 and 1.5: not 30 / 10
    assert out["add_ratio_range"] == (1.2, 3.0)
    assert out["inject_ratio"] == 1.5 and out["inject_before"] == (1.0, 3.0)


def test_bench_trickle_refuses_fewer_than_one_repeat(capsys):
    with pytest.raises(SystemExit):
        trickle.main(["--repeats", "0"])
    assert "--repeats must be at least 1" in capsys.readouterr().err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_background_threads_take_a_lower_cpu_priority_than_requests():
    import threading

    from memory_pipelines.store.compaction import BACKGROUND_NICENESS, background_priority

    seen = {}

    def body():
        tid = threading.get_native_id()
        before = os.getpriority(os.PRIO_PROCESS, tid)
        seen["lowered"] = background_priority()
        seen["delta"] = os.getpriority(os.PRIO_PROCESS, tid) - before

    here = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    worker = threading.Thread(target=body)
    worker.start()
    worker.join()
    assert seen["lowered"] and seen["delta"] == min(BACKGROUND_NICENESS, 19 - here)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == here  # only that thread
