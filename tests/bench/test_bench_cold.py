"""``bench cold``: a scope's first read and a fresh home's first inject, beside warm."""

from __future__ import annotations

from memory_pipelines.apps import cli
from memory_pipelines.bench import cold


def test_bench_cold_prints_first_reads_beside_warm(capsys):
    assert "cold" in cli.BENCHMARKS
    argv = ["bench", "cold", "--sizes", "5000", "--users", "2", "--restarts", "1"]
    assert cli.main([*argv, "--homes", "1", "--notes", "20"]) == 0
    out = capsys.readouterr()
    assert "user's first read (2 users)" in out.out
    assert "first read after a restart (1)" in out.out
    assert "the same after warm_scopes(2)" in out.out
    assert "fresh 20-note home (1 homes)" in out.out and "scopes read from the table" in out.out
    assert "load average" in out.out
    # the scope read of the bulk-loaded store reads its scope-column indexes
    assert "user_id_idx" in out.err


def test_fresh_home_rows_have_figures():
    rows = cold.fresh_home_first_injects(1, 10, lambda _msg: None)
    assert [r[1] for r in rows] == ["first inject", "first inject, scopes read from the table"]
    assert all(float(r[2].split(" / ")[0]) > 0 for r in rows)
