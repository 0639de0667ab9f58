"""The background compaction over real LanceDB rewrites the table's tail, not the table:
large fragments stay as they are, new rows reach the indexes in batches and are found
before they do, and its commit goes through while this process keeps appending."""

from __future__ import annotations

import threading
import time

import numpy as np

from memory_pipelines.config import TableTuning
from memory_pipelines.notes import Note
from memory_pipelines.store import NoteStore, and_, compaction, eq, injectable

DIM = 8


def unit(i: int) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i % DIM] = 1.0
    v[(i + 1) % DIM] = 0.01 * (i + 1)
    return v / np.linalg.norm(v)


def units(n: int, start: int = 0) -> np.ndarray:
    return np.stack([unit(start + i) for i in range(n)])


def fragments(table) -> dict[int, tuple[int, tuple[str, ...]]]:
    """Fragment id -> (rows, data file paths) of the latest version."""
    ds = table.lance.to_lance()
    return {
        f.fragment_id: (f.metadata.num_rows, tuple(d.path for d in f.metadata.data_files()))
        for f in ds.get_fragments()
    }


def test_the_background_compaction_leaves_large_fragments_alone(tmp_path):
    t = NoteStore(str(tmp_path / "lance"), DIM, compact_every=0, tuning=TableTuning(tail_fragment_rows=64)).notes
    t.add([Note(id=f"bulk{i}", note=f"bulk {i}", agent_id="a") for i in range(300)], units(300))
    (big,) = fragments(t).items()
    for i in range(10):
        t.put([Note(id=f"n{i}", note=f"single {i}", agent_id="a")], unit(i)[None, :])
    assert len(fragments(t)) == 11

    report = t.compact_small_fragments()

    after = fragments(t)
    assert after[big[0]] == big[1]  # the same fragment, the same file: not rewritten
    assert len(after) == 2 and sorted(rows for rows, _ in after.values()) == [10, 300]
    assert report["fragments_before"] == 11 and report["fragments_after"] == 2
    assert t.count() == 310
    assert sorted(t.scan(eq("agent_id", "a"), columns=["id"])["id"]) == sorted(
        [f"bulk{i}" for i in range(300)] + [f"n{i}" for i in range(10)]
    )


def test_the_tail_grows_to_its_size_and_then_a_new_one_starts(tmp_path):
    t = NoteStore(str(tmp_path / "lance"), DIM, compact_every=0, tuning=TableTuning(tail_fragment_rows=8)).notes
    for i in range(20):
        t.put([Note(id=f"n{i}", note=f"single {i}")], unit(i)[None, :])
        if i % 4 == 3:
            t.compact_small_fragments()
    sizes = sorted(rows for rows, _ in fragments(t).values())
    assert sum(sizes) == 20 and max(sizes) <= 8 and len(sizes) <= 4
    assert sorted(n.id for n in t.all()) == sorted(f"n{i}" for i in range(20))


def test_new_rows_reach_the_indexes_in_batches_and_are_found_before(tmp_path):
    tuning = TableTuning(id_index_min_rows=5, index_lag_rows=12, index_lag_share=0.0)
    t = NoteStore(str(tmp_path / "lance"), DIM, compact_every=0, tuning=tuning).notes
    for i in range(6):
        t.put([Note(id=f"n{i}", note=f"note {i}", agent_id="a", user_id="u")], unit(i)[None, :])
    t.compact_small_fragments()  # creates the indexes over every row
    outside = lambda: compaction._rows_outside_indexes(t.lance.to_lance())[0]  # noqa: E731
    assert outside() == 0

    for i in range(6, 16):
        t.put([Note(id=f"n{i}", note=f"note {i}", agent_id="a", user_id="u")], unit(i)[None, :])
    t.compact_small_fragments()
    assert outside() == 10  # below the lag: merged, but not yet indexed
    where = and_(eq("agent_id", "a"), eq("user_id", "u"), injectable())
    assert sorted(t.scan(where, columns=["id"])["id"]) == sorted(f"n{i}" for i in range(16))
    assert t.get("n12").note == "note 12"
    t.put([Note(id="n12", note="edited outside the index", agent_id="a")], unit(1)[None, :])
    assert t.count(eq("id", "n12")) == 1 and t.get("n12").note == "edited outside the index"

    for i in range(16, 20):
        t.put([Note(id=f"n{i}", note=f"note {i}", agent_id="a", user_id="u")], unit(i)[None, :])
    t.compact_small_fragments()
    assert outside() == 0  # past the lag: folded in
    assert t.count() == 20 and t.count(eq("id", "n12")) == 1
    assert sorted(t.scan(where, columns=["id"])["id"]) == sorted(
        f"n{i}" for i in range(20) if i != 12
    )


def test_a_compaction_commits_while_this_process_keeps_appending(tmp_path):
    """The rewrite runs beside the appends and only its commit waits for the write lock.
    Without that, appends committed one after another kept rejecting the compaction's
    commit until they stopped."""
    t = NoteStore(str(tmp_path / "lance"), DIM, compact_every=0).notes
    done = threading.Event()
    appended: list[str] = []
    still_appending_when_done = []

    def append() -> None:
        deadline = time.monotonic() + 60
        i = 0
        while time.monotonic() < deadline:
            if done.is_set():
                still_appending_when_done.append(True)
                return
            t.put([Note(id=f"a{i}", note=f"appended {i}")], unit(i)[None, :])
            appended.append(f"a{i}")
            i += 1

    writer = threading.Thread(target=append)
    writer.start()
    try:
        while len(appended) < 40:
            time.sleep(0.01)
        t.compact_small_fragments()
        done.set()
    finally:
        done.set()
        writer.join()
    assert still_appending_when_done == [True]  # the appender never had to stop for it
    assert sorted(t.scan(columns=["id"])["id"]) == sorted(appended)


def test_the_compactor_drops_old_versions_at_most_every_few_seconds():
    calls: list[bool] = []

    class Table:
        name = "stub"
        tuning = TableTuning()

        def compact_small_fragments(self, cleanup: bool = True) -> dict:
            calls.append(cleanup)
            return {}

    compactor = compaction.Compactor(Table())
    compactor._compact()
    compactor._compact()
    assert calls == [True, False]
    compactor.table.tuning = TableTuning(cleanup_every_s=0.0)
    compactor._compact()
    assert calls == [True, False, True]


def test_searches_find_rows_the_indexes_do_not_cover_yet(tmp_path):
    t = NoteStore(str(tmp_path / "lance"), DIM, compact_every=0, tuning=TableTuning(id_index_min_rows=5)).notes
    for i in range(6):
        t.put([Note(id=f"n{i}", note=f"plain note {i}", agent_id="a")], unit(i)[None, :])
    t.ensure_fts()
    t.compact_small_fragments()
    t.put([Note(id="late", note="zephyr arrived after the indexes", agent_id="a")], unit(3)[None, :])
    t.compact_small_fragments()
    assert compaction._rows_outside_indexes(t.lance.to_lance())[0] == 1
    assert [h.item.id for h in t.text_search("zephyr", where=eq("agent_id", "a"))] == ["late"]
    assert "late" in [h.item.id for h in t.vector_search(unit(3), where=eq("agent_id", "a"), k=3)]


def test_a_rewrite_an_update_beat_leaves_no_file_behind(tmp_path, monkeypatch):
    """An update of a tail row commits while the tail is rewritten: Lance rejects the
    rewrite's commit, and its new data files, which no version references, are deleted
    rather than left for a week; the row keeps its update and the next compaction runs."""
    from lance.optimize import Compaction

    t = NoteStore(str(tmp_path / "lance"), DIM, compact_every=0).notes
    for i in range(6):
        t.put([Note(id=f"n{i}", note=f"single {i}", agent_id="a")], unit(i)[None, :])
    data = tmp_path / "lance" / "notes.lance" / "data"
    files_before = set(data.iterdir())
    real_commit = Compaction.commit

    def update_first(ds, rewrites, options):
        t.upsert([Note(id="n2", note="changed", agent_id="a")], unit(2)[None, :])
        update_first.written = {
            data / f.path for r in rewrites for m in r.new_fragments for f in m.data_files()
        }
        return real_commit(t.lance.to_lance(), rewrites, options)

    monkeypatch.setattr(Compaction, "commit", staticmethod(update_first))
    try:
        t.compact_small_fragments(cleanup=False)
    except Exception as e:
        assert "conflict" in str(e).lower()
    else:
        raise AssertionError("the rewrite should have lost to the update")
    assert update_first.written and not any(p.exists() for p in update_first.written)
    kept = set(data.iterdir())
    assert files_before <= kept and len(kept - files_before) == 1  # the update's own file
    assert t.get("n2").note == "changed" and t.count() == 6

    monkeypatch.setattr(Compaction, "commit", staticmethod(real_commit))
    t.compact_small_fragments(cleanup=False)
    assert len(fragments(t)) == 1 and t.get("n2").note == "changed" and t.count() == 6


def test_a_commit_failing_otherwise_leaves_the_rewrite_to_the_cleanup(tmp_path, monkeypatch):
    """Only a commit conflict, which Lance decides before writing a manifest, deletes the
    rewrite's files; any other failure leaves them, in case a version holds them."""
    from lance.optimize import Compaction

    t = NoteStore(str(tmp_path / "lance"), DIM, compact_every=0).notes
    for i in range(4):
        t.put([Note(id=f"n{i}", note=f"single {i}", agent_id="a")], unit(i)[None, :])
    data = tmp_path / "lance" / "notes.lance" / "data"

    def fail(ds, rewrites, options):
        fail.written = {
            data / f.path for r in rewrites for m in r.new_fragments for f in m.data_files()
        }
        raise OSError("I/O error while writing the manifest")

    monkeypatch.setattr(Compaction, "commit", staticmethod(fail))
    try:
        t.compact_small_fragments(cleanup=False)
    except Exception as e:
        assert "I/O error" in str(e)
    else:
        raise AssertionError("the commit should have failed")
    assert fail.written and all(p.exists() for p in fail.written)
    assert t.count() == 4


def test_the_tail_merges_like_a_binary_counter(tmp_path):
    t = NoteStore(str(tmp_path / "lance"), DIM, compact_every=0, tuning=TableTuning(tail_fragment_rows=64)).notes

    def singles(start: int, n: int) -> None:
        for i in range(start, start + n):
            t.put([Note(id=f"n{i}", note=f"single {i}")], unit(i)[None, :])

    singles(0, 8)
    t.compact_small_fragments()
    (first,) = fragments(t).items()
    singles(8, 4)
    t.compact_small_fragments()  # 4 new rows: the 8-row fragment stays as it is
    after = fragments(t)
    assert after[first[0]] == first[1] and sorted(r for r, _ in after.values()) == [4, 8]
    singles(12, 4)
    t.compact_small_fragments()  # 4 + 4 new rows now match it: one fragment of 16
    assert [r for r, _ in fragments(t).values()] == [16]
    assert sorted(n.id for n in t.all()) == sorted(f"n{i}" for i in range(16))

    singles(16, 2)
    t.compact_small_fragments()
    singles(18, 1)
    t.compact_small_fragments()  # 2 > 1 and 16 > 3: nothing to merge
    assert [r for r, _ in fragments(t).values()] == [16, 2, 1]
    singles(19, 1)
    t.compact_small_fragments()  # 1 <= 1 and 2 <= 1 + 1: the three newest merge
    assert [r for r, _ in fragments(t).values()] == [16, 4]

    t.delete(eq("id", "n3"))  # a merge drops the deleted rows of the fragments it takes
    singles(20, 12)
    t.compact_small_fragments()
    ds = t.lance.to_lance()
    assert [f.metadata.num_rows for f in ds.get_fragments()] == [31]
    assert all(f.metadata.deletion_file is None for f in ds.get_fragments())
    assert t.count() == 31 and "n3" not in {n.id for n in t.all()}
