"""Which ids a table holds (``RowTable.existing_ids`` through ``store/idlookup.py``): the
id index for the fragments it covers, every other fragment's ids read once; exact against
another connection's appends, merges, deletes and compactions, and within its bound."""

from __future__ import annotations

import random

import numpy as np
import pytest

from memory_pipelines.config import TableTuning
from memory_pipelines.notes import Note
from memory_pipelines.store import NoteStore, eq, in_

DIM = 8


def _vec(i: int, n: int = 1) -> np.ndarray:
    v = np.zeros((n, DIM), dtype=np.float32)
    v[:, i % DIM] = 1.0
    return v


def _note(i: int | str) -> Note:
    return Note(id=f"n-{i}", agent_id="a", user_id="u", note=f"note {i}")


def _lancedb_answer(table, ids) -> set[str]:
    """What LanceDB's own filtered query says (the reference)."""
    table.lance.checkout_latest()
    rows = table.lance.search().where(in_("id", ids).sql).select(["id"]).limit(None).to_arrow()
    return set(rows.column("id").to_pylist())


@pytest.fixture
def pair(tmp_path):
    uri = str(tmp_path / "lance")
    writer, reader = NoteStore(uri, DIM), NoteStore(uri, DIM)
    for s in (writer, reader):
        s.notes.tuning = TableTuning(id_index_min_rows=1)
        s.notes.compact_every = 0  # compactions only where a test makes them
    yield writer.notes, reader.notes
    writer.close()
    reader.close()


def test_ids_in_and_outside_the_index_written_by_another_connection(pair) -> None:
    writer, reader = pair
    for i in range(4):
        writer.add([_note(i)], _vec(i))
    writer.compact_small_fragments()  # merged and covered by the id index
    assert writer.ensure_id_index()
    for i in range(4, 7):  # three one-row fragments outside the index
        writer.add([_note(i)], _vec(i))
    lookup = reader.id_lookup
    asked = ["n-0", "n-3", "n-5", "n-6", "n-9"]
    assert reader.existing_ids(asked) == {"n-0", "n-3", "n-5", "n-6"}
    assert lookup.fragments_read == 3 and lookup.kept_ids == 3  # only those outside the index
    assert reader.existing_ids(asked) == {"n-0", "n-3", "n-5", "n-6"}
    assert lookup.fragments_read == 3  # each fragment's ids are read once
    writer.add([_note(7)], _vec(7))
    assert reader.existing_ids(["n-7", "n-4"]) == {"n-7", "n-4"}
    assert lookup.fragments_read == 4  # one more fragment, one more read
    writer.compact_small_fragments(cleanup=False)  # the tail rewritten into a new fragment
    assert reader.existing_ids(["n-4", "n-7", "n-8"]) == {"n-4", "n-7"}
    assert lookup.fragments_read == 5 and lookup.kept_ids == 4  # the gone ones forgotten


def test_deleted_ids_are_not_held_in_or_outside_the_index(pair) -> None:
    writer, reader = pair
    for i in range(3):
        writer.add([_note(i)], _vec(i))
    writer.compact_small_fragments()
    writer.ensure_id_index()
    writer.add([_note(3), _note(4)], _vec(3, 2))
    assert reader.existing_ids(["n-1", "n-3", "n-4"]) == {"n-1", "n-3", "n-4"}  # n-3/4 kept
    writer.delete(eq("id", "n-3"))  # a deletion file on a fragment whose ids were kept
    writer.delete(eq("id", "n-1"))  # ... and on one the index covers
    assert reader.existing_ids(["n-1", "n-3", "n-4", "n-0"]) == {"n-4", "n-0"}


def test_an_id_another_connection_appended_is_merged_by_put_not_appended_again(pair) -> None:
    """``put`` appends only ids the table does not hold: one the other connection wrote
    since this one's last question (outside the index) is merged, leaving one row."""
    writer, reader = pair
    for i in range(3):
        writer.add([_note(i)], _vec(i))
    assert reader.existing_ids(["n-0"]) == {"n-0"}  # the reader's lookup is warm
    writer.add([_note("x")], _vec(5))
    reader.put([_note("x").model_copy(update={"note": "again"})], _vec(5))
    rows = reader.scan_arrow(eq("id", "n-x"), with_vectors=False)
    assert rows.num_rows == 1 and rows.column("note").to_pylist() == ["again"]


def test_fragments_of_this_connections_own_commits_come_from_its_journal(pair) -> None:
    """What this connection appended or merged since its previous question is known from
    its commit journal, not read back; a commit of the other connection, a delete or a
    compaction in between makes it read the new fragments."""
    writer, reader = pair
    lookup = writer.id_lookup
    writer.add([_note(0)], _vec(0))
    assert writer.existing_ids(["n-0"]) == {"n-0"}
    read = lookup.fragments_read
    for i in range(1, 4):  # one append, then an append and a merge between two questions
        writer.add([_note(i)], _vec(i))
        if i == 2:
            writer.upsert([_note(0).model_copy(update={"note": "edited"}), _note(9)], _vec(1, 2))
        assert writer.existing_ids(["n-0", f"n-{i}", "n-9", "n-8"]) == (
            {"n-0", f"n-{i}"} | ({"n-9"} if i >= 2 else set())
        )
    assert lookup.fragments_read == read  # nothing read back
    reader.add([_note(5)], _vec(5))  # another connection's commit: its fragment is read
    writer.add([_note(6)], _vec(6))
    assert writer.existing_ids(["n-5", "n-6"]) == {"n-5", "n-6"}
    assert lookup.fragments_read == read + 2


def test_fragments_beyond_the_bound_are_scanned_and_the_answer_stays_exact(pair) -> None:
    writer, reader = pair
    reader.id_lookup.max_kept_ids = 2
    for i in range(5):
        writer.add([_note(i)], _vec(i))
    assert reader.existing_ids([f"n-{i}" for i in range(7)]) == {f"n-{i}" for i in range(5)}
    assert reader.id_lookup.kept_ids == 2


@pytest.mark.parametrize("seed", range(3))
def test_the_answer_equals_lancedbs_under_mixed_commits_of_two_connections(pair, seed) -> None:
    rng = random.Random(seed)
    writer, reader = pair
    tables = [writer, reader]
    reader.id_lookup.max_kept_ids = 6  # some fragments kept, some scanned
    made: list[int] = []
    for step in range(40):
        table = rng.choice(tables)
        op = rng.random()
        if op < 0.5 or not made:
            n = rng.randint(1, 3)
            new = list(range(len(made), len(made) + n))
            made += new
            table.add([_note(i) for i in new], _vec(step, n))
        elif op < 0.65:
            ids = rng.sample(made, min(2, len(made)))
            table.upsert([_note(i) for i in ids] + [_note(f"m{step}")], _vec(step, len(ids) + 1))
        elif op < 0.8:
            table.delete(eq("id", f"n-{rng.choice(made)}"))
        elif op < 0.9:
            table.compact_small_fragments(cleanup=False)
        else:
            table.ensure_id_index()
            table.lance.to_lance().optimize.optimize_indices()
        asked = [f"n-{i}" for i in rng.sample(made, min(6, len(made)))] + ["n-absent", f"n-m{step}"]
        for t in tables:
            assert t.existing_ids(asked) == _lancedb_answer(t, asked), (seed, step)


def test_close_forgets_the_kept_ids(pair) -> None:
    writer, reader = pair
    writer.add([_note(1)], _vec(1))
    assert reader.existing_ids(["n-1"]) == {"n-1"}
    assert reader.id_lookup.kept_ids == 1
    reader.close()
    assert reader.id_lookup.kept_ids == 0
    assert reader.existing_ids(["n-1"]) == {"n-1"}
