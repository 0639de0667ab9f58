"""A scope read from the table holds only the columns the ranking reads and each row's
row id; a note the ranking picks is read whole by that row id, at the version the read
saw (by id once that version is cleaned up), so every injected note is the whole stored
note, the same as the LanceDB path and a full read give."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from memory_pipelines.config import InjectConfig
from memory_pipelines.injection.cache import (
    RANKING_COLUMNS,
    ROW_ID,
    RankedRow,
    read_cache,
    whole,
)
from memory_pipelines.injection.read_filters import RunScope, scope_cells
from memory_pipelines.notes import RunContext
from memory_pipelines.store import eq

A = "agent-a"
WORDS = "tea coffee deploy friday invoice budget python lancedb vector meeting report".split()
CTX = RunContext(agent_id=A, user_id="u1")
QUERIES = ("tea and coffee", "deploy on friday", "budget report meeting", "python vector")


@pytest.fixture
def svc(open_service):
    return _filled(open_service)


def _filled(open_service, **inject):
    s = open_service(inject_config=InjectConfig(min_similarity=-1.0, **inject))
    s.configure_agent(A, max_notes_to_inject=8, note_injection_strategy="Relevant")
    s.store.notes.compact_every = 0  # no background compaction: the test decides
    # read narrowly at any size (by default only tables of 250,000 rows and more are)
    s.store.notes.tuning = replace(s.store.notes.tuning, narrow_read_min_rows=0)
    s.add_notes(
        [
            {
                "note": f"note {i} about {' '.join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(3))}",
                "agent_id": A if i % 5 else None,
                "user_id": "u1" if i % 4 else None,
                "importance_score": i / 120,
                "source_conversation_id": f"c{i % 6}",
                "source_conversation_detail_id": f"D{i % 6}:{i}",
            }
            for i in range(120)
        ]
    )
    return s


def _from_table(svc) -> None:
    """Forget what this process wrote and read: every scope is read from the table."""
    svc.store.notes.journal.clear()
    read_cache(svc.store.notes).clear()


def _dumps(notes) -> list[dict]:
    return [n.model_dump() for n in notes]


def _injected(svc) -> list[list[dict]]:
    return [_dumps(svc.inject(CTX, q).notes) for q in QUERIES]


def _direct(svc) -> list[list[dict]]:
    cache = read_cache(svc.store.notes)
    cache.enabled = False
    try:
        return _injected(svc)
    finally:
        cache.enabled = True


def _cells(svc):
    cache = read_cache(svc.store.notes)
    scope = RunScope.of(CTX, svc.get_agent(A))
    return [cache._entries[c.sql] for c in scope_cells(scope)]


def test_a_scope_read_holds_the_ranking_columns_and_injects_whole_notes(svc):
    _from_table(svc)
    cache = read_cache(svc.store.notes)
    scans = cache.scans
    got = _injected(svc)
    assert cache.scans == scans + 2  # both cells read from the table
    for view in _cells(svc):
        seg = view.segments[0]
        assert not seg.complete
        assert set(seg.rows.column_names) == {*RANKING_COLUMNS, ROW_ID} - {"vector"}
    assert any(got) and got == _direct(svc)
    stored = {n.id: n.model_dump() for n in svc.store.notes.all()}
    for notes in got:
        for n in notes:
            assert n == stored[n["id"]]  # every field, as stored


def test_only_the_notes_injected_are_read_whole(svc, monkeypatch):
    """The ranking compares rows by the columns read (its pools of 50 by cosine and by
    text, fused, diversified); only the notes it returns are read whole, in one read per
    cell, and a held row answers any other field from its whole note."""
    _from_table(svc)
    table = svc.store.notes
    asked: list[int] = []
    real = table.rows_by_row_id

    def counted(ids, row_ids, version):
        asked.append(len(ids))
        assert row_ids is not None and version is not None  # read by row id, at a version
        return real(ids, row_ids, version)

    monkeypatch.setattr(table, "rows_by_row_id", counted)
    svc.configure_agent(A, max_notes_to_inject=3)
    got = svc.inject(CTX, "tea and coffee").notes
    assert len(got) == 3 and len(asked) <= 2 and sum(asked) == 3  # per cell: the picked
    svc.inject(CTX, "tea and coffee")
    assert sum(asked) == 3  # built once per segment, then reused
    seg = _cells(svc)[0].segments[0]
    k = next(k for k in range(seg.size) if k not in seg._models)
    row = seg.ranked([k])[0]
    assert isinstance(row, RankedRow) and row.note == seg.rows.column("note")[k].as_py()
    stored = table.get(seg.ids[k])
    assert row.importance_score == stored.importance_score and sum(asked) == 4
    assert whole([row]) == [stored] and sum(asked) == 4


def test_a_cleaned_up_read_version_is_read_by_id_and_a_deleted_note_is_skipped(open_service):
    svc = _filled(open_service, candidate_pool=5)
    _from_table(svc)
    table = svc.store.notes
    svc.inject(CTX, QUERIES[0])
    seg = _cells(svc)[0].segments[0]
    positions = list(range(seg.size))
    k = next(k for k in positions if k not in seg._models)  # a note not built yet
    gone = seg.ids[k]
    table.erase_old_versions()  # rewrites the files and drops every older version
    table.delete(eq("id", gone))
    with pytest.raises(LookupError):
        seg.full_rows(np.ones(seg.size, dtype=bool))
    seg2 = _cells(svc)[0].segments[0]
    assert seg2 is seg  # still the entry of the old version (nothing read since)
    built = seg.models(positions)
    stored = {n.id: n.model_dump() for n in table.all()}
    assert built[k] is None
    assert [b.model_dump() for j, b in enumerate(built) if j != k] == [
        stored[i] for j, i in enumerate(seg.ids) if j != k
    ]
    after = _injected(svc)  # the delete was not recorded: the scope is read again
    assert gone not in {n["id"] for notes in after for n in notes}
    stored = {n.id: n.model_dump() for n in table.all()}
    assert all(after) and all(n == stored[n["id"]] for notes in after for n in notes)


def test_a_view_merged_from_a_ranking_read_holds_whole_rows_and_ranks_as_a_fresh_read(svc):
    _from_table(svc)
    _injected(svc)
    own = _cells(svc)[0]
    assert not own.segments[0].complete
    mine = [n for n in svc.store.notes.all() if n.user_id == "u1" and n.agent_id == A]
    cache = read_cache(svc.store.notes)
    scans = cache.scans
    for k, n in enumerate(mine[: len(mine) // 2]):  # over a quarter of the base dies
        svc.update_notes([(n, {"note": f"{n.note} rewritten {k} tea budget"})])
    got = _injected(svc)
    assert cache.scans == scans  # brought forward from this process's commits
    merged = _cells(svc)[0]
    assert len(merged.segments) == 1 and merged.segments[0].complete
    _from_table(svc)
    assert _injected(svc) == got


def test_without_the_lance_dataset_lancedb_reads_the_ranking_columns_and_ids_complete_them(svc):
    _from_table(svc)
    expected = _injected(svc)
    _from_table(svc)
    svc.store.notes._reads.available = False  # as without pylance: LanceDB answers
    assert _injected(svc) == expected
    seg = _cells(svc)[0].segments[0]
    assert not seg.complete and seg.read_at is None and ROW_ID in seg.rows.column_names


def test_a_table_below_the_narrow_read_size_is_read_whole_so_warm_injects_read_nothing(
    open_service, monkeypatch
):
    """Below ``tuning.narrow_read_min_rows`` (the default, 250,000) a scope's first read
    takes whole rows: the notes a warm injection returns are then built from the cache,
    never read again by row id."""
    s = _filled(open_service)
    s.store.notes.tuning = replace(s.store.notes.tuning, narrow_read_min_rows=121)
    _from_table(s)
    s.inject(CTX, QUERIES[0])
    assert all(view.segments[0].complete for view in _cells(s))
    monkeypatch.setattr(
        s.store.notes, "rows_by_row_id", lambda *a, **k: pytest.fail("read by row id")
    )
    for q in QUERIES:
        assert s.inject(CTX, q).notes
    monkeypatch.undo()
    s.store.notes.tuning = replace(s.store.notes.tuning, narrow_read_min_rows=120)
    _from_table(s)
    s.inject(CTX, QUERIES[0])
    assert not any(view.segments[0].complete for view in _cells(s))
