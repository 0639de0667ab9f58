"""Export and import of notes, examples and their history (CONTRACT §2.7, issue 15 items
5 and 6): identical round trips (JSONL and Parquet), idempotence, re-embedding, tenant
selection, all-or-nothing validation of bad files, exports refused inside the home, the
migrations local -> S3 (moto) and SQLite -> PostgreSQL, and the CLI."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import create_engine

from memory_pipelines import MemoryService
from memory_pipelines.apps import cli
from memory_pipelines.embeddings import HashEmbedder
from memory_pipelines.errors import NotFoundError, ValidationError
from memory_pipelines.sources import metadata

CTXS = [
    {"agent_id": "a1", "user_id": "u1", "company_id": "c1"},
    {"agent_id": "a1", "user_id": "u2", "company_id": "c2"},
    {"agent_id": "a1"},
]
INPUTS = [None, "what tea does the user like?", "when do deploys happen"]


def _open(home: Path, clock, embedder=None, **kwargs) -> MemoryService:
    return MemoryService.open(home, embedder=embedder or HashEmbedder(dim=64), clock=clock, **kwargs)


def _seed(svc: MemoryService, clock) -> None:
    """Notes of two tenants in every status, with history, scopes and odd fields, and
    examples; the agent configured to inject notes and examples."""
    svc.configure_agent("a1", max_notes_to_inject=8, inject_examples=True)
    tea = svc.add_note("user likes green tea", agent_id="a1", user_id="u1", company_id="c1")
    svc.add_note(
        "deploys happen on Thursdays",
        type="Context",
        agent_id="a1",
        importance_score=0.123456789012345,
        secondary_scopes={"team": "ops", "region": "eu"},
        expires_at=clock() + timedelta(days=30),
    )
    clock.advance(hours=1)
    other = svc.add_note("user u2 wants short answers", agent_id="a1", user_id="u2", company_id="c2")
    svc.add_note("prefers metric units", agent_id="a1", user_id="u1", company_id="c1", status="Provisional")
    svc.add_note("quote ' and % wildcards _ kept", agent_id="a1", user_id="u1", company_id="c1")
    clock.advance(hours=1)
    svc.set_note_status(tea.id, "Archived", comment="user switched to coffee")
    clock.advance(minutes=5)
    svc.set_note_status(tea.id, "Active")
    svc.update_notes([(svc.get_note(other.id), {"note": "user u2 wants very short answers"})])
    svc.set_note_status(
        svc.add_note("wrong fact", agent_id="a1", user_id="u1", company_id="c1").id, "Revoked"
    )
    kept = svc.add_note("keeps the dark theme", agent_id="a1", user_id="u1", company_id="c1")
    svc.notebook.update_notes(  # as TTL pruning archives a note
        [(kept, {"status": "Archived"})], event="archived", actor="memory-manager", phase="pruning", rule="ttl"
    )
    svc.restore_note(kept.id)  # the restore must keep holding in the new home
    svc.add_example("a1", "How do I deploy?", "Run make deploy.", success_score=87.5, user_id="u1", company_id="c1")
    svc.add_example("a1", "Reset my password", "Use the portal.", user_id="u2", company_id="c2")
    clock.advance(minutes=1)


def _table(svc: MemoryService) -> tuple[list, list]:
    notes = sorted(svc.store.notes.all(), key=lambda n: n.id)
    examples = sorted(svc.store.examples.all(), key=lambda e: e.id)
    return notes, examples


def _vectors(svc: MemoryService, notes) -> dict[str, np.ndarray]:
    return svc.store.notes.vectors([n.id for n in notes])


def _history(svc: MemoryService, note_id: str) -> list[dict]:
    return [e.model_dump(exclude={"id"}) for e in svc.history(note_id)]


def _messages(svc: MemoryService) -> list[str]:
    return [svc.inject(ctx, text).message for ctx in CTXS for text in INPUTS]


def _assert_same_home(src: MemoryService, dst: MemoryService, *, vectors: bool = True) -> None:
    notes, examples = _table(src)
    assert _table(dst) == (notes, examples)  # every field, ids, statuses, stamps
    if vectors:
        got, want = _vectors(dst, notes), _vectors(src, notes)
        assert all(np.array_equal(got[i], want[i]) for i in want)
    for n in notes:
        theirs, ours = _history(src, n.id), _history(dst, n.id)
        assert ours == theirs  # the history, event for event


@pytest.fixture
def src(tmp_path, clock):
    with _open(tmp_path / "src", clock) as s:
        _seed(s, clock)
        yield s


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_round_trip_gives_an_identical_home_and_identical_injections(src, tmp_path, clock, suffix):
    out = tmp_path / f"notes{suffix}"
    assert src.export_notes(out) == 7 + 2
    with _open(tmp_path / "dst", clock) as dst:
        dst.configure_agent("a1", max_notes_to_inject=8, inject_examples=True)
        counts = dst.import_notes(out)
        assert counts == {
            "imported": 9, "skipped": 0, "notes": 7, "examples": 2,
            "events": sum(len(src.history(n.id)) for n in src.store.notes.all()),
            "reembedded": 0,
        }  # fmt: skip
        _assert_same_home(src, dst)
        assert _messages(dst) == _messages(src)
        assert any("green tea" in m for m in _messages(dst))
        ids = [n.id for n in src.store.notes.all()]
        kept = next(n.id for n in src.store.notes.all() if n.note == "keeps the dark theme")
        assert dst.sources.restored_rules(ids) == src.sources.restored_rules(ids) == {kept: {"ttl"}}
        # time travel reads the imported history as it reads the exported one
        for at in (clock() - timedelta(minutes=30), clock() - timedelta(hours=3), clock()):
            assert [dst.inject(c, t, as_of=at).message for c in CTXS for t in INPUTS] == [
                src.inject(c, t, as_of=at).message for c in CTXS for t in INPUTS
            ]
        # a second import adds nothing, not even an event
        events = dst.sources.event_counts()
        assert dst.import_notes(out) == {
            "imported": 0, "skipped": 9, "notes": 0, "examples": 0, "events": 0, "reembedded": 0,
        }  # fmt: skip
        assert dst.sources.event_counts() == events
        assert dst.store.notes.count() == 7 and dst.store.examples.count() == 2


def test_jsonl_header_and_records_are_exact(src, tmp_path, clock):
    out = tmp_path / "notes.jsonl"
    src.export_notes(out)
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    header = lines[0]
    assert header["format"] == "memory-pipelines-export" and header["version"] == 1
    assert header["model_id"] == "hash-64" and header["dim"] == 64 and header["vectors"] is True
    assert header["counts"] == {
        "note": 7, "example": 2, "event": sum(1 for r in lines if r["kind"] == "event"),
    }  # fmt: skip
    assert header["exported_at"] == clock().isoformat()
    deploy = next(r for r in lines if r.get("note") == "deploys happen on Thursdays")
    assert deploy["importance_score"] == 0.123456789012345
    assert deploy["created_at"].endswith("Z") and len(deploy["vector"]) == 64
    vec = src.store.notes.vectors([deploy["id"]])[deploy["id"]]
    assert np.array_equal(np.asarray(deploy["vector"], dtype=np.float32), vec)
    assert not any(k in r for r in lines if r["kind"] == "event" for k in ("id", "vector"))


def test_no_vectors_are_re_embedded(src, tmp_path, clock):
    out = tmp_path / "bare.parquet"
    src.export_notes(out, include_vectors=False)
    assert pq.read_table(out).column("vector").null_count == 1 + 7 + 2 + src.sources.event_counts().total()
    with _open(tmp_path / "dst", clock) as dst:
        counts = dst.import_notes(out)
        assert counts["imported"] == 9 and counts["reembedded"] == 9
        _assert_same_home(src, dst)  # the same embedder gives the same vectors


def test_vectors_of_another_model_are_re_embedded(src, tmp_path, clock):
    out = tmp_path / "notes.jsonl"
    src.export_notes(out)
    words = HashEmbedder(dim=64, char_trigrams=False)
    with _open(tmp_path / "dst", clock, embedder=words) as dst:
        counts = dst.import_notes(out)
        assert counts["reembedded"] == 9
        for n in dst.store.notes.all():
            assert n.embedding_model_id == "hash-64-words"
            assert np.allclose(dst.store.notes.vectors([n.id])[n.id], words.embed([n.note])[0])
        ex = dst.store.examples.all()[0]
        assert ex.embedding_model_id == "hash-64-words"
        # everything but the model id is as exported
        strip = {"embedding_model_id"}
        assert [n.model_dump(exclude=strip) for n in _table(dst)[0]] == [
            n.model_dump(exclude=strip) for n in _table(src)[0]
        ]
    with _open(tmp_path / "wide", clock, embedder=HashEmbedder(dim=32)) as wide:
        assert wide.import_notes(out)["reembedded"] == 9
        assert all(v.shape == (32,) for v in wide.store.notes.vectors(
            [n.id for n in wide.store.notes.all()]).values())  # fmt: skip


def test_selection_by_tenant_holds_no_other_tenants_note(src, tmp_path):
    out = tmp_path / "u1.jsonl"
    assert src.export_notes(out, user_id="u1", company_id="c1") == 5 + 1
    text = out.read_text(encoding="utf-8")
    assert '"u2"' not in text and '"c2"' not in text
    assert "short answers" not in text and "Thursdays" not in text and "password" not in text
    records = [json.loads(line) for line in text.splitlines()[1:]]
    assert {r["user_id"] for r in records} == {"u1"}
    assert src.export_notes(tmp_path / "a1.jsonl", agent_id="a1") == 7 + 2
    assert src.export_notes(tmp_path / "none.jsonl", agent_id="nobody") == 0
    assert src.export_notes(tmp_path / "q.jsonl", user_id="u1' OR '1'='1") == 0
    with pytest.raises(ValidationError, match="user_id"):
        src.export_notes(tmp_path / "bad.jsonl", user_id="u\ud800")


def _jsonl(src: MemoryService, tmp_path: Path) -> tuple[Path, list[str]]:
    out = tmp_path / "notes.jsonl"
    src.export_notes(out)
    return out, out.read_text(encoding="utf-8").splitlines(keepends=True)


def _broken(tmp_path: Path, lines: list[str], name: str = "broken.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(lines), encoding="utf-8")
    return path


def _edit(line: str, **changes) -> str:
    record = json.loads(line)
    record.update(changes)
    return json.dumps(record) + "\n"


def test_bad_jsonl_files_name_the_line_and_import_nothing(src, tmp_path, clock):
    out, lines = _jsonl(src, tmp_path)
    cases = {
        "truncated": (lines[:3] + [lines[3][: len(lines[3]) // 2]], r"line 4: not valid JSON.*truncated"),
        "bad json": (lines[:2] + ["{oops\n"] + lines[2:], "line 3: not valid JSON"),
        "unknown kind": (lines[:5] + [_edit(lines[5], kind="photo")] + lines[6:], "line 6: unknown kind 'photo'"),
        "lost lines": (lines[:-2], "announces .*truncated"),
        "bad status": (lines[:2] + [_edit(lines[2], status="Deleted")] + lines[3:], "line 3: invalid note: status"),
        "short vector": (lines[:2] + [_edit(lines[2], vector=[0.5])] + lines[3:], "line 3: vector must be a list of 64"),
        "text vector": (lines[:2] + [_edit(lines[2], vector=["1"] * 64)] + lines[3:], "line 3: vector must hold numbers only"),
        "nan vector": (lines[:2] + [_edit(lines[2], vector=[float("nan")] * 64)] + lines[3:], "line 3: vector holds a non-finite"),
        "duplicate": (lines[:3] + [lines[2]] + lines[3:], "line 4: duplicate note id"),
        "no header": (lines[1:], "line 1: not a memory-pipelines-export header"),
        "version": ([_edit(lines[0], version=2)] + lines[1:], "line 1: unsupported export version 2"),
        "surrogate": (lines[:2] + [_edit(lines[2], note="x\ud800")] + lines[3:], "line 3: note.note contains text"),
        "long id": (lines[:2] + [_edit(lines[2], id="x" * 5000)] + lines[3:], "line 3: .*id"),
        "naive at": (lines[:-1] + [_edit(lines[-1], at="2026-01-01T00:00:00")] + [], "timezone"),
        "empty": ([], "line 1: the file is empty"),
    }
    with _open(tmp_path / "dst", clock) as dst:
        for name, (broken, message) in cases.items():
            path = _broken(tmp_path, broken)
            with pytest.raises(ValidationError, match=message):
                dst.import_notes(path)
            assert dst.store.notes.count() == 0 and dst.store.examples.count() == 0, name
            assert not dst.sources.event_counts(), name
        # an event of a note the file does not hold
        event = next(i for i, line in enumerate(lines) if '"kind":"event"' in line)
        stray = lines[:event] + [_edit(lines[event], note_id="not-in-file")] + lines[event + 1 :]
        with pytest.raises(ValidationError, match=f"line {event + 1}: event of note 'not-in-file'"):
            dst.import_notes(_broken(tmp_path, stray))
        with pytest.raises(NotFoundError):
            dst.import_notes(tmp_path / "missing.jsonl")
        with pytest.raises(ValidationError, match="cannot use"):
            dst.import_notes(tmp_path / ("x" * 300 + ".jsonl"))
        with pytest.raises(ValidationError, match=r"\.jsonl or \.parquet"):
            dst.import_notes(tmp_path / "notes.csv")
        assert dst.store.notes.count() == 0
        assert dst.import_notes(out)["imported"] == 9  # the good file still imports


def test_bad_parquet_files_name_the_row_and_import_nothing(src, tmp_path, clock):
    out = tmp_path / "notes.parquet"
    src.export_notes(out)
    table = pq.read_table(out)
    rows = table.to_pylist()

    def write(name: str, rows: list[dict]) -> Path:
        path = tmp_path / name
        pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), path)
        return path

    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"PAR1 this is not parquet")
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(out.read_bytes()[: out.stat().st_size // 2])
    bad_payload = [*rows[:3], {**rows[3], "payload": "{nope"}, *rows[4:]]
    unknown = [*rows[:2], {**rows[2], "kind": "photo", "payload": rows[2]["payload"].replace('"kind":"note"', '"kind":"photo"')}, *rows[3:]]
    cases = {
        garbage: "not a readable Parquet file",
        cut: "not a readable Parquet file",
        write("payload.parquet", bad_payload): "row 4: payload is not valid JSON",
        write("unknown.parquet", unknown): "row 3: unknown kind 'photo'",
        write("short.parquet", rows[:-1]): "announces .*truncated",
        write("vector.parquet", [*rows[:2], {**rows[2], "vector": [1.0, 2.0]}, *rows[3:]]): "row 3: vector",
    }
    with _open(tmp_path / "dst", clock) as dst:
        for path, message in cases.items():
            with pytest.raises(ValidationError, match=message):
                dst.import_notes(path)
            assert dst.store.notes.count() == 0 and not dst.sources.event_counts()
        assert dst.import_notes(out)["imported"] == 9


def test_an_id_the_home_already_holds_is_skipped_with_its_events(src, tmp_path, clock):
    out = tmp_path / "notes.jsonl"
    src.export_notes(out, user_id="u1")
    taken = next(n for n in src.store.notes.all() if n.note == "user likes green tea")
    with _open(tmp_path / "dst", clock) as dst:
        mine = dst.add_note("a different note under the same id", id=taken.id, agent_id="zz")
        counts = dst.import_notes(out)
        assert counts["skipped"] == 1 and counts["notes"] == 4
        assert dst.get_note(taken.id) == mine
        assert [e.event for e in dst.history(taken.id)] == ["created"]


def test_an_import_cut_off_half_way_completes_when_run_again(src, tmp_path, clock, monkeypatch):
    out = tmp_path / "notes.jsonl"
    src.export_notes(out)
    with _open(tmp_path / "dst", clock) as dst:
        real = dst.notebook.save_notes

        def crash(*args, **kwargs):
            raise RuntimeError("power cut")

        monkeypatch.setattr(dst.notebook, "save_notes", crash)
        with pytest.raises(RuntimeError):
            dst.import_notes(out)  # the events were journaled, the notes not saved
        monkeypatch.setattr(dst.notebook, "save_notes", real)
        assert dst.import_notes(out)["notes"] == 7
        _assert_same_home(src, dst)


def test_exports_never_land_inside_the_home(src, tmp_path):
    home = src.home
    for inside in (home / "notes.jsonl", home / "lance" / "x.parquet", home / "sub" / ".." / "n.jsonl"):
        with pytest.raises(ValidationError, match="inside"):
            src.export_notes(inside)
    link = tmp_path / "link"
    link.symlink_to(home, target_is_directory=True)
    with pytest.raises(ValidationError, match="inside"):
        src.export_notes(link / "notes.jsonl")
    with pytest.raises(ValidationError, match=r"\.jsonl or \.parquet"):
        src.export_notes(tmp_path / "notes.csv")
    with pytest.raises(ValidationError, match="does not exist"):
        src.export_notes(tmp_path / "no" / "such" / "notes.jsonl")
    with pytest.raises(ValidationError, match="NUL"):
        src.export_notes(str(tmp_path / "a\x00b.jsonl"))
    with pytest.raises(ValidationError, match="cannot"):
        src.export_notes(tmp_path / ("x" * 300 + ".jsonl"))
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if not os.access(locked, os.W_OK):  # root may write anywhere
        with pytest.raises(ValidationError, match="cannot write"):
            src.export_notes(locked / "notes.jsonl")
    assert not list(home.rglob("*.jsonl")) and not list(home.rglob("*.parquet"))
    assert not list(tmp_path.glob(".*.part"))


def test_purge_after_an_import_erases_the_imported_history(src, tmp_path, clock):
    out = tmp_path / "notes.jsonl"
    src.export_notes(out)
    with _open(tmp_path / "dst", clock) as dst:
        dst.import_notes(out)
        u1 = [n.id for n in dst.store.notes.all() if n.user_id == "u1"]
        dst.purge_user("u1")
        assert all(dst.history(i) == [] for i in u1)
        for path in (tmp_path / "dst").rglob("*"):
            if path.is_file():
                assert b"green tea" not in path.read_bytes(), path


# --------------------------------------------------------------------------- migrations


def test_migration_from_a_local_folder_to_s3(src, s3_uri, tmp_path, clock):
    out = tmp_path / "move.parquet"
    src.export_notes(out)
    with _open(tmp_path / "cloud", clock, lance_uri=s3_uri) as dst:
        assert dst.store.uri == s3_uri
        dst.configure_agent("a1", max_notes_to_inject=8, inject_examples=True)
        assert dst.import_notes(out)["imported"] == 9
        _assert_same_home(src, dst)
        assert _messages(dst) == _messages(src)
        assert dst.import_notes(out)["imported"] == 0
    assert not (tmp_path / "cloud" / "lance").exists()


PG_URL = os.environ.get("MEMORY_TEST_POSTGRES_URL", "")


def test_migration_from_sqlite_to_postgresql(src, tmp_path, clock):
    if not PG_URL:
        pytest.skip("MEMORY_TEST_POSTGRES_URL is not set (see scripts/start_postgres.sh)")
    engine = create_engine(PG_URL)
    metadata.drop_all(engine)
    try:
        out = tmp_path / "move.jsonl"
        src.export_notes(out)
        with _open(tmp_path / "pg", clock, sql_url=PG_URL) as dst:
            dst.configure_agent("a1", max_notes_to_inject=8, inject_examples=True)
            assert dst.import_notes(out)["imported"] == 9
            _assert_same_home(src, dst)
            assert _messages(dst) == _messages(src)
            assert dst.import_notes(out)["events"] == 0
    finally:
        metadata.drop_all(engine)
        engine.dispose()


# --------------------------------------------------------------------------- CLI


def test_cli_export_and_import(tmp_path, clock, capsys, monkeypatch):
    monkeypatch.setenv("MEMORY_EMBEDDING_MODEL", "hash")
    monkeypatch.delenv("MEMORY_EMBEDDING_DIM", raising=False)
    home = str(tmp_path / "src")
    with _open(Path(home), clock) as svc:
        _seed(svc, clock)
    out = tmp_path / "cli.jsonl"
    assert cli.main(["export", "--home", home, "--out", str(out), "--user", "u2", "--no-vectors"]) == 0
    assert "exported 2 notes and examples" in capsys.readouterr().out
    assert all('"vector"' not in line for line in out.read_text(encoding="utf-8").splitlines())
    dst = str(tmp_path / "dst")
    assert cli.main(["import", "--home", dst, str(out)]) == 0
    assert "imported=2 skipped=0" in capsys.readouterr().out
    assert cli.main(["import", "--home", dst, str(out)]) == 0
    assert "imported=0 skipped=2" in capsys.readouterr().out
    assert cli.main(["export", "--home", home, "--out", str(Path(home) / "x.jsonl")]) == 1
    assert "inside the memory home" in capsys.readouterr().err
    broken = tmp_path / "broken.jsonl"
    broken.write_text(out.read_text(encoding="utf-8")[:-20], encoding="utf-8")
    assert cli.main(["import", "--home", dst, str(broken)]) == 1
    last = len(out.read_text(encoding="utf-8").splitlines())
    assert f"line {last}: not valid JSON" in capsys.readouterr().err
    not_a_home = tmp_path / "file"
    not_a_home.write_text("x")
    assert cli.main(["import", "--home", str(not_a_home), str(out)]) == 1
    err = capsys.readouterr().err
    assert "not a folder" in err and len(err.strip().splitlines()) == 1
