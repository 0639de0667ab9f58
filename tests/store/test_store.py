"""NoteStore over real LanceDB (a local folder and ``memory://``): field round-trips,
upserts, reads, searches, versions and compaction, filter encoding under hostile
values, dimension checks and concurrent writers in separate processes."""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pytest
from reliability_helpers import run_scripts_at_once

from memory_pipelines.config import TableTuning
from memory_pipelines.errors import StoreError, ValidationError
from memory_pipelines.notes import Example, Note
from memory_pipelines.store import (
    FALSE,
    TRUE,
    NoteStore,
    and_,
    cmp,
    eq,
    fts_query,
    icontains,
    in_,
    injectable,
    is_null,
    ne,
    not_null,
    or_,
)

DIM = 8
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)

HOSTILE = [
    "'",
    "''",
    "a'b",
    "' OR 1=1 --",
    "' OR '1'='1",
    "') OR ('1'='1",
    "x' OR 'a'='a",
    "/* */",
    "a /* comment */ b",
    "\\'",
    "\\' OR 1=1 --",
    "\\' OR 1=1 OR '",
    "\\",
    "a\\b",
    "\\\\'",
    "%",
    "a%",
    "_",
    "a_c",
    "é😀 Ünïcødé",
    "line\nbreak",
    "tab\tand\rreturn",
    "nul\x00byte",
    '"double"',
    "`backtick`",
    "$$dollar$$",
    "; DROP TABLE notes; --",
]


def unit(i: int, dim: int = DIM) -> np.ndarray:
    v = np.zeros(dim, dtype=np.float32)
    v[i % dim] = 1.0
    return v


def mix(weights: dict[int, float], dim: int = DIM) -> np.ndarray:
    v = np.zeros(dim, dtype=np.float32)
    for i, w in weights.items():
        v[i] = w
    return v / np.linalg.norm(v)


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path) -> NoteStore:
    uri = str(tmp_path / "lance") if request.param == "local" else "memory://"
    return NoteStore(uri, DIM)


def full_note(**over) -> Note:
    """A note with every field set to a non-default value."""
    data = dict(
        id="note-1",
        agent_id="agent-1",
        user_id="user-1",
        company_id="company-1",
        note="The user prefers concise answers.",
        type="Constraint",
        status="Provisional",
        author_type="Agent",
        protection_tier="Protected",
        importance_score=0.875,
        access_count=7,
        last_accessed_at=T0 - timedelta(days=1),
        expires_at=T0 + timedelta(days=7),
        created_at=datetime(2026, 5, 1, 14, 30, 15, 123456, tzinfo=timezone(timedelta(hours=2))),
        updated_at=T0,
        consolidated_into_note_id="note-9",
        derived_from_note_ids=["note-2", "note-3"],
        consolidation_count=2,
        source_run_id="run-1",
        source_conversation_id="conv-1",
        source_conversation_detail_id="msg-1",
        primary_scope_entity_id="Accounts",
        primary_scope_record_id="acct-42",
        secondary_scopes={"region": "emea", "tier": 2, "tags": ["a", "b"]},
        comments="[created] by test",
        is_auto_generated=True,
        note_type_name="Human",
        embedding_model_id="hash-8",
        project_id="project-1",
    )
    data.update(over)
    return Note(**data)


def full_example(**over) -> Example:
    data = dict(
        id="ex-1",
        agent_id="agent-1",
        user_id="user-1",
        company_id="company-1",
        type="Example",
        example_input="How do I reset my password?",
        example_output="Open Settings, then Security, then Reset.",
        is_auto_generated=True,
        source_conversation_id="conv-1",
        source_conversation_detail_id="msg-1",
        source_run_id="run-1",
        success_score=87.5,
        comments="curated",
        status="Archived",
        primary_scope_entity_id="Accounts",
        primary_scope_record_id="acct-42",
        secondary_scopes={"region": "emea"},
        last_accessed_at=T0,
        access_count=3,
        expires_at=T0 + timedelta(days=180),
        created_at=T0 - timedelta(days=3),
        updated_at=T0,
        embedding_model_id="hash-8",
    )
    data.update(over)
    return Example(**data)


# --------------------------------------------------------------------------- round trips


def test_every_note_field_round_trips(store):
    note = full_note()
    assert set(note.model_fields_set) == set(Note.model_fields), "fixture must set every field"
    store.notes.upsert([note], unit(0)[None, :])
    back = store.notes.get("note-1")
    assert back == note
    assert back.created_at == datetime(2026, 5, 1, 12, 30, 15, 123456, tzinfo=UTC)
    assert back.created_at.tzinfo is not None and back.created_at.utcoffset() == timedelta(0)
    assert back.secondary_scopes == {"region": "emea", "tier": 2, "tags": ["a", "b"]}
    assert back.derived_from_note_ids == ["note-2", "note-3"]
    assert back.type == "Constraint" and back.status == "Provisional"
    assert np.allclose(store.notes.vectors(["note-1"])["note-1"], unit(0))


def test_note_none_values_and_defaults_round_trip(store):
    note = Note(id="bare", note="minimal")
    store.notes.upsert([note], unit(1)[None, :])
    back = store.notes.get("bare")
    assert back == note
    assert back.agent_id is None and back.importance_score is None
    assert back.derived_from_note_ids is None and back.secondary_scopes is None
    assert back.created_at is None and back.expires_at is None


def test_empty_list_and_empty_scopes_round_trip(store):
    note = Note(id="empty", note="x", derived_from_note_ids=[], secondary_scopes={})
    store.notes.upsert([note], unit(1)[None, :])
    back = store.notes.get("empty")
    assert back.derived_from_note_ids == []
    assert back.secondary_scopes is None  # an empty scope map means "no secondary scopes"


def test_every_example_field_round_trips(store):
    ex = full_example()
    assert set(ex.model_fields_set) == set(Example.model_fields), "fixture must set every field"
    store.examples.upsert([ex], unit(2)[None, :])
    assert store.examples.get("ex-1") == ex
    assert store.examples.get_many(["ex-1", "missing"]) == [ex]


def test_scan_returns_dataframe_with_aware_timestamps(store):
    store.notes.upsert([full_note()], unit(0)[None, :])
    df = store.notes.scan(eq("id", "note-1"))
    assert list(df["id"]) == ["note-1"]
    assert "vector" not in df.columns
    assert str(df["updated_at"].dt.tz) == "UTC"
    assert df["updated_at"].iloc[0] == T0
    only = store.notes.scan(columns=["id", "status"])
    assert list(only.columns) == ["id", "status"]


# --------------------------------------------------------------------------- writes and reads


def test_upsert_by_id_replaces_and_add_appends(store):
    store.notes.upsert(
        [Note(id="a", note="first"), Note(id="b", note="b")], np.stack([unit(0), unit(1)])
    )
    store.notes.upsert([Note(id="a", note="second", status="Archived")], unit(2)[None, :])
    assert store.notes.count() == 2
    a = store.notes.get("a")
    assert a.note == "second" and a.status == "Archived"
    assert np.allclose(store.notes.vectors(["a"])["a"], unit(2))
    store.notes.add([Note(id="c", note="c")], unit(3)[None, :])
    assert store.notes.count() == 3


def test_upsert_rejects_bad_shapes_and_duplicate_ids(store):
    with pytest.raises(StoreError, match="shape"):
        store.notes.upsert([Note(id="a", note="x")], np.ones((1, DIM + 1)))
    with pytest.raises(StoreError, match="duplicate"):
        store.notes.upsert([Note(id="a", note="x"), Note(id="a", note="y")], np.ones((2, DIM)))
    store.notes.upsert([], np.zeros((0, DIM)))
    assert store.notes.count() == 0


def test_get_many_keeps_requested_order_and_skips_unknown(store):
    notes = [Note(id=f"n{i}", note=f"note {i}") for i in range(5)]
    store.notes.upsert(notes, np.stack([unit(i) for i in range(5)]))
    got = store.notes.get_many(["n3", "missing", "n0", "n4", "n3"])
    assert [n.id for n in got] == ["n3", "n0", "n4", "n3"]
    assert store.notes.get_many([]) == []
    assert store.notes.get("missing") is None
    assert set(store.notes.vectors(["n1", "n2", "zz"])) == {"n1", "n2"}


def test_count_scan_all_and_scan_with_vectors(store):
    notes = [Note(id=f"n{i}", note=f"note {i}", agent_id="a" if i % 2 else "b") for i in range(6)]
    store.notes.upsert(notes, np.stack([unit(i) for i in range(6)]))
    assert store.notes.count() == 6
    assert store.notes.count(eq("agent_id", "a")) == 3
    assert sorted(n.id for n in store.notes.all(eq("agent_id", "b"))) == ["n0", "n2", "n4"]
    items, mat = store.notes.scan_with_vectors(eq("agent_id", "a"))
    assert mat.shape == (3, DIM) and mat.dtype == np.float32
    for item, row in zip(items, mat, strict=True):
        assert np.allclose(row, unit(int(item.id[1:])))
    df, mat2 = store.notes.scan_with_vectors(eq("agent_id", "zzz"), columns=["id"])
    assert len(df) == 0 and mat2.shape == (0, DIM)


def test_delete_removes_only_matching_rows(store):
    store.notes.upsert(
        [Note(id=f"n{i}", note="x") for i in range(4)], np.stack([unit(i) for i in range(4)])
    )
    store.notes.delete(in_("id", ["n1", "n2"]))
    assert sorted(n.id for n in store.notes.all()) == ["n0", "n3"]


# --------------------------------------------------------------------------- filters


def test_filter_helpers_compose(store):
    notes = [
        Note(id="a", note="x", status="Active", user_id="u1", importance_score=0.9, created_at=T0),
        Note(id="b", note="x", status="Provisional", user_id=None, importance_score=0.2,
             created_at=T0 - timedelta(days=10)),
        Note(id="c", note="x", status="Archived", user_id="u2", importance_score=None,
             created_at=T0 - timedelta(days=20)),
    ]  # fmt: skip
    store.notes.upsert(notes, np.stack([unit(i) for i in range(3)]))

    def ids(cond):
        return sorted(n.id for n in store.notes.all(cond))

    assert ids(injectable()) == ["a", "b"]
    assert ids(eq("user_id", None)) == ["b"] == ids(is_null("user_id"))
    assert ids(not_null("user_id")) == ["a", "c"]
    assert ids(ne("user_id", "u1")) == ["b", "c"]  # ne keeps nulls
    assert ids(ne("user_id", None)) == ["a", "c"]
    assert ids(cmp("importance_score", ">=", 0.5)) == ["a"]
    assert ids(cmp("created_at", "<", T0 - timedelta(days=5))) == ["b", "c"]
    assert ids(
        cmp("created_at", ">=", datetime(2026, 6, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))))
    ) == ["a"]
    assert ids(and_(injectable(), eq("user_id", "u1"))) == ["a"]
    assert ids(or_(eq("id", "a"), eq("id", "c"))) == ["a", "c"]
    assert ids(~eq("id", "a")) == ["b", "c"]
    assert ids(in_("id", [])) == [] and in_("id", []) is FALSE
    assert and_() is TRUE and and_(TRUE, None) is TRUE and or_() is FALSE
    assert and_(eq("id", "a"), FALSE) is FALSE and or_(eq("id", "a"), TRUE) is TRUE
    assert ids(eq("status", "Active") & eq("user_id", "u1")) == ["a"]
    assert ids(eq("id", "a") | eq("id", "b")) == ["a", "b"]


def test_filter_helpers_reject_bad_columns_operators_and_values():
    for bad in ["id; DROP", "Id", "a b", "`id`", "id--", ""]:
        with pytest.raises(ValidationError):
            eq(bad, "x")
    with pytest.raises(ValidationError):
        cmp("importance_score", "= 1 OR 1 =", 0)
    with pytest.raises(ValidationError):
        eq("created_at", datetime(2026, 1, 1))  # naive
    with pytest.raises(ValidationError):
        eq("id", ["a"])
    with pytest.raises(ValidationError):
        in_("id", [object()])


def _hostile_rows() -> tuple[list[Note], np.ndarray]:
    notes = [Note(id="plain", note="hostile probe text", user_id="plain-user", company_id="c")]
    notes += [
        Note(id=v, note=f"hostile probe text {i}", user_id=v, company_id="c")
        for i, v in enumerate(HOSTILE)
    ]
    rng = np.random.default_rng(7)
    vecs = rng.normal(size=(len(notes), DIM)).astype(np.float32)
    return notes, vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


@pytest.fixture(scope="module", params=["local", "memory"])
def hostile_store(request, tmp_path_factory) -> tuple[NoteStore, list[Note]]:
    """One store per backend holding a row for every hostile value (read-only tests)."""
    uri = (
        str(tmp_path_factory.mktemp("hostile") / "lance")
        if request.param == "local"
        else "memory://"
    )
    store = NoteStore(uri, DIM)
    notes, vecs = _hostile_rows()
    store.notes.upsert(notes, vecs)
    return store, notes


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values_match_exactly_and_widen_nothing(hostile_store, value):
    store, notes = hostile_store
    total = len(notes)
    q = np.ones(DIM, dtype=np.float32)

    assert [n.id for n in store.notes.get_many([value])] == [value]
    assert store.notes.get(value).user_id == value
    assert store.notes.count(eq("id", value)) == 1
    assert store.notes.count(eq("user_id", value)) == 1
    assert store.notes.count(in_("id", [value, "no-such-id"])) == 1
    assert store.notes.count(in_("user_id", ["no-such-user", value])) == 1
    assert store.notes.count(ne("id", value)) == total - 1
    assert store.notes.count(and_(eq("company_id", "c"), eq("user_id", value))) == 1
    assert [n.id for n in store.notes.all(eq("user_id", value))] == [value]
    assert list(store.notes.scan(eq("id", value), columns=["id"])["id"]) == [value]
    hits = store.notes.vector_search(q, where=eq("user_id", value), k=total)
    assert [h.item.id for h in hits] == [value]
    hits = store.notes.vector_search(q, where=ne("user_id", value), k=total)
    assert value not in {h.item.id for h in hits} and len(hits) == total - 1
    hits = store.notes.text_search("hostile probe", where=eq("user_id", value), k=total)
    assert [h.item.id for h in hits] == [value]
    hits = store.notes.hybrid_search("hostile probe", q, where=eq("id", value), k=total)
    assert [h.item.id for h in hits] == [value]

    # Absent look-alikes (the value with a suffix, or without its quotes) match nothing.
    for probe in (value + "x", "x" + value, value.replace("'", "")):
        if probe in {n.id for n in notes}:
            continue
        assert store.notes.count(eq("id", probe)) == 0
        assert store.notes.count(in_("user_id", [probe])) == 0
        assert store.notes.vector_search(q, where=eq("user_id", probe), k=total) == []
        assert store.notes.text_search("hostile probe", where=eq("id", probe), k=total) == []


def test_hostile_delete_filters_remove_exactly_one_row(store):
    notes, vecs = _hostile_rows()
    store.notes.upsert(notes, vecs)
    remaining = {n.id for n in notes}
    for value in HOSTILE:
        store.notes.delete(eq("id", value))
        remaining.discard(value)
        assert store.notes.count() == len(remaining), value
        assert store.notes.get(value) is None
    assert {n.id for n in store.notes.all()} == {"plain"}


def test_injection_strings_as_absent_values_match_nothing(store):
    notes = [Note(id=f"n{i}", note="x", user_id=f"u{i}") for i in range(3)]
    store.notes.upsert(notes, np.stack([unit(i) for i in range(3)]))
    for attack in [
        "' OR 1=1 --",
        "') OR ('1'='1",
        "\\' OR 1=1 --",
        "x' OR user_id IS NOT NULL --",
        "%",
        "_",
    ]:
        assert store.notes.count(eq("user_id", attack)) == 0
        assert store.notes.count(in_("id", [attack])) == 0
        assert store.notes.count(ne("id", attack)) == 3
        assert store.notes.vector_search(unit(0), where=eq("id", attack), k=10) == []
        store.notes.delete(eq("id", attack))
    assert store.notes.count() == 3


def test_fts_query_keeps_only_word_terms():
    assert fts_query('Tea\' OR 1=1 -- "quoted" (x) AND y*') == "tea or 1 1 quoted x and y"
    assert fts_query("!!! ??? ---") == ""
    assert len(fts_query(" ".join(f"w{i}" for i in range(100))).split()) == 32


# --------------------------------------------------------------------------- search


def test_vector_search_orders_by_cosine_and_applies_options(store):
    notes = [
        Note(id="exact", note="e", agent_id="A"),
        Note(id="close", note="c", agent_id="A"),
        Note(id="far", note="f", agent_id="A"),
        Note(id="opposite", note="o", agent_id="B"),
    ]
    vecs = np.stack([unit(0), mix({0: 0.8, 1: 0.6}), mix({1: 1.0, 0: 0.1}), -unit(0)])
    store.notes.upsert(notes, vecs)
    hits = store.notes.vector_search(unit(0), k=4)
    assert [h.item.id for h in hits] == ["exact", "close", "far", "opposite"]
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert hits[1].score == pytest.approx(0.8, abs=1e-5)
    assert hits[3].score == pytest.approx(-1.0, abs=1e-5)
    assert [h.item.id for h in store.notes.vector_search(unit(0), k=2)] == ["exact", "close"]
    assert [h.item.id for h in store.notes.vector_search(unit(0), k=4, min_similarity=0.5)] == [
        "exact",
        "close",
    ]
    got = store.notes.vector_search(unit(0), k=2, exclude_ids=["exact"])
    assert [h.item.id for h in got] == ["close", "far"]  # still k results after exclusion
    got = store.notes.vector_search(unit(0), k=4, where=eq("agent_id", "B"))
    assert [h.item.id for h in got] == ["opposite"]
    assert store.notes.vector_search(unit(0), k=0) == []


def test_vector_search_prefilters_before_ranking(store):
    """A filtered row far from the query is found even when k nearer rows are excluded."""
    near = [Note(id=f"near{i}", note="n", agent_id="A") for i in range(30)]
    store.notes.upsert(near, np.stack([unit(0)] * 30))
    store.notes.upsert([Note(id="lonely", note="l", agent_id="B")], unit(5)[None, :])
    got = store.notes.vector_search(unit(0), where=eq("agent_id", "B"), k=1)
    assert [h.item.id for h in got] == ["lonely"]


def test_text_search_bm25_filters_and_sees_new_rows(store):
    store.notes.upsert(
        [
            Note(id="tea", note="The user drinks green tea every morning", agent_id="A"),
            Note(id="coffee", note="The user drinks black coffee", agent_id="A"),
            Note(id="teaB", note="Tea tea tea for agent B", agent_id="B"),
        ],
        np.stack([unit(0), unit(1), unit(2)]),
    )
    hits = store.notes.text_search("green tea", k=5)
    assert hits[0].item.id == "tea" and "coffee" not in {h.item.id for h in hits}
    assert all(h.score > 0 for h in hits)
    assert [h.item.id for h in store.notes.text_search("tea", where=eq("agent_id", "A"))] == ["tea"]
    assert store.notes.text_search("?!", k=5) == []
    assert store.notes.text_search("tea", k=0) == []
    store.notes.upsert([Note(id="late", note="oolong tea arrived later")], unit(3)[None, :])
    assert "late" in {h.item.id for h in store.notes.text_search("oolong", k=5)}
    store.notes.upsert([Note(id="tea", note="now about juice", agent_id="A")], unit(0)[None, :])
    assert "tea" not in {h.item.id for h in store.notes.text_search("green", k=5)}


def test_hybrid_search_fuses_vector_and_text(store):
    store.notes.upsert(
        [
            Note(id="both", note="alpha bravo charlie"),
            Note(id="vec_only", note="unrelated words"),
            Note(id="text_only", note="alpha bravo"),
        ],
        np.stack([unit(0), mix({0: 0.99, 1: 0.1}), unit(4)]),
    )
    hits = store.notes.hybrid_search("alpha bravo charlie", unit(0), k=3)
    assert hits[0].item.id == "both"
    assert {h.item.id for h in hits} == {"both", "vec_only", "text_only"}
    assert hits[0].score > hits[1].score
    text_heavy = store.notes.hybrid_search("alpha bravo", unit(0), k=3, vector_weight=0.0)
    assert text_heavy[-1].item.id == "vec_only"


def test_example_table_search_uses_example_input(store):
    store.examples.upsert(
        [full_example(id="e1", example_input="reset password steps"),
         full_example(id="e2", example_input="download invoice pdf")],
        np.stack([unit(0), unit(1)]),
    )  # fmt: skip
    assert [h.item.id for h in store.examples.text_search("invoice")] == ["e2"]
    assert [h.item.id for h in store.examples.vector_search(unit(0), k=1)] == ["e1"]


# --------------------------------------------------------------------------- versions


def test_versions_increment_and_optimize_compacts(tmp_path):
    store = NoteStore(str(tmp_path / "lance"), DIM)
    v0 = store.notes.version
    for i in range(8):
        store.notes.upsert([Note(id=f"n{i}", note=f"note {i}")], unit(i)[None, :])
    assert store.notes.version == v0 + 8
    data_dir = tmp_path / "lance" / "notes.lance" / "data"
    files_before = len(list(data_dir.iterdir()))
    versions_before = len(store.notes.list_versions())
    assert files_before >= 8 and versions_before >= 9
    with pytest.warns(UserWarning):  # LanceDB warns that a zero age drops every old version
        report = store.notes.optimize(cleanup_older_than=timedelta(0))
    assert report["version_after"] > report["version_before"]
    assert len(store.notes.list_versions()) < versions_before
    assert len(list(data_dir.iterdir())) < files_before
    assert store.notes.count() == 8
    assert [n.id for n in store.notes.get_many(["n7", "n0"])] == ["n7", "n0"]
    assert [h.item.id for h in store.notes.vector_search(unit(3), k=1)] == ["n3"]
    both = store.optimize()
    assert set(both) == {"notes", "examples"}


class _ManifestGoneOnce:
    """A LanceDB table whose first ``list_versions`` meets a manifest that a concurrent
    compaction deleted (LanceDB's "Not found" error); everything else is the real table."""

    def __init__(self, table, error: str = "Not found: notes.lance/_versions/3.manifest"):
        self._table = table
        self._error = error
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self._table, name)

    def list_versions(self):
        self.calls += 1
        if self.calls == 1:
            raise OSError(self._error)
        return self._table.list_versions()


def test_listing_versions_survives_a_concurrent_cleanup(tmp_path):
    store = NoteStore(str(tmp_path / "lance"), DIM)
    store.notes.upsert([Note(id="n1", note="one")], unit(1)[None, :])
    real = store.notes.list_versions()
    store.notes._t = flaky = _ManifestGoneOnce(store.notes._t)
    assert store.notes.list_versions() == real and flaky.calls == 2
    store.notes._t = _ManifestGoneOnce(flaky._table, error="permission denied")
    with pytest.raises(StoreError, match="listing versions failed: permission denied"):
        store.notes.list_versions()


def test_memory_uri_versions_and_optimize():
    store = NoteStore("memory://", DIM)
    v0 = store.notes.version
    store.notes.upsert([Note(id="a", note="x")], unit(0)[None, :])
    store.notes.upsert([Note(id="b", note="y")], unit(1)[None, :])
    assert store.notes.version == v0 + 2
    store.notes.optimize(cleanup_older_than=None)
    assert store.notes.count() == 2


def test_scalar_indexes_keep_results(store):
    store.notes.ensure_scalar_indexes()  # empty table: nothing to index yet
    notes = [Note(id=f"n{i}", note="x", agent_id=f"a{i % 3}") for i in range(9)]
    store.notes.upsert(notes, np.stack([unit(i) for i in range(9)]))
    store.notes.ensure_scalar_indexes()
    store.notes.ensure_scalar_indexes()  # idempotent
    assert store.notes.count(eq("agent_id", "a1")) == 3
    assert store.notes.count(and_(eq("agent_id", "a1"), injectable())) == 3


# --------------------------------------------------------------------------- opening


def test_vector_dim_mismatch_on_reopen_is_a_store_error(tmp_path):
    uri = str(tmp_path / "lance")
    NoteStore(uri, DIM).notes.upsert([Note(id="a", note="x")], unit(0)[None, :])
    with pytest.raises(StoreError, match="8-d"):
        NoteStore(uri, DIM * 2)
    assert NoteStore(uri, DIM).notes.count() == 1


def test_reopen_sees_data_and_other_handles_see_commits(tmp_path):
    uri = str(tmp_path / "lance")
    a, b = NoteStore(uri, DIM), NoteStore(uri, DIM)
    a.notes.upsert([Note(id="x", note="from a")], unit(0)[None, :])
    assert b.notes.get("x").note == "from a"
    assert b.notes.count() == 1


def test_stale_writers_inserting_the_same_new_id_do_not_duplicate(tmp_path):
    """Two handles planning an insert of one new id at the same version: one updates."""
    uri = str(tmp_path / "lance")
    NoteStore(uri, DIM)
    a = NoteStore(uri, DIM, read_consistency_interval=None)
    b = NoteStore(uri, DIM, read_consistency_interval=None)
    a.notes.upsert([Note(id="same", note="from a")], unit(0)[None, :])
    b.notes.upsert([Note(id="same", note="from b")], unit(1)[None, :])
    fresh = NoteStore(uri, DIM)
    assert fresh.notes.count() == 1
    assert fresh.notes.get("same").note == "from b"


_WORKER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from memory_pipelines.notes import Note
    from memory_pipelines.store import NoteStore

    uri, tag, n, dim = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store = NoteStore(uri, dim)
    rng = np.random.default_rng(abs(hash(tag)) % 2**32)
    for i in range(n):
        notes = [Note(id=f"{tag}-{i}", note=f"{tag} {i}"), Note(id="shared", note=f"{tag} {i}")]
        vecs = rng.normal(size=(2, dim)).astype(np.float32)
        store.notes.upsert(notes, vecs)
    print("ok", tag)
    """
)


def test_two_processes_upserting_concurrently_lose_nothing(tmp_path):
    uri = str(tmp_path / "lance")
    NoteStore(uri, DIM)  # create the tables first
    run_scripts_at_once(_WORKER, [[uri, tag, "50", str(DIM)] for tag in ("p1", "p2")])
    store = NoteStore(uri, DIM)
    assert store.notes.count() == 101  # 2 x 50 own ids + one shared id upserted by both
    assert store.notes.count(eq("id", "shared")) == 1
    ids = set(store.notes.scan(columns=["id"])["id"])
    assert ids == {f"p{k}-{i}" for k in (1, 2) for i in range(50)} | {"shared"}


def test_icontains_is_literal_and_ignores_case():
    assert icontains("note", "100%_O'Neil\\").sql == "strpos(lower(`note`), '100%_o''neil\\') > 0"


def test_automatic_compaction_keeps_the_newest_versions_beyond_the_minimum_age(tmp_path):
    from memory_pipelines.store import rowtable

    store = NoteStore(str(tmp_path / "lance"), DIM)
    table = store.notes
    table.compact_every = 0  # compactions only when this test runs them
    for i in range(12):
        table.upsert([Note(id=f"n{i}", note=f"note {i}")], unit(i)[None, :])
    assert len(table.list_versions()) >= 12
    assert table.version_bound() == (rowtable.MIN_CLEANUP_AGE, rowtable.AUTO_KEEP_VERSIONS)
    table.auto_keep_versions = 5
    # more than 5, but every version is younger than the minimum age: none may go
    table.tuning = TableTuning(min_cleanup_age=timedelta(hours=1))
    table.compact_small_fragments()
    assert len(table.list_versions()) >= 12
    table.tuning = TableTuning(min_cleanup_age=timedelta(0))
    for i in range(12, 16):
        table.upsert([Note(id=f"n{i}", note=f"note {i}")], unit(i)[None, :])
    table.compact_small_fragments()
    kept = table.list_versions()
    assert len(kept) <= 5 + 2  # the 5 newest, plus the compaction's own commits
    assert table.count() == 16 and [n.id for n in table.get_many(["n15"])] == ["n15"]
    table.auto_keep_versions = 0  # the time rule alone: nothing younger goes
    table.auto_cleanup_older_than = timedelta(hours=1)
    for i in range(16, 24):
        table.upsert([Note(id=f"n{i}", note=f"note {i}")], unit(i)[None, :])
    table.compact_small_fragments()
    assert table.version_bound() is None and len(table.list_versions()) >= 8


def test_row_tests_agree_with_the_table_on_random_filters(store):
    """``Cond.matches`` (what the read cache uses to place a row it wrote) returns exactly
    the rows the table returns, for random compositions of every helper over rows with
    NULLs, hostile strings, timestamps and numbers."""
    rng = np.random.default_rng(11)
    values = ["u1", "u2", "", "' OR 1=1 --", "é😀 Ünïcødé", "a%", "Tea", None]
    statuses = ["Active", "Provisional", "Archived", "Revoked"]
    notes = [
        Note(
            id=f"n{i}",
            note=f"{values[i % 7]} likes TEA {i}",
            status=statuses[i % 4],
            agent_id=[None, "a1", "a2"][i % 3],
            user_id=values[(i * 3) % len(values)],
            company_id=values[(i * 5) % len(values)],
            importance_score=None if i % 6 == 0 else float(i % 5) / 4,
            created_at=T0 - timedelta(hours=i),
            expires_at=None if i % 2 else T0 + timedelta(hours=i - 20),
        )
        for i in range(48)
    ]
    store.notes.upsert(notes, rng.normal(size=(len(notes), DIM)).astype(np.float32))
    rows = store.notes.scan_arrow(with_vectors=False).to_pylist()

    def leaf():
        col = ["user_id", "company_id", "agent_id", "status"][rng.integers(4)]
        value = values[rng.integers(len(values))] if col != "status" else statuses[rng.integers(4)]
        kind = rng.integers(9)
        if kind == 0:
            return eq(col, value)
        if kind == 1:
            return ne(col, value)
        if kind == 2:
            return in_(col, [values[j] for j in rng.integers(len(values) - 1, size=3)])
        if kind == 3:
            return is_null(col) if rng.integers(2) else not_null(col)
        if kind == 4:
            return cmp("importance_score", ["<", "<=", ">", ">="][rng.integers(4)], 0.5)
        if kind == 5:
            return cmp("expires_at", [">", "<="][rng.integers(2)], T0 + timedelta(hours=1))
        if kind == 6:
            return icontains("note", ["tea", "' or", "é😀", "%", ""][rng.integers(5)])
        if kind == 7:
            return injectable()
        return cmp("created_at", ">=", T0 - timedelta(hours=int(rng.integers(48))))

    def tree(depth):
        if depth == 0 or rng.random() < 0.3:
            return leaf()
        op = rng.integers(3)
        if op == 0:
            return and_(tree(depth - 1), tree(depth - 1))
        if op == 1:
            return or_(tree(depth - 1), tree(depth - 1))
        return ~tree(depth - 1)

    for _ in range(150):
        cond = tree(3)
        want = sorted(n.id for n in store.notes.all(cond))
        assert sorted(r["id"] for r in rows if cond.matches(r)) == want, cond.sql


@pytest.mark.parametrize("uri", ["folder", "memory://"])
def test_stats_and_indexes_from_the_manifest_agree_with_lancedb(tmp_path, uri):
    """The compactor's bookkeeping (rows, fragments, indexed columns) reads the manifest
    through the dataset; LanceDB's answers are the same, and answer where the dataset
    cannot (an in-memory table)."""
    store = NoteStore(str(tmp_path / "lance") if uri == "folder" else uri, DIM, compact_every=0)
    t = store.notes
    assert t.stats() == {"rows": 0, "fragments": 0} and t.indexed_columns() == set()
    assert not t.ensure_id_index()  # nothing to index yet
    for i in range(3):
        t.add([Note(id=f"n{i}", note=f"note {i}", agent_id="a")], np.ones((1, DIM), np.float32))
    t.delete(eq("id", "n1"))
    assert t.stats() == {"rows": 2, "fragments": 2}  # the one-row fragment went with its row
    assert t.ensure_id_index()
    t.ensure_scalar_indexes(("agent_id",))
    assert t.indexed_columns() == {("id",), ("agent_id",)}
    assert t.indexed_columns() == {tuple(i.columns) for i in t.lance.list_indices()}
    t.ensure_scalar_indexes(("agent_id",))  # already there: nothing more
    assert len(t.lance.list_indices()) == 2
