"""An import file that is too deep or too large is refused naming its line (or row), in
bounded memory, with nothing stored; the CLI prints one line, never a traceback."""

from __future__ import annotations

import json
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memory_pipelines.apps.cli import main
from memory_pipelines.errors import ValidationError
from memory_pipelines.history import transfer


@pytest.fixture
def header(svc, tmp_path) -> str:
    """The header line of a real (empty) export."""
    svc.configure_agent("a1")
    out = tmp_path / "empty.jsonl"
    svc.export_notes(out)
    return out.read_text().splitlines()[0]


def _nested(depth: int) -> str:
    return '{"kind": "note", "note": ' + "[" * depth + "]" * depth + "}"


@pytest.mark.parametrize("depth", [40, 100_000])
def test_a_deeply_nested_line_is_refused_naming_it(svc, tmp_path, header, depth):
    path = tmp_path / "deep.jsonl"
    path.write_text(header + "\n" + _nested(depth) + "\n")
    with pytest.raises(ValidationError, match=r"deep\.jsonl, line 2: .*deeper than 32 levels"):
        svc.import_notes(path)
    assert svc.store.notes.count() == 0


def test_a_huge_line_is_refused_within_bounded_memory(svc, tmp_path, header, monkeypatch):
    monkeypatch.setenv("MEMORY_MAX_IMPORT_RECORD_BYTES", str(1 << 20))
    path = tmp_path / "huge.jsonl"
    with path.open("w") as f:  # 24 MB on one line, no newline at all
        f.write(header + "\n" + '{"kind": "note", "note": "')
        for _ in range(24):
            f.write("x" * (1 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(ValidationError, match=r"huge\.jsonl, line 2: longer than 1048576 bytes"):
            svc.import_notes(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # the file is 24 MB: it was never read whole
    assert svc.store.notes.count() == 0


def test_parquet_payloads_are_bounded_and_nesting_checked(svc, tmp_path, header, monkeypatch):
    monkeypatch.setenv("MEMORY_MAX_IMPORT_RECORD_BYTES", str(1 << 16))
    path = tmp_path / "bad.parquet"
    kinds = ["header", "note"]
    for payload, message in (
        (_nested(10_000), r"row 2: .*deeper than 32 levels"),
        ('{"kind": "note", "note": "' + "y" * (1 << 17) + '"}', r"row 2: payload longer than 65536 bytes"),
    ):
        table = pa.table({"kind": kinds, "payload": [header, payload], "vector": pa.array([None, None], pa.list_(pa.float32()))})
        pq.write_table(table, path)
        with pytest.raises(ValidationError, match=message):
            svc.import_notes(path)
    monkeypatch.setenv("MEMORY_MAX_IMPORT_ROW_GROUP_BYTES", str(1 << 10))
    with pytest.raises(ValidationError, match=r"row group 1 \(rows from 1\): .* bytes uncompressed"):
        svc.import_notes(path)
    assert svc.store.notes.count() == 0


def test_an_export_still_round_trips_in_row_groups(svc, tmp_path, monkeypatch):
    monkeypatch.setattr(transfer, "EXPORT_ROW_GROUP_ROWS", 2)
    svc.configure_agent("a1")
    for i in range(5):
        svc.add_note(f"The user likes tea number {i}.", agent_id="a1")
    path = tmp_path / "all.parquet"
    svc.export_notes(path)
    assert pq.ParquetFile(path).metadata.num_row_groups > 2
    parsed = transfer.read_export(path)
    assert len(parsed.notes) == 5


def test_the_cli_names_the_line_without_a_traceback(svc, tmp_path, header, capsys):
    path = tmp_path / "deep.jsonl"
    path.write_text(header + "\n" + _nested(100_000) + "\n")
    home = tmp_path / "other"
    assert main(["import", str(path), "--home", str(home)]) != 0
    err = capsys.readouterr().err
    assert "line 2" in err and "deeper than" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    json.dumps(err)  # printable
