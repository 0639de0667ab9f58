"""A scope's first read: a home this process created and filled is read from the rows it
wrote (no scan), with the same injected notes as a scan; anything the process did not
record (a delete, another writer's commit) sends the read back to the table; and a scope
read of a large table reads the scalar indexes of the scope columns that compaction keeps,
with the same rows as a scan and a note written after the index found."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pyarrow as pa
import pytest

from memory_pipelines.config import InjectConfig, TableTuning
from memory_pipelines.injection.cache import read_cache
from memory_pipelines.injection.read_filters import RunScope, scope_cells
from memory_pipelines.notes import Note, RunContext
from memory_pipelines.store import NoteStore, eq
from memory_pipelines.store.journal import CommitJournal

A = "agent-a"
WORDS = "tea coffee deploy friday invoice budget python lancedb vector meeting report".split()
QUERIES = ("tea and coffee", "deploy on friday", "budget report meeting")
CONTEXTS = (RunContext(agent_id=A, user_id="u1"), RunContext(agent_id=A, user_id="u2"), RunContext(agent_id=A))


@pytest.fixture
def fresh(open_service):
    svc = open_service(inject_config=InjectConfig(min_similarity=-1.0))
    svc.configure_agent(A, max_notes_to_inject=8, note_injection_strategy="Relevant")
    return svc


def _fill(svc, clock, n: int = 40) -> list[Note]:
    notes = []
    for i in range(n):
        w = [WORDS[(i * 7 + j) % len(WORDS)] for j in range(3)]
        notes.append(
            svc.add_note(
                f"note {i} about {' '.join(w)}",
                agent_id=[A, A, "agent-b", None][i % 4],
                user_id=["u1", "u2", None][i % 3],
                expires_at=clock() + timedelta(days=1) if i % 9 == 0 else None,
            )
        )
    return notes


def _injected(svc) -> list[list[str]]:
    return [[n.id for n in svc.inject(ctx, q).notes] for ctx in CONTEXTS for q in QUERIES]


def _scanned(svc) -> list[list[str]]:
    """The same injections with every scope read from the table (nothing recorded)."""
    notes = svc.store.notes
    notes.journal.clear()
    read_cache(notes).clear()
    scans = read_cache(notes).scans
    out = _injected(svc)
    assert read_cache(notes).scans > scans
    return out


def test_a_home_this_process_filled_is_read_without_a_scan_and_injects_the_same(fresh, clock):
    _fill(fresh, clock)
    fresh.store.notes.wait_for_compaction()
    cache = read_cache(fresh.store.notes)
    got = _injected(fresh)
    # u1's own notes, u2's, and the notes without a user (which the run without one reads)
    assert cache.scans == 0 and cache.unread == 3
    assert any(got)
    assert got == _scanned(fresh)


def test_a_rewritten_or_archived_note_is_read_as_last_written(fresh, clock):
    notes = _fill(fresh, clock, 12)
    fresh.update_note(notes[0].id, note="tea and coffee, rewritten")
    fresh.set_note_status(notes[3].id, "Archived")
    cache = read_cache(fresh.store.notes)
    got = _injected(fresh)
    assert cache.scans == 0 and cache.unread == 3  # both changes are merges it recorded
    flat = {i for ids in got for i in ids}
    assert notes[3].id not in flat
    served = {n.id: n.note for ctx in CONTEXTS for n in fresh.inject(ctx, "tea coffee").notes}
    assert served.get(notes[0].id, "tea and coffee, rewritten") == "tea and coffee, rewritten"
    assert got == _scanned(fresh)


def test_a_delete_sends_the_first_read_back_to_the_table(fresh, clock):
    notes = _fill(fresh, clock, 12)
    fresh.store.notes.delete(eq("id", notes[0].id))
    cache = read_cache(fresh.store.notes)
    got = _injected(fresh)
    assert cache.scans > 0 and cache.unread == 0
    assert notes[0].id not in {i for ids in got for i in ids}


def test_another_writer_of_the_table_sends_the_first_read_back_to_the_table(fresh, clock, home):
    _fill(fresh, clock, 12)
    other = NoteStore(str(home / "lance"), fresh.store.dim, compact_every=0)
    try:
        stranger = Note(id="from-elsewhere", agent_id=A, user_id="u1", note="tea coffee elsewhere")
        other.notes.add([stranger], np.ones((1, fresh.store.dim), dtype=np.float32))
    finally:
        other.close()
    cache = read_cache(fresh.store.notes)
    ids = [n.id for n in fresh.inject(CONTEXTS[0], "tea coffee elsewhere").notes]
    assert cache.scans > 0 and cache.unread == 0
    assert "from-elsewhere" in ids


def test_a_reopened_home_reads_its_scopes_from_the_table(open_service, fresh, clock, home):
    _fill(fresh, clock, 12)
    expected = _injected(fresh)
    fresh.close()
    again = open_service(inject_config=InjectConfig(min_similarity=-1.0))
    cache = read_cache(again.store.notes)
    assert _injected(again) == expected
    assert cache.scans > 0 and cache.unread == 0


def _rows(n: int, start: int = 0) -> pa.Table:
    return pa.table({"id": [f"n{i}" for i in range(start, start + n)], "x": list(range(start, start + n))})


def test_the_journal_knows_a_table_from_empty_until_a_version_it_did_not_record():
    j = CommitJournal()
    assert j.from_empty(1) is None  # not started empty: unknown
    j.started_empty(1)
    assert j.from_empty(1).num_rows == 0
    j.record(2, _rows(3))
    j.record(3, _rows(1, start=1).set_column(1, "x", pa.array([99])))  # n1 written again
    j.record(4, _rows(0))  # a compaction: no row changed
    assert j.from_empty(3) is None  # behind the latest recorded version
    rows = j.from_empty(4)
    assert rows.column("id").to_pylist() == ["n0", "n2", "n1"]  # last write of each id
    assert rows.column("x").to_pylist() == [0, 2, 99]
    j.record(6, _rows(1, start=5))  # version 5 (a delete, another writer) was not recorded
    assert j.from_empty(6) is None and not j.follows_from_empty


def test_the_journal_gives_up_past_its_row_bound():
    j = CommitJournal()
    j.from_empty_max_rows = 4
    j.started_empty(1)
    j.record(2, _rows(3))
    assert j.from_empty(2).num_rows == 3
    j.record(3, _rows(2, start=3))
    assert j.from_empty(3) is None and not j.follows_from_empty


def test_a_scope_read_of_a_large_table_reads_the_scope_indexes(fresh, clock):
    table = fresh.store.notes
    table.tuning = TableTuning(id_index_min_rows=10)
    notes = _fill(fresh, clock, 30)
    scope = RunScope.of(CONTEXTS[0], fresh.get_agent(A))
    own, shared = scope_cells(scope)
    before = {c: sorted(table.scan_arrow(c).column("id").to_pylist()) for c in (own, shared)}
    assert table.indexes_read(own) == []  # no index yet: every row is read
    table.compact(None, tail=True)
    indexed = {c for i in table.lance.list_indices() for c in i.columns}
    assert {"user_id", "agent_id", "status"} <= indexed
    assert "user_id_idx" in table.indexes_read(own)
    assert "user_id_idx" in table.indexes_read(shared)
    after = {c: sorted(table.scan_arrow(c).column("id").to_pylist()) for c in (own, shared)}
    assert after == before
    late = fresh.add_note("tea written after the index", agent_id=A, user_id="u1")
    assert late.id in table.scan_arrow(own).column("id").to_pylist()
    read_cache(table).clear()
    table.journal.clear()
    assert late.id in [n.id for n in fresh.inject(CONTEXTS[0], "tea written after the index").notes]
    assert {n.id for n in notes} <= set(table.scan_arrow().column("id").to_pylist())
