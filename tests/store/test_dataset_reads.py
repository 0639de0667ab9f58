"""Filtered reads through the Lance dataset (``store/dataset.py``): the same rows as
LanceDB's query path, the latest commit of another connection, and LanceDB's answer
where the dataset cannot give one."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from memory_pipelines.errors import StoreError
from memory_pipelines.notes import Note
from memory_pipelines.store import NoteStore, and_, eq, in_, is_null, ne, not_null, or_
from memory_pipelines.store.filters import cmp, icontains

DIM = 8
TEXTS = ["plain", "a'b", "' OR 1=1 --", "%_", "é😀", "line\nbreak", "`tick`", "\\'"]


def _vec(i: int) -> np.ndarray:
    v = np.zeros((1, DIM), dtype=np.float32)
    v[0, i % DIM] = 1.0
    return v


def _note(i: int, text: str) -> Note:
    return Note(
        id=f"n-{i}",
        agent_id="agent-1" if i % 2 else None,
        user_id=text if i % 3 else None,
        company_id="co",
        note=f"note {text}",
    )


@pytest.fixture
def store(tmp_path) -> NoteStore:
    s = NoteStore(str(tmp_path / "lance"), DIM)
    for i, text in enumerate(TEXTS):  # one commit each: several fragments
        s.notes.add([_note(i, text)], _vec(i))
    return s


FILTERS = [
    None,
    eq("agent_id", "agent-1"),
    and_(or_(eq("agent_id", "agent-1"), is_null("agent_id")), eq("company_id", "co")),
    in_("id", ["n-1", "n-3", "missing"]),
    *[eq("user_id", t) for t in TEXTS],
]


@pytest.mark.parametrize("where", FILTERS, ids=range(len(FILTERS)))
def test_dataset_reads_equal_lancedb_reads(store: NoteStore, where) -> None:
    table = store.notes
    cols = [f.name for f in table.schema]
    through_dataset = table._arrow(where, cols)
    assert table._reads._dataset is not None  # the dataset answered
    table._reads.available = False
    try:
        assert through_dataset.equals(table._arrow(where, cols))
    finally:
        table._reads.available = True


def test_dataset_reads_see_another_connections_commits(tmp_path) -> None:
    uri = str(tmp_path / "lance")
    writer, reader = NoteStore(uri, DIM), NoteStore(uri, DIM)
    writer.notes.add([_note(1, "x")], _vec(1))
    assert reader.notes.existing_ids(["n-1", "n-2"]) == {"n-1"}  # its dataset is now open
    writer.notes.add([_note(2, "y")], _vec(2))
    assert reader.notes.existing_ids(["n-1", "n-2"]) == {"n-1", "n-2"}
    writer.notes.delete(eq("id", "n-1"))
    assert reader.notes.existing_ids(["n-1", "n-2"]) == {"n-2"}
    assert [n.id for n in reader.notes.all()] == ["n-2"]
    rows, mat = reader.notes.scan_with_vectors(eq("id", "n-2"))
    assert [n.id for n in rows] == ["n-2"] and np.array_equal(mat, _vec(2))


def test_reads_fall_back_to_lancedb(store: NoteStore, monkeypatch) -> None:
    table = store.notes
    reads = table._reads
    reads._dataset = None

    def broken(**_options) -> None:
        raise RuntimeError("cannot open")

    monkeypatch.setattr(reads, "_table", type("T", (), {"to_lance": staticmethod(broken)})())
    assert table.existing_ids(["n-0", "n-9"]) == {"n-0"}  # LanceDB answered
    assert reads.available  # a failure is not a verdict on pylance

    def absent(**_options) -> None:
        raise ImportError("No module named 'lance'")

    monkeypatch.setattr(reads, "_table", type("T", (), {"to_lance": staticmethod(absent)})())
    assert len(table.all()) == len(TEXTS)
    assert not reads.available  # LanceDB answers every read from now on
    assert table.existing_ids(["n-1"]) == {"n-1"}


def test_a_memory_table_reads_through_lancedb() -> None:
    s = NoteStore("memory://", DIM)
    s.notes.add([_note(1, "x")], _vec(1))
    assert s.notes.existing_ids(["n-1", "n-2"]) == {"n-1"}


MORE_FILTERS = [
    *FILTERS,
    eq("user_id", "edited"),
    ne("agent_id", "agent-1"),
    not_null("user_id"),
    icontains("note", "É😀"),
    icontains("note", "%_"),
    cmp("created_at", ">", datetime(2000, 1, 1, tzinfo=UTC)),
    cmp("access_count", "<", 1),
    in_("status", ["Active", "Provisional"]),
]


@pytest.fixture
def mixed(tmp_path) -> NoteStore:
    """A large fragment, then small ones; rows updated and deleted in both."""
    s = NoteStore(str(tmp_path / "lance"), DIM)
    s.notes.compact_every = 10**9  # the fragments stay as written
    s.notes.add([_note(i, t) for i, t in enumerate(TEXTS)], np.vstack([_vec(i) for i in range(8)]))
    for i, text in enumerate(TEXTS):
        s.notes.add([_note(10 + i, text)], _vec(i))
    s.notes.upsert([_note(2, "edited"), _note(12, "edited too")], np.vstack([_vec(2), _vec(3)]))
    s.notes.delete(in_("id", ["n-5", "n-15"]))
    return s


@pytest.mark.parametrize("where", MORE_FILTERS, ids=range(len(MORE_FILTERS)))
def test_dataset_reads_equal_lancedb_reads_after_updates_and_deletes(mixed, where) -> None:
    table = mixed.notes
    cols = [f.name for f in table.schema]
    through_dataset = table._arrow(where, cols)
    table._reads.available = False
    try:
        assert through_dataset.equals(table._arrow(where, cols))
    finally:
        table._reads.available = True


# -- appends through the dataset ------------------------------------------------------


def test_an_append_through_the_dataset_is_seen_by_lancedb_and_other_connections(tmp_path):
    """Appends commit through pylance (LanceDB's ``add`` slowed down with the versions
    kept); LanceDB's own reads of this table and another connection see each one."""
    uri = str(tmp_path / "lance")
    writer, reader = NoteStore(uri, DIM), NoteStore(uri, DIM)
    for i in range(3):
        writer.notes.add([_note(i, f"t{i}")], _vec(i))
        version = writer.notes.latest_version()
        assert writer.notes._reads._dataset.version == version  # the append's own
        assert writer.notes.journal.since(version - 1, version) is not None
        assert writer.notes.lance.count_rows() == i + 1  # LanceDB's handle
        assert reader.notes.existing_ids([f"n-{i}"]) == {f"n-{i}"}
    hits = writer.notes.lance.search(_vec(2)[0]).limit(1).to_list()
    assert hits[0]["id"] == "n-2"


def test_a_connection_that_reads_stale_versions_still_sees_its_own_appends(tmp_path):
    store = NoteStore(str(tmp_path / "lance"), DIM, read_consistency_interval=None)
    store.notes.add([_note(1, "x")], _vec(1))
    store.notes.add([_note(2, "y")], _vec(2))
    assert store.notes.lance.count_rows() == 2


def test_an_append_lancedb_must_cast_goes_through_lancedb(store: NoteStore, monkeypatch):
    """A stored schema that differs from the rows' (a home from another release, say):
    the dataset leaves the append to LanceDB, which casts."""
    table = store.notes
    calls = []
    add = table._t.add
    monkeypatch.setattr(table._t, "add", lambda data: calls.append(1) or add(data))
    table.add([_note(20, "z")], _vec(3))
    assert calls == []  # the dataset appended
    monkeypatch.setattr(
        type(table._reads._at_latest()), "schema", property(lambda ds: table.schema.remove(0))
    )
    table.add([_note(21, "w")], _vec(4))
    assert calls == [1]
    assert table.existing_ids(["n-20", "n-21"]) == {"n-20", "n-21"}


def test_a_vector_with_nan_or_infinity_is_refused_and_nothing_is_stored(store: NoteStore):
    table = store.notes
    before = table.latest_version()
    for bad in (np.nan, np.inf):
        vectors = np.vstack([_vec(1), _vec(2)])
        vectors[1, 3] = bad
        with pytest.raises(StoreError, match="row 1 holds NaN or infinity"):
            table.add([_note(30, "a"), _note(31, "b")], vectors)
        with pytest.raises(StoreError, match="row 1"):
            table.upsert([_note(30, "a"), _note(31, "b")], vectors)
    assert table.latest_version() == before
    assert table.existing_ids(["n-30", "n-31"]) == set()
